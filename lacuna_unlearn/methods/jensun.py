"""JensUn (docs/definitions.md#jensun-objective): JSD to a one-hot refusal target on forget answers + JSD to the frozen
model on retain.

L = γ·L_F + α·L_R, γ = α = 1. L_F = :func:`jensun_forget_loss` (HEAD: refusal ids repeated cyclically over
the answer positions; ``legacy_unmasked`` = the paper-time peaked, unmasked variant). L_R =
:func:`retain_loss` with ``kind`` "jsd" (default, :func:`jensun_retain_loss`, with ``legacy_unmasked``
passed through), "kl" or "nll".

The refusal string must be tokenized with the model's tokenizer, which ``Method.loss`` never sees: either
pass ``refusal_ids`` explicitly, or call :meth:`JensUn.prepare` with the tokenizer before training (the
trainer calls ``method.prepare(tokenizer)`` of every method). ``loss`` refuses to run without ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lacuna_unlearn.methods.base import forward
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import jensun_forget_loss
from lacuna_unlearn.methods.settings import JensUnSettings
from lacuna_unlearn.qa.unlearn_data import answer_ids


@dataclass
class JensUn(JensUnSettings, GradDiff):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.refusal_ids = tuple(int(i) for i in self.refusal_ids)

    def prepare(self, tokenizer: Any) -> None:
        """Tokenize ``refusal`` as an answer (:func:`~lacuna_unlearn.qa.unlearn_data.answer_ids`) into ``refusal_ids``;
        explicitly given ids are kept."""
        if self.refusal_ids:
            return
        ids = answer_ids(tokenizer, self.refusal)
        if not ids:
            raise ValueError(f"refusal {self.refusal!r} tokenizes to nothing")
        self.refusal_ids = tuple(int(i) for i in ids)

    def retain_options(self) -> dict[str, bool]:
        return {"legacy_unmasked": self.legacy_unmasked}

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        if not self.refusal_ids:
            raise RuntimeError("JensUn needs refusal_ids: pass them or call method.prepare(tokenizer) first")
        batch = inputs["forget"]
        forget = jensun_forget_loss(
            forward(model, batch), batch["labels"], self.refusal_ids, legacy_unmasked=self.legacy_unmasked
        )
        retain = self.retain_term(model, inputs, ref_model)
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
