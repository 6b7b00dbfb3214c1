"""Finetune: plain NLL descent on the "forget" slot's QA rows (the relearning attack's objective).

Not an unlearning method: it is what a relearning / resurfacing attack (docs/definitions.md#relearning-attacks) runs on
an unlearned model, and what OpenUnlearning calls its ``finetune`` trainer. Sharing the unlearning
trainer gives the attack the same data format (loss on answer tokens), LoRA switch, seeds and manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from lacuna_unlearn.methods.base import Method, forward
from lacuna_unlearn.methods.losses import nll_loss


@dataclass
class Finetune(Method):
    needs_retain = False

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        nll = nll_loss(forward(model, inputs["forget"]), inputs["forget"]["labels"])
        return self.gamma * nll, {"nll": float(nll.detach())}
