"""GradAscent (docs/definitions.md#unlearning-losses): maximise the forget NLL, nothing else."""

from __future__ import annotations

from dataclasses import dataclass

from lacuna_unlearn.methods.base import Method, forward
from lacuna_unlearn.methods.losses import nll_loss


@dataclass
class GradAscent(Method):
    needs_retain = False

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        forget_nll = nll_loss(forward(model, inputs["forget"]), inputs["forget"]["labels"])
        return -self.gamma * forget_nll, {"forget_nll": float(forget_nll.detach())}
