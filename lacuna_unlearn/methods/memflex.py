"""MemFlex (docs/definitions.md#memflex): train only the LoRA adapters that gradients "locate".

Sources [CODE]: LACUNA ``src/unlearn_methods/MemFlex.py`` + ``configs/unlearning/MemFlex.yaml``, which reuse
KnowUnDo's (Tian et al. 2024) ``pretrain/localization.py`` (``compute_info``), ``pretrain/data_module.py``
(random-label data) and ``llm_unlearn/methods/ascent_plus_descent.py`` (the objective).

1. Localisation, :meth:`MemFlex.locate`, once on the peft model before training. For every LoRA adapter tensor
   (each ``lora_A`` / ``lora_B`` weight of each wrapped linear, taken whole) the gradient information of the
   forget ("unlearn") and of the retain ("retention") rows is computed (:func:`gradient_info`); the tensor is
   located iff ``cos(g_unlearn, g_retain) < cos_threshold`` **and** ``mean|g_unlearn| > grad_threshold``
   (:func:`located`; both strict, as the code's ``np.where``). Nothing located is an error, not a no-op.
2. Training: the trainer freezes every non-located tensor (and verifies afterwards that none moved); the loss is
   AscentPlusDescent: the per-sequence mean answer NLL times ``forget_factor`` (−0.6) for forget rows and
   ``retain_factor`` (2.0) for retain rows, averaged over all rows of the batch. Adapters are merged on save.

Details read in the code [CODE]:

* ``compute_info``: ``model.eval()`` (no dropout), the HF mean-token NLL of each batch of
  ``locate_batch_size`` rows (LACUNA ``batch_size: 8``), gradients summed over batches and divided by the number
  of rows. The scale of ``mean|g|``, hence the meaning of ``grad_threshold``, depends on that batch size.
* Both splits are scored with *random labels* (``TextDatasetRandomQA`` → ``convert_to_model_format_with_random_label``):
  ``len(answer) // 2`` draws, with replacement, of an answer position whose token is replaced, in the input and
  in the label alike, by a uniformly random id. The gradient is of the (descent) NLL of those corrupted answers.
* Cosine of the two flattened tensors; 0 when either is all zero (sklearn's ``cosine_similarity``).
* LACUNA adds *fresh* adapters (KnowUnDo instead localises a LoRA fine-tuned on the data). peft initialises
  ``lora_B`` to zero, so every ``lora_A`` gradient is exactly zero and no ``lora_A`` can pass the magnitude test:
  MemFlex as LACUNA runs it trains a subset of the ``lora_B`` matrices against fixed random ``lora_A``
  projections (still a rank-r update per module). Kept as is rather than "fixed"; the zero-gradient ``lora_A``
  tensors are simply never located.
* The objective: KnowUnDo's trainer multiplies the per-sequence mean NLL (sum over answer tokens / their count)
  by the row's factor and takes the batch mean, its data interleaving forget rows (factor −1 → forget factor)
  with retain rows (factor +1 → retain factor). LACUNA: forget −0.6, retain 2.0 (code default −0.4 if unset).
* LoRA r 8, α 32, dropout 0.1, the seven projections (``configs/method/memflex.yaml`` sets them).

INFERRED (not recoverable from the code, or deliberately different):

* Random replacement ids are drawn from ``[0, rows of the output embedding)`` (the code: the tokenizer's
  ``vocab_size``; its special-token re-draw compares ids with ``is`` and is effectively dead), from a
  ``torch.Generator`` seeded with ``seed`` (the code: Python's global ``random``); ``random_labels=False``
  scores the true answers instead.
* Localisation batches are taken in dataset order (the code shuffles; only batch composition differs).
* Pairing: this trainer pairs each forget row with a random retain row, so a batch of b pairs holds 2b rows
  (the code: forget row i with retain row i, then one global shuffle). LACUNA's "batch 1 × accum 16" = 16 rows
  per optimizer step = ``per_device_train_batch_size: 8`` here.
* The inherited ``gamma`` / ``alpha`` (default 1) multiply ``forget_factor`` / ``retain_factor``; leave them at 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lacuna_unlearn.methods.base import Method, forward, summed_nll_gradients
from lacuna_unlearn.methods.losses import IGNORE_INDEX, combine, token_counts, token_nll
from lacuna_unlearn.methods.settings import MemFlexSettings

logger = logging.getLogger(__name__)

__all__ = ["MemFlex", "cosine", "gradient_info", "located", "randomize_answer"]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two tensors flattened (float64); 0 when either is all zero, as sklearn's ``cosine_similarity``."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    norm = float(torch.linalg.vector_norm(a)) * float(torch.linalg.vector_norm(b))
    return float(a @ b) / norm if norm > 0 else 0.0


def located(
    g_unlearn: torch.Tensor, g_retain: torch.Tensor, cos_threshold: float = 0.92, grad_threshold: float = 6e-4
) -> bool:
    """MemFlex's rule for one parameter: forget and retain gradients disagree in direction
    (``cos < cos_threshold``) and the forget gradient is large (``mean|g_unlearn| > grad_threshold``)."""
    magnitude = float(g_unlearn.detach().double().abs().mean())
    return cosine(g_unlearn, g_retain) < cos_threshold and magnitude > grad_threshold


def randomize_answer(
    item: Mapping[str, torch.Tensor], vocab_size: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """KnowUnDo's random-label corruption of one QA item: ``n // 2`` draws (with replacement) among the n answer
    positions, each replaced in ``input_ids`` and ``labels`` by a uniform random id in ``[0, vocab_size)``."""
    ids, labels = item["input_ids"].clone(), item["labels"].clone()
    answer = (labels != IGNORE_INDEX).nonzero().flatten()
    for _ in range(len(answer) // 2):
        pos = answer[int(torch.randint(len(answer), (1,), generator=generator))]
        token = int(torch.randint(vocab_size, (1,), generator=generator))
        ids[pos] = labels[pos] = token
    return {**item, "input_ids": ids, "labels": labels}


def _vocab_size(model: torch.nn.Module) -> int:
    output = model.get_output_embeddings()
    return int(output.weight.shape[0]) if output is not None else int(model.config.vocab_size)


def gradient_info(
    model: torch.nn.Module,
    dataset: torch.utils.data.Dataset,
    collate: Callable[[list[Any]], dict[str, Any]],
    names: list[str],
    *,
    batch_size: int = 8,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """``compute_info``: Σ over batches of ∇ NLL(batch) for the parameters ``names``, divided by the number of rows.

    ``generator`` given: answers are randomly relabelled first (:func:`randomize_answer`). Runs in eval mode
    (``compute_info``); ``.grad`` fields are left as they were (gradients come from ``torch.autograd.grad``).
    """
    params = dict(model.named_parameters())
    items = [dataset[i] for i in range(len(dataset))]
    if generator is not None:
        vocab = _vocab_size(model)
        items = [randomize_answer(it, vocab, generator) for it in items]
    summed = summed_nll_gradients(model, items, collate, {n: params[n] for n in names}, batch_size)
    return {n: g / len(items) for n, g in summed.items()}


def _sequence_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean answer NLL, shape [B] (AscentPlusDescent's ``loss.sum(-1) / valid_counts``)."""
    return token_nll(logits, labels) / token_counts(labels).clamp(min=1)


@dataclass
class MemFlex(MemFlexSettings, Method):
    """LoRA parameters located by forget/retain gradient disagreement, trained with ascent (forget) plus descent
    (hyper-parameters: :class:`lacuna_unlearn.methods.settings.MemFlexSettings`)."""

    def __post_init__(self) -> None:
        if self.forget_factor >= 0:
            raise ValueError(
                f"forget_factor must be negative (it weighs the forget NLL: ascent), got {self.forget_factor}"
            )
        if self.retain_factor < 0:
            raise ValueError(f"retain_factor must be >= 0, got {self.retain_factor}")
        if self.grad_threshold < 0:
            raise ValueError(f"grad_threshold must be >= 0 (a mean |gradient|), got {self.grad_threshold}")
        if int(self.locate_batch_size) < 1:
            raise ValueError(f"locate_batch_size must be >= 1, got {self.locate_batch_size}")
        self.stats: dict[str, dict[str, float]] = {}  # per adapter: cosine, mean|g_unlearn| (not in asdict())

    def locate(
        self,
        model: torch.nn.Module,
        forget: torch.utils.data.Dataset,
        retain: torch.utils.data.Dataset | None,
        collate: Callable[[list[Any]], dict[str, Any]],
    ) -> dict[str, torch.Tensor | None]:
        """The located LoRA tensors (whole tensors); ValueError without LoRA, without retain data or if none passes."""
        names = [n for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
        if not names:
            raise ValueError(
                "MemFlex trains LoRA adapters but the model has none: enable LoRA (lora.enabled=true on the "
                "command line, or lora=LoraSettings(...) in unlearn())"
            )
        if retain is None:
            raise ValueError("MemFlex needs retain data to locate parameters")
        was_training = model.training
        model.eval()
        generator = torch.Generator().manual_seed(int(self.seed)) if self.random_labels else None
        try:
            size = int(self.locate_batch_size)
            g_unlearn = gradient_info(model, forget, collate, names, batch_size=size, generator=generator)
            g_retain = gradient_info(model, retain, collate, names, batch_size=size, generator=generator)
        finally:
            model.train(was_training)
        self.stats = {
            n: {"cosine": cosine(g_unlearn[n], g_retain[n]), "grad": float(g_unlearn[n].double().abs().mean())}
            for n in names
        }
        chosen = [n for n in names if located(g_unlearn[n], g_retain[n], self.cos_threshold, self.grad_threshold)]
        grads = [s["grad"] for s in self.stats.values()]
        cosines = [s["cosine"] for s in self.stats.values()]
        if not chosen:
            raise ValueError(
                f"MemFlex located no LoRA parameter: none of {len(names)} has cos(g_forget, g_retain) < "
                f"cos_threshold={self.cos_threshold} and mean|g_forget| > grad_threshold={self.grad_threshold} "
                f"(largest mean|g_forget| {max(grads):.2e}, smallest cosine {min(cosines):.3f}); lower "
                f"method.args.grad_threshold or raise method.args.cos_threshold"
            )
        logger.info(
            "[memflex] located %d / %d LoRA parameters (cos_threshold=%s, grad_threshold=%s; mean|g_forget| "
            "%.2e..%.2e, cosine %.3f..%.3f)",
            len(chosen), len(names), self.cos_threshold, self.grad_threshold, min(grads), max(grads), min(cosines),
            max(cosines),
        )  # fmt: skip
        return {n: None for n in chosen}

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        forget, retain = inputs["forget"], inputs["retain"]
        f_seq = _sequence_nll(forward(model, forget), forget["labels"])
        r_seq = _sequence_nll(forward(model, retain), retain["labels"])
        weights = {"gamma": self.gamma * self.forget_factor, "alpha": self.alpha * self.retain_factor}
        total = combine(f_seq.sum(), r_seq.sum(), **weights) / (f_seq.numel() + r_seq.numel())
        return total, {"forget_nll": float(f_seq.detach().mean()), "retain_nll": float(r_seq.detach().mean())}
