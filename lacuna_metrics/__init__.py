"""Reading weights: masks, checkpoint streams, localization scores, FRAG and behavioural metrics.

The public face of the package: the other packages and ``benchmarks/`` import these names from here, never from a
submodule (``scripts/structure_report.py`` checks it). Lazy: ``import lacuna_metrics`` imports neither torch nor
scikit-learn."""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    name: module
    for module, names in {
        "lacuna_metrics.behaviour.intervals": (
            "clopper_pearson",
            "mean_sd",
            "per_person_values",
            "rate_interval",
        ),
        "lacuna_metrics.behaviour.probes": (
            "extraction_hits",
            "greedy_generate",
        ),
        "lacuna_metrics.behaviour.regimes": (
            "accuracies_from_lm_eval",
            "classify_regime",
            "leak_separation",
        ),
        "lacuna_metrics.diagnose.diagnostics": ("diagnose_models",),
        "lacuna_metrics.frag.activations": (
            "FRP_TARGETS",
            "activation_stats",
            "calibration_texts",
            "check_target",
            "eval_mode",
            "linear_weight_names",
            "model_device",
            "transposed_weight_names",
        ),
        "lacuna_metrics.faults": (
            "error_line",
            "naming_outputs",
            "symlink_loop",
            "symlink_loop_error",
            "writing",
        ),
        "lacuna_metrics.frag.targets": ("linear_frag_weights",),
        "lacuna_metrics.meta.correlation": ("MIN_MODELS", "leave_one_out", "spearman"),
        "lacuna_metrics.meta.faithfulness": ("faithfulness_auc",),
        "lacuna_metrics.meta.noise": ("noise_ranking",),
        "lacuna_metrics.meta.robustness": (
            "UNDEFINED_RULES",
            "harmonic_mean",
            "mean_interval",
            "quantization_robustness",
            "relearning_robustness",
        ),
        "lacuna_metrics.layout": (
            "Layout",
            "LayoutError",
            "RELEASE_UNLEARNED_DIR",
            "is_release_dir",
            "release_tuned_dir",
            "resolve_testbed",
        ),
        "lacuna_metrics.localization.leak_audit": (
            "LeakAuditError",
            "audit_testbed",
        ),
        "lacuna_metrics.localization.trace_classifier": (
            "classify_trace",
            "method_free_aucs",
            "sample_features",
            "trace_classifier_aucs",
        ),
        "lacuna_metrics.localization.precision": (
            "LocalizationConfig",
            "SCORES",
        ),
        "lacuna_metrics.manifest": (
            "exclusive_writer",
            "build_manifest",
            "package_versions",
            "publish_together",
            "save_figure",
            "save_tensors",
            "write_json",
            "write_text",
        ),
        "lacuna_metrics.masks": (
            "FORMAT_VERSION",
            "MAX_GROUPS",
            "MaskError",
            "MaskSet",
            "build_masks",
            "component",
            "load_masks",
            "mask_num_groups",
            "named_shapes_of",
            "save_masks",
            "stamp_masks",
        ),
        "lacuna_metrics.plots": (
            "heatmap",
            "pyplot",
        ),
        "lacuna_metrics.report": (
            "fmt",
            "markdown_summary",
            "update_warning",
        ),
        "lacuna_metrics.schemas": (
            "SCHEMAS",
            "read_schema",
            "schema_stamp",
        ),
        "lacuna_metrics.score": (
            "SCHEMA_VERSION",
            "default_cache_dir",
            "score_pair",
            "score_to_dir",
        ),
        "lacuna_metrics.weights.anatomy": (
            "MLP_NEURON_ROLES",
            "MLP_OUTPUT_ROLES",
            "Weight",
            "find_blocks",
            "is_linear_module",
            "is_transposed_module",
            "model_anatomy",
        ),
        "lacuna_metrics.weights.checkpoints": (
            "Checkpoint",
            "CheckpointError",
            "file_fingerprint",
        ),
        "lacuna_metrics.weights.fingerprints": ("file_digest", "tree_fingerprint"),
        "lacuna_metrics.weights.quantize": ("QUANT_BITS", "quantize_checkpoint"),
        "lacuna_metrics.weights.threads": ("configure_threads",),
    }.items()
    for name in names
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # lazy: importing the package imports none of its modules
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
