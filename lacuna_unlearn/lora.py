"""LoRA (peft) for every gradient method and for the relearning attacks: wrap before training, merge on save.

Targets default to every linear layer inside the transformer blocks (on Llama/OLMo: the seven projections,
as LACUNA's relearning and MemFlex configs), found by :mod:`lacuna_metrics.weights.anatomy` from the module structure so
other architectures work too (fused q/k/v, GPT-2 ``Conv1D``, per-expert modules). Fused 3-D expert parameters
(transformers 5 MoE) get adapters through peft's ``target_parameters``. The saved checkpoint is the merged model
in the ordinary HF layout, so every downstream tool reads it unchanged. See docs/anatomy.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lacuna_metrics import is_linear_module, model_anatomy

__all__ = ["LoraSettings", "expert_parameter_names", "linear_module_names"]


def linear_module_names(model: torch.nn.Module, layers: Sequence[int] | None = None) -> list[str]:
    """Suffix names of the linear layers inside blocks ``layers`` (None: all blocks); architecture-agnostic."""
    wanted = set(layers) if layers is not None else None
    modules = dict(model.named_modules())
    names = set()
    for weight in model_anatomy(model).matrices():
        if weight.hook != "linear" or not is_linear_module(modules[weight.module]):
            continue
        if wanted is None or weight.layer in wanted:
            names.add(weight.module.rsplit(".", 1)[-1])
    if not names:
        raise ValueError(f"no linear layers found in layers {sorted(wanted) if wanted else 'of any block'}")
    return sorted(names)


def expert_parameter_names(model: torch.nn.Module, layers: Sequence[int] | None = None) -> list[str]:
    """Full names of the fused 3-D expert parameters inside blocks ``layers`` (None: all blocks)."""
    wanted = set(layers) if layers is not None else None
    return [
        w.name for w in model_anatomy(model).matrices() if w.fused_experts and (wanted is None or w.layer in wanted)
    ]


def _supports_target_parameters() -> bool:
    from dataclasses import fields

    from peft import LoraConfig

    return any(f.name == "target_parameters" for f in fields(LoraConfig))


@dataclass
class LoraSettings:
    """peft ``LoraConfig`` fields (same names); ``target_modules``/``layers`` None = every block's linears."""

    r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: list[str] | None = None
    layers: list[int] | None = None

    def __post_init__(self) -> None:
        if int(self.r) < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")
        if not 0.0 <= float(self.lora_dropout) < 1.0:
            raise ValueError(f"lora.lora_dropout must be in [0, 1), got {self.lora_dropout}")

    def wrap(self, model: torch.nn.Module) -> Any:
        """The peft model with fresh adapters (base weights frozen)."""
        from peft import LoraConfig, get_peft_model

        layers = list(self.layers) if self.layers is not None else None
        extra: dict[str, Any] = {}
        if not self.target_modules:
            experts = expert_parameter_names(model, layers)
            if experts and _supports_target_parameters():
                extra["target_parameters"] = experts
        config = LoraConfig(
            r=int(self.r),
            lora_alpha=self.lora_alpha,
            lora_dropout=float(self.lora_dropout),
            bias="none",
            target_modules=list(self.target_modules) if self.target_modules else linear_module_names(model, layers),
            layers_to_transform=layers,
            task_type="CAUSAL_LM",
            **extra,
        )
        return get_peft_model(model, config)

    @staticmethod
    def merge(peft_model: Any) -> torch.nn.Module:
        """Fold the adapters into the base weights and drop the peft wrapper."""
        return peft_model.merge_and_unload()
