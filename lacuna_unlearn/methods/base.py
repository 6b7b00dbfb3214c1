"""The interface every unlearning method implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
