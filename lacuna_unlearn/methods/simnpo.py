"""SimNPO (docs/definitions.md#unlearning-losses): reference-free, length-normalised NPO,
−(2/β)·E log σ(β(ℓ_θ/|y| − δ)), plus a retain term.

OpenUnlearning defaults: δ 0, β 4.5, γ 0.125, α 1 (LACUNA's 1B/7B settings: `experiment=lacuna_1b/simnpo` etc.).
"""

from __future__ import annotations

from dataclasses import dataclass

from lacuna_unlearn.methods.base import forward
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import simnpo_loss
from lacuna_unlearn.methods.settings import SimNPOSettings


@dataclass
class SimNPO(SimNPOSettings, GradDiff):
    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        batch = inputs["forget"]
        forget = simnpo_loss(forward(model, batch), batch["labels"], beta=self.beta, delta=self.delta)
        retain = self.retain_term(model, inputs, ref_model)
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
