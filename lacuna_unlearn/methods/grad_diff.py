"""GradDiff (docs/definitions.md#unlearning-losses): γ·(−NLL forget) + α·retain term (NLL, or KL to the frozen initial
model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lacuna_unlearn.methods.base import Method, forward
from lacuna_unlearn.methods.losses import nll_loss, retain_loss
from lacuna_unlearn.methods.settings import GradDiffSettings


@dataclass
class GradDiff(GradDiffSettings, Method):
    def __post_init__(self) -> None:
        if self.retain_loss_type.lower() not in ("nll", "kl", "jsd"):
            raise ValueError(f"retain_loss_type must be nll, kl or jsd, got {self.retain_loss_type!r}")

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return self.retain_loss_type.lower() != "nll"

    def retain_term(self, model, inputs, ref_model) -> torch.Tensor:  # noqa: ANN001
        batch = inputs["retain"]
        logits = forward(model, batch)
        ref_logits = None
        if self.needs_reference:
            with torch.no_grad():
                ref_logits = forward(ref_model, batch)
        return retain_loss(logits, batch["labels"], ref_logits, kind=self.retain_loss_type, **self.retain_options())

    def retain_options(self) -> dict[str, bool]:
        """Extra keyword arguments of :func:`lacuna_unlearn.methods.losses.retain_loss` (JensUn: ``legacy_unmasked``)."""
        return {}

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        forget_nll = nll_loss(forward(model, inputs["forget"]), inputs["forget"]["labels"])
        retain = self.retain_term(model, inputs, ref_model)
        total = -self.gamma * forget_nll + self.alpha * retain
        return total, {"forget_nll": float(forget_nll.detach()), "retain_loss": float(retain.detach())}
