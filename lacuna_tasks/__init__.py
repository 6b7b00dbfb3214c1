"""LACUNA data, prompts and lm-evaluation-harness tasks (``lm_eval --tasks lacuna_email``).

The public face of the package: the other packages and ``benchmarks/`` import these names from here, never from a
submodule (``scripts/structure_report.py`` checks it). Lazy: ``import lacuna_tasks`` imports none of them."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    name: module
    for module, names in {
        "lacuna_tasks.harness.evaluate": ("evaluate",),
        "lacuna_tasks.harness.hooks": ("build_docs",),
        "lacuna_tasks.harness.perplexity": (
            "neutral_heldout_path",
            "read_neutral_heldout",
            "word_perplexity_ratio",
        ),
        "lacuna_tasks.harness.register": (
            "task_manager",
            "tasks_dir",
        ),
        "lacuna_tasks.harness.results": (
            "LmEvalResultsError",
            "find_lm_eval_results",
            "metric_value",
            "read_lm_eval_results",
            "resolve_lm_eval_results",
        ),
        "lacuna_tasks.loader": (
            "KNOWN_SPLITS",
            "NO_PROFILES_HINT",
            "load_data",
            "read_rows",
            "reading",
        ),
        "lacuna_tasks.logs": (
            "add_verbosity_arguments",
            "configure_logging",
            "progress",
        ),
        "lacuna_tasks.normalize": (
            "DEFAULT_JUDGE",
            "JUDGES",
            "JUDGE_RULES",
            "SUCCESS_AT_N_JUDGE",
            "check_judge",
            "judge_hit",
            "judge_stop",
        ),
        "lacuna_tasks.prompts": (
            "full_name",
            "lacuna_question",
            "paraphrases",
            "person_from_question",
            "pick_icr_examples",
            "possessive",
            "probe_prompt",
            "qa_prompt",
            "qa_text",
            "stable_rng",
            "stable_seed",
        ),
        "lacuna_tasks.schema": (
            "FIELDS",
            "FORGET_GROUPS",
            "LacunaDataError",
            "NEUTRAL_HELDOUT_FILE",
            "NEUTRAL_PPL_TASK",
            "RETAIN_GROUPS",
            "get_field",
        ),
        "lacuna_tasks.synth.generate": (
            "bio_texts",
            "build_splits",
            "generate_dataset",
            "generate_profiles",
            "write_dataset",
        ),
        "lacuna_tasks.validate": ("RETAIN_EVAL_SPLITS", "check_group_ids"),
    }.items()
    for name in names
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:  # lazy: importing the package imports none of its modules
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
