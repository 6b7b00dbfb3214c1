"""Training side of lacuna-bench: testbed builder, unlearning methods, relearning attacks, ``lacuna run``, CLI.

The public face of the package: ``benchmarks/`` imports these names from here, never from a submodule
(``scripts/structure_report.py`` checks it). Lazy: ``import lacuna_unlearn`` imports none of them."""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    name: module
    for module, names in {
        "lacuna_unlearn.dataclass_config": ("parse_overrides",),
        "lacuna_unlearn.testbed.build": (
            "count_layers",
            "injection_batches",
            "injection_plan",
            "model_config",
            "testbed_masks",
            "testbed_splits",
            "tokenizer_and_model",
        ),
        "lacuna_unlearn.testbed.corpus": (
            "pack",
            "testbed_corpus",
        ),
        "lacuna_unlearn.testbed.injection": (
            "NEUTRAL",
            "OUTSIDE",
            "StepBatches",
            "StepPlan",
            "mask_gradients",
            "train_steps",
        ),
        "lacuna_unlearn.testbed.presets": ("get_preset",),
        "lacuna_unlearn.testbed.probes": (
            "memorization_test",
            "robustness_test",
        ),
        "lacuna_unlearn.testbed.qa_tuning": ("qa_tune",),
    }.items()
    for name in names
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # lazy: importing the package imports none of its modules
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
