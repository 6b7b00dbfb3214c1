"""UNDIAL (OpenUnlearning ``undial.py``): self-distillation to the frozen initial model with the true next
token's logit lowered by β, plus GradDiff's retain term (OpenUnlearning's YAML: γ 1, α 0, β 10).

``masked=True`` (default) distils the answer positions only; ``masked=False`` is OpenUnlearning's form, which
also distils prompt and padding positions (see :func:`lacuna_unlearn.methods.losses.undial_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lacuna_unlearn.methods.base import forward
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import undial_loss
from lacuna_unlearn.methods.settings import UNDIALSettings


@dataclass
class UNDIAL(UNDIALSettings, GradDiff):
    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return True

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        batch = inputs["forget"]
        with torch.no_grad():
            ref_logits = forward(ref_model, batch)
        forget = undial_loss(forward(model, batch), batch["labels"], ref_logits, self.beta, self.masked)
        retain = self.retain_term(model, inputs, ref_model) if self.alpha else forget.new_zeros(())
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
