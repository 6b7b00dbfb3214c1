"""RLabel: fine-tune the forget answers towards random labels (uniform random vocabulary tokens at every
answer position, fresh each step, seeded), plus GradDiff's retain term. A documented reading of "random-label
unlearning" for generative QA (see :func:`lacuna_unlearn.methods.losses.random_label_loss`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lacuna_unlearn.methods.base import forward
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import random_label_loss
from lacuna_unlearn.methods.settings import RLabelSettings


@dataclass
class RLabel(RLabelSettings, GradDiff):
    def __post_init__(self) -> None:
        super().__post_init__()
        self._generator: torch.Generator | None = None  # not a dataclass field: stays out of asdict()

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed)
        batch = inputs["forget"]
        forget = random_label_loss(forward(model, batch), batch["labels"], self._generator)
        retain = self.retain_term(model, inputs, ref_model)
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
