"""The interface every unlearning method implements."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


def forward(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Logits of ``model`` on a padded batch (labels are not passed: losses handle the shift themselves)."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


@dataclass
class Method:
    """Base class: ``gamma`` weighs the forget term, ``alpha`` the retain term (spec §6)."""

    gamma: float = 1.0
    alpha: float = 1.0
    needs_reference = False
    needs_retain = True

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
