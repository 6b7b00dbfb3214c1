"""The interface every unlearning method implements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lacuna_unlearn.methods.settings import MethodSettings


def forward(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Logits of ``model`` on a padded batch (labels are not passed: losses handle the shift themselves)."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


@dataclass
class Method(MethodSettings):
    """Base class: ``gamma`` weighs the forget term, ``alpha`` the retain term
    (docs/definitions.md#unlearning-losses); a subclass's hyper-parameters are its settings dataclass's
    (:mod:`lacuna_unlearn.methods.settings`)."""

    needs_reference = False
    needs_retain = True

    def prepare(self, tokenizer: Any) -> None:
        """Called by the trainer once, with the model's tokenizer, before the data is built: methods whose
        hyper-parameters are text (JensUn's and IdkDPO's refusal) tokenize them here. Default: nothing to do."""

    def alternate_answer_ids(self) -> tuple[int, ...] | None:
        """Token ids that replace every forget answer in a second copy of the forget data (IdkDPO's refusal,
        the preferred side of its DPO pair). The trainer encodes that copy once, when it builds the data, and batches
        carry it as ``forget_alternate``. Default: None (no copy)."""
        return None

    def loss(
        self,
        model: torch.nn.Module,
        inputs: Mapping[str, Mapping[str, torch.Tensor]],
        ref_model: torch.nn.Module | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss to minimise and scalars worth logging."""
        raise NotImplementedError

    def locate(
        self,
        model: torch.nn.Module,
        forget: torch.utils.data.Dataset,
        retain: torch.utils.data.Dataset | None,
        collate: Callable[[list[Any]], dict[str, Any]],
    ) -> dict[str, torch.Tensor | None] | None:
        """Localisation-first methods (WAGLE, MemFlex): the parameters to train, name -> bool keep mask of the
        parameter's shape (None = the whole parameter). Called once before training, on the model the
        optimizer will see (the peft model when LoRA is on); the trainer intersects the result with
        ``restrict=``, freezes the rest and verifies afterwards that nothing outside moved.
        ``None`` (the default) = no localisation."""
        return None


def summed_nll_gradients(
    model: torch.nn.Module,
    items: Sequence[Mapping[str, torch.Tensor]],
    collate: Callable[[list[Any]], dict[str, Any]],
    params: Mapping[str, torch.nn.Parameter],
    batch_size: int = 8,
) -> dict[str, torch.Tensor]:
    """Sum over batches of d(mean answer-token NLL)/d(param) (float32): the gradient statistics localisation-first
    methods rank parameters by (WAGLE's attribution, MemFlex's gradient information).

    ``items`` are encoded QA items (:class:`lacuna_unlearn.qa.unlearn_data.QADataset` entries) batched in order
    with the trainer's ``collate``; the model runs in eval mode and ``.grad`` fields are left untouched.
    """
    from lacuna_metrics import eval_mode, model_device
    from lacuna_unlearn.methods.losses import nll_loss

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names, tensors = list(params), list(params.values())
    totals = {n: torch.zeros(p.shape, dtype=torch.float32, device=p.device) for n, p in params.items()}
    device = model_device(model)
    with eval_mode(model), torch.enable_grad():
        for start in range(0, len(items), batch_size):
            batch = collate([{"forget": it} for it in items[start : start + batch_size]])["forget"]
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = nll_loss(forward(model, batch), batch["labels"])
            grads = torch.autograd.grad(loss, tensors, allow_unused=True)
            for name, g in zip(names, grads, strict=True):
                if g is not None:
                    totals[name] += g.detach().float()
    return totals
