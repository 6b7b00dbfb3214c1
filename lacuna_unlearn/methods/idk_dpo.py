"""IdkDPO: DPO with the refusal as the preferred answer and the true answer as the rejected one, against the
frozen initial model, plus GradDiff's retain term (OpenUnlearning's IdkDPO: β 0.1, γ 1, α 1, retain NLL).

Standard DPO scale by default; ``openunlearning_scale=true`` multiplies by 2/β as OpenUnlearning does. The
refusal is tokenized by :meth:`IdkDPO.prepare` (called by the trainer) in the answer format `` text\\n``. The
refusal side of each pair (the forget prompt with the refusal as answer) is encoded once, when the trainer builds the
data (:meth:`IdkDPO.alternate_answer_ids`), and arrives in batches as ``forget_alternate``; a batch without it (a
direct ``loss`` call) gets it built from the forget batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lacuna_unlearn.methods.base import forward
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.losses import dpo_loss, token_nll
from lacuna_unlearn.methods.settings import IdkDPOSettings
from lacuna_unlearn.qa.unlearn_data import answer_ids, replace_answers


@dataclass
class IdkDPO(IdkDPOSettings, GradDiff):
    refusal_ids: tuple[int, ...] = ()  # filled by prepare(tokenizer) unless given (not a method.args default)

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return True

    def prepare(self, tokenizer: Any) -> None:
        """Tokenize `` refusal\\n`` + EOS the way :func:`lacuna_unlearn.qa.unlearn_data.encode_qa` tokenizes answers
        (EOS when the tokenizer has one: the answers it replaces end with EOS, docs/unlearning.md)."""
        if not self.refusal_ids:
            ids = answer_ids(tokenizer, f" {self.refusal}\n")
            if not ids:
                raise ValueError(f"refusal {self.refusal!r} tokenizes to nothing")
            if getattr(tokenizer, "eos_token_id", None) is not None:
                ids = [*ids, tokenizer.eos_token_id]
            self.refusal_ids = tuple(int(i) for i in ids)

    def alternate_answer_ids(self) -> tuple[int, ...]:
        """The refusal: the trainer builds the preferred side of every forget item once."""
        if not self.refusal_ids:
            raise RuntimeError("IdkDPO needs refusal_ids: pass them or call method.prepare(tokenizer) first")
        return self.refusal_ids

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        if not self.refusal_ids:
            raise RuntimeError("IdkDPO needs refusal_ids: pass them or call method.prepare(tokenizer) first")
        lose = inputs["forget"]
        win = inputs.get("forget_alternate")
        if win is None:  # not from the trainer's data: build the refusal side here
            win = replace_answers(lose, self.refusal_ids)
        with torch.no_grad():
            win_ref = -token_nll(forward(ref_model, win), win["labels"])
            lose_ref = -token_nll(forward(ref_model, lose), lose["labels"])
        win_logp = -token_nll(forward(model, win), win["labels"])
        lose_logp = -token_nll(forward(model, lose), lose["labels"])
        forget = dpo_loss(win_logp, win_ref, lose_logp, lose_ref, self.beta, self.openunlearning_scale)
        retain = self.retain_term(model, inputs, ref_model)
        return self.gamma * forget + self.alpha * retain, {
            "forget_loss": float(forget.detach()),
            "retain_loss": float(retain.detach()),
        }
