"""NPO (docs/definitions.md#unlearning-losses): −(2/β)·E log σ(−β r), r = ℓ_ref − ℓ_θ, plus GradDiff's retain term."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lacuna_unlearn.methods.base import forward
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import npo_loss
from lacuna_unlearn.methods.settings import NPOSettings


@dataclass
class NPO(NPOSettings, GradDiff):
    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return True

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        batch = inputs["forget"]
        with torch.no_grad():
            ref_logits = forward(ref_model, batch)
        forget = npo_loss(forward(model, batch), batch["labels"], ref_logits, beta=self.beta)
        retain = self.retain_term(model, inputs, ref_model)
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
