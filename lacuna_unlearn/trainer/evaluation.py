"""Evaluation during training on the validation people, keeping the best checkpoint by a named criterion
(``trainer.args.eval_every`` / ``trainer.args.best_by``, docs/unlearning.md; OpenUnlearning #187).

The criteria (:data:`lacuna_unlearn.trainer.selection.BEST_BY`) are read on the model in memory, between optimizer
steps, with no lm-eval run and no checkpoint written: ``validation_leak`` asks each validation person's QA question
with the probe of the ``lacuna_<field>_forget_qa`` task, the plain-QA leak ``lacuna run``'s stopping points are chosen
on by default (lacuna_unlearn/bench/stopping.py): :func:`lacuna_tasks.probe_prompt`, greedy decoding of 20 tokens,
the first line judged by :func:`lacuna_metrics.extraction_hits` (the lm-eval tasks' ``first_line`` rule).
``eval_loss`` is the mean NLL of their answer tokens under the unlearning labels. The step kept is
:func:`~lacuna_unlearn.trainer.selection.best_step` of the curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from lacuna_metrics import extraction_hits
from lacuna_tasks import probe_prompt
from lacuna_unlearn.methods.losses import token_counts, token_nll
from lacuna_unlearn.qa.unlearn_data import QADataset, collate_forget_retain
from lacuna_unlearn.trainer.selection import best_step

__all__ = ["BestCheckpoint", "validation_leak", "validation_loss"]


def validation_leak(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], *, batch_size: int = 8) -> float:
    """Share of the people (person and field) of ``rows`` whose answer the model generates for their QA question:
    the forget_qa task's probe and judge on the model in memory (with one question per person and field, as a
    validation split has, its ``leak_rate``)."""
    if tokenizer.pad_token is None:
        raise ValueError("validation_leak: the tokenizer needs a pad token to batch prompts (set it to EOS)")
    hits = extraction_hits(
        model,
        tokenizer,
        [probe_prompt(r["question"]) for r in rows],
        [r["answer"] for r in rows],
        [r["field"] for r in rows],
        batch_size=batch_size,
    )
    leaked: dict[tuple[str, str], bool] = {}
    for row, hit in zip(rows, hits, strict=True):
        key = (str(row["ID"]), str(row["field"]))
        leaked[key] = leaked.get(key, False) or hit
    return sum(leaked.values()) / len(leaked)


@torch.no_grad()
def validation_loss(model: Any, data: QADataset, pad_id: int, *, batch_size: int = 8) -> float:
    """Mean NLL over every labelled answer token of ``data`` (the token-weighted mean over batches)."""
    collate = collate_forget_retain(pad_id)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(data), batch_size):
        batch = collate([data[i] for i in range(start, min(start + batch_size, len(data)))])
        logits = model(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
        ).logits
        labels = batch["labels"].to(device)
        total += float(token_nll(logits, labels).sum())
        count += int(token_counts(labels).sum())
    return total / max(count, 1)


class BestCheckpoint(TrainerCallback):
    """Evaluates ``measure(model)`` after every ``every``-th optimizer step and after the last one, logs it as
    ``eval_<criterion>`` (``eval_loss`` as is) so ``report_to`` integrations see it, and keeps a CPU copy of the
    trainable parameters of the best step so far (:func:`best_step`: lowest value, earliest of equals);
    :meth:`restore` puts them back after training. The model is evaluated in eval mode (no dropout) and handed back
    in the mode it was in."""

    def __init__(
        self,
        every: int,
        criterion: str,
        measure: Callable[[torch.nn.Module], float],
        log: Callable[[dict[str, float]], None],
    ) -> None:
        self.every, self.criterion, self.measure, self.log = int(every), criterion, measure, log
        self.curve: list[dict[str, Any]] = []
        self.kept_step: int | None = None
        self._kept: dict[str, torch.Tensor] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001, ANN201 - TrainerCallback hook
        step = int(state.global_step)
        if step % self.every and not control.should_training_stop:  # the last step is always evaluated
            return control
        training = model.training
        try:
            value = float(self.measure(model))
        finally:
            model.train(training)
        self.curve.append({"step": step, self.criterion: value})
        should_log = control.should_log  # logging clears it: the step's own loss log would be skipped
        self.log({self.criterion if self.criterion.startswith("eval_") else f"eval_{self.criterion}": value})
        control.should_log = should_log
        if best_step(self.curve, self.criterion)["step"] == step and self.kept_step != step:
            self._kept = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
            self.kept_step = step
        return control

    def restore(self, model: torch.nn.Module) -> dict[str, Any]:
        """Load the kept step's parameters into ``model`` (the one trained) and return the manifest's record:
        ``criterion``, ``curve`` (every evaluated step's value), ``chosen_step`` and its ``value``."""
        if not self.curve:
            raise RuntimeError("trainer.args.eval_every: no step was evaluated (did the run train at all?)")
        chosen = best_step(self.curve, self.criterion)
        if chosen["step"] != self.kept_step:
            raise RuntimeError(f"best checkpoint: kept step {self.kept_step}, the curve's best is {chosen['step']}")
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in self._kept:
                    param.copy_(self._kept[name].to(param.device))
        self._kept = {}
        return {
            "criterion": self.criterion,
            "every": self.every,
            "curve": [{k: _json_number(v) for k, v in p.items()} for p in self.curve],
            "chosen_step": chosen["step"],
            "value": _json_number(chosen["value"]),
        }


def _json_number(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has no NaN)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
