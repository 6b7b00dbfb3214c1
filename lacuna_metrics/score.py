"""``score_pair``: everything the weight-diff sidecar knows about one before/after checkpoint pair.

One streaming walk over the checkpoints (:class:`lacuna_metrics.weights.pair_walk.PairWalk`) feeds three consumers:
localization AUCs against the ground-truth masks (:mod:`lacuna_metrics.localization.precision`), FRAG
(:mod:`lacuna_metrics.frag.alignment`, with activation statistics of the before-model cached on disk) and distances
(:mod:`lacuna_metrics.frag.distance`). The result is one JSON-ready dict with a versioned schema
(documented in the README, "Score JSON"); ``lacuna score`` writes it with a markdown summary and plots.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.localization.null_calibration import (
    DEFAULT_DRAWS,
    DEFAULT_MIN_LIFT,
    DEFAULT_NULL_SAMPLES,
    DEFAULT_TOLERANCE,
    DEFAULT_Z,
    calibrate_sample,
    check_settings,
)
from lacuna_metrics.localization.precision import Localization, LocalizationConfig
from lacuna_metrics.manifest import build_manifest
from lacuna_metrics.masks import MaskError, MaskReader
from lacuna_metrics.masks.files import Verification
from lacuna_metrics.schemas import SCHEMAS
from lacuna_metrics.weights.checkpoints import Checkpoint, check_compatible
from lacuna_metrics.weights.pair_walk import PairHook, PairWalk
from lacuna_tasks import progress as progress_bar

__all__ = ["SCHEMA", "SCHEMA_VERSION", "default_cache_dir", "score_pair", "score_to_dir"]

#: score.json's schema name and version (lacuna_metrics.schemas.SCHEMAS). Version 2: every input names its
#: checkpoint by resolved path and content fingerprint (Checkpoint.fingerprint), ``manifest.masks`` is
#: ``{path, fingerprint}``; version 1 fingerprints hashed only the first/last MiB.
SCHEMA, SCHEMA_VERSION = SCHEMAS["score"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def default_cache_dir() -> Path:
    """Where activation statistics are cached: ``$LACUNA_CACHE`` or ``~/.cache/lacuna-bench``."""
    return Path(os.environ.get("LACUNA_CACHE", Path.home() / ".cache" / "lacuna-bench")) / "activations"


def _testbed_defaults(testbed: Path, after: Path) -> dict[str, Path | None]:
    """A testbed's parts by role (either layout, lacuna_metrics.layout); on the LACUNA release also its unmasked
    control, when ``after`` has a twin under ``unmasked/unlearned_models/`` (docs/release.md)."""
    from lacuna_metrics.layout import resolve_testbed

    layout = resolve_testbed(testbed)
    defaults: dict[str, Path | None] = {
        "before": layout.before,
        "masks": layout.masks,
        "base": layout.base,
        "data": layout.data,
    }
    twin = layout.control_after_for(after) if layout.is_release else None
    if twin is not None and layout.control_before is not None:
        defaults["control_before"], defaults["control_after"] = layout.control_before, twin
    return defaults


def score_pair(
    after: PathLike,
    *,
    before: PathLike | None = None,
    masks: PathLike | None = None,
    testbed: PathLike | None = None,
    base: PathLike | None = None,
    control_before: PathLike | None = None,
    control_after: PathLike | None = None,
    crossfield: Sequence[PathLike] = (),
    calib_forget: PathLike | None = None,
    calib_retain: PathLike | None = None,
    calib_fields: Sequence[str] | None = None,
    calib_retain_fields: Sequence[str] | None = None,
    frag: bool = True,
    localize: bool = True,
    gamma: float = 1.0,
    frag_target: str = "all",
    frag_min_coverage: float | None = None,
    calib_samples: int = 128,
    calib_max_length: int = 256,
    activation_dtype: str = "bfloat16",
    cache_dir: PathLike | None = None,
    config: LocalizationConfig | None = None,
    null: bool = True,
    null_tolerance: float = DEFAULT_TOLERANCE,
    null_z: float = DEFAULT_Z,
    null_min_lift: float = DEFAULT_MIN_LIFT,
    null_draws: int = DEFAULT_DRAWS,
    null_samples: int = DEFAULT_NULL_SAMPLES,
    progress: bool = True,
    allow_mask_mismatch: bool = False,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Score ``after`` against ``before`` (and masks, base, control, per-field runs when given).

    With ``testbed``, ``before`` / ``masks`` / ``base`` and the FRAG calibration text (the testbed's
    forget and retain splits) default to the testbed's ``model/``, ``masks.safetensors``, ``base/``
    and ``data/``. Without masks (or with ``localize=False``) the localization section is ``None``;
    without calibration text (or with ``frag=False``) FRAG is.

    ``calib_fields`` (field keys like ``email`` or PANORAMA columns; None = every field): FRAG's forget
    calibration rows are those fields' rows only, as are its retain rows unless ``calib_retain_fields`` names
    others, so FRAG measures the forget set a run actually unlearned (docs/scoring.md, "FRAG calibration
    fields"); ``calib_retain_fields="all"`` keeps every field's retain rows. ``frag.calibration`` in the result
    records the fields and the row counts of each side.

    Masks that record the fingerprint of the model they were built for must match ``before``'s (else
    MaskError naming both, unless ``allow_mask_mismatch``); masks without one (a released ``mask.pt``) are
    scored with a warning (``warn``, default: this module's logger). ``manifest.masks_model`` says which.
    """
    started = time.time()
    if null:
        check_settings(
            null_tolerance, null_z, null_min_lift, null_draws, null_samples,
            names={k: f"--null-{k.replace('_', '-')}" for k in ("tolerance", "z", "min_lift", "draws", "samples")},
        )  # fmt: skip
    defaults: dict[str, Path | None] = {}
    if testbed is not None:
        defaults = _testbed_defaults(Path(testbed), Path(after))
    before = before or defaults.get("before")
    if before is None:
        raise ValueError("give --before (or --testbed) for the checkpoint before unlearning")
    masks = (masks or defaults.get("masks")) if localize else None
    base = base or defaults.get("base")
    if control_before is None and control_after is None:
        control_before, control_after = defaults.get("control_before"), defaults.get("control_after")
    if (control_before is None) != (control_after is None):
        raise ValueError("give both --control-before and --control-after, or neither")
    data = defaults.get("data")
    forget_source = calib_forget or data
    retain_source = calib_retain or data

    ckpts: dict[str, Checkpoint] = {"before": Checkpoint(before), "after": Checkpoint(after)}
    if base is not None:
        ckpts["base"] = Checkpoint(base)
    if control_before is not None and control_after is not None:
        ckpts["control_before"], ckpts["control_after"] = Checkpoint(control_before), Checkpoint(control_after)
    for i, path in enumerate(crossfield):
        ckpts[f"crossfield{i}"] = Checkpoint(path)
    check_compatible(ckpts)
    will_frag = frag and forget_source is not None and retain_source is not None
    if will_frag:
        from lacuna_metrics.frag.activations import calibration_fields, calibration_texts, frag_preflight

        forget_fields = calibration_fields(calib_fields)
        retain_fields = calibration_fields(calib_retain_fields) if calib_retain_fields is not None else forget_fields
        frag_preflight(ckpts["before"].path, frag_target)  # header-only: fails before any hashing or forward pass
        # the calibration data is read (and validated) before any hashing too
        texts = (
            calibration_texts(forget_source, "forget", calib_samples, fields=forget_fields),
            calibration_texts(retain_source, "retain", calib_samples, fields=retain_fields),
        )
        calibration = _calibration_record(
            forget_source, retain_source, forget_fields, retain_fields, texts, calib_samples
        )
    mask_reader: MaskReader | None = None
    verification: Verification | None = None
    if masks is not None:  # the mask file's header, its names and shapes: before any hashing
        mask_reader = MaskReader(masks)
        mask_reader.check_model(ckpts["before"].names, ckpts["before"].shape, str(ckpts["before"].path))
        # every bit and the file's fingerprint: beside the hashing and the walk, which stops at a stray bit
        verification = mask_reader.verify_in_background()
    config = config or LocalizationConfig()
    # the one walk over the pair: distances, FRAG and localization consume each block as it is read
    walk = PairWalk(ckpts["before"], ckpts["after"], block_elems=config.block_elems, threads=config.threads)
    if verification is not None:
        walk.add_guard(verification.check)
    # Name what is scored: resolved path and content fingerprint of every input. The pair's fingerprints are
    # hashed from the walk's own reads, except before's when it is needed first: the masks name their model (that
    # check comes before any scoring) or FRAG keys its activation cache by it (activation_stats reuses the hash).
    check_first = mask_reader is not None and mask_reader.model_fingerprint is not None
    walk.stream_fingerprints(("after",) if check_first or will_frag else ("before", "after"))
    fingerprints = {label: c.fingerprint() for label, c in ckpts.items() if label not in walk.streamed}

    def named(label: str) -> dict[str, str]:
        return {"path": str(ckpts[label].path.resolve()), "fingerprint": fingerprints[label]}

    masks_model = None
    if mask_reader is not None and check_first:
        masks_model = _masks_model(mask_reader, named("before"), allow_mask_mismatch, warn)

    from lacuna_metrics.frag.distance import DistanceAccumulator

    distance = DistanceAccumulator()
    walk.add_hook(distance.add)
    frag_acc, frag_section, stats = None, None, None
    if will_frag:
        from lacuna_metrics.frag.activations import activation_stats
        from lacuna_metrics.frag.alignment import FragAccumulator

        stats = activation_stats(
            ckpts["before"].path,
            *texts,
            cache_dir=Path(cache_dir) if cache_dir is not None else default_cache_dir(),
            target=frag_target,
            max_length=calib_max_length,
            dtype=getattr(torch, activation_dtype),
            calib_fields=forget_fields,
            calib_retain_fields=retain_fields,
            checkpoint=ckpts["before"],
        )
        coverage_kw = {} if frag_min_coverage is None else {"min_coverage": frag_min_coverage}
        frag_acc = FragAccumulator(
            stats.forget,
            stats.retain,
            gamma=gamma,
            conv1d_transposed=tuple(stats.conv1d_transposed),
            coverage=stats.coverage,
            **coverage_kw,
        )
    elif frag:
        frag_section = {"skipped": "no calibration text: give --calib-forget/--calib-retain or --testbed"}

    if frag_acc is not None:
        walk.add_hook(_only(set(frag_acc.names), frag_acc.add))

    total = sum(ckpts["before"].info(n).numel for n in ckpts["before"].names if not ckpts["before"].is_alias(n))
    quiet = {} if progress else {"disable": True}
    with progress_bar(total=total, unit="param", unit_scale=True, desc="scoring", **quiet) as bar:
        walk.add_progress(bar.update)
        if mask_reader is not None:
            localization = Localization(
                ckpts["before"],
                ckpts["after"],
                mask_reader,
                base=ckpts.get("base"),
                control=(ckpts["control_before"], ckpts["control_after"]) if "control_before" in ckpts else None,
                crossfield=[ckpts[k] for k in ckpts if k.startswith("crossfield")],
                config=config,
                walk=walk,
                null_samples=null_samples if null else 0,
            )
            loc = localization.run()
            timings: dict[str, float] | None = localization.timings
        else:
            loc = timings = None
            walk.run()

    fingerprints.update({label: walk.fingerprint(label) for label in walk.streamed})
    inputs = {label: named(label) for label in ckpts}
    masks_id = None
    if verification is not None:
        masks_id = {"path": str(Path(masks).resolve()), "fingerprint": verification.result()}
    if mask_reader is not None and not check_first:
        masks_model = _masks_model(mask_reader, inputs["before"], allow_mask_mismatch, warn)
    null_section = None
    if loc is not None and null:
        null_section, null_seconds = calibrate_sample(
            loc["auc"],
            localization.null_sample(),
            families=[s for s in localization.scores if s != "crossfield"],
            composite=localization.composite_features(),
            draws=null_draws,
            seed=config.seed,
            tolerance=null_tolerance,
            z=null_z,
            min_lift=null_min_lift,
            threads=config.threads,
            ties=config.qtile_ties,
            folds=config.composite_folds,
        )
        if timings is not None:
            timings = {**timings, "null_seconds": null_seconds}
    if frag_acc is not None:
        frag_section = frag_acc.result()
        assert stats is not None
        frag_section.update({"activation_fingerprint": stats.fingerprint, "activation_cache_hit": stats.cached})
        frag_section["calibration"] = calibration
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "auc": loc["auc"] if loc else None,
        "auc_error_bound": loc["auc_error_bound"] if loc else None,
        "precision_at_k": loc["precision_at_k"] if loc else None,
        "baselines": loc["baselines"] if loc else None,
        "not_applicable": loc["not_applicable"] if loc else {"localization": "needs --masks (or --testbed)"},
        "composite": loc["composite"] if loc else None,
        "per_layer": loc["per_layer"] if loc else [],
        "universe": loc["universe"] if loc else None,
        "frag": frag_section,
        "distance": distance.result(),
        "roc": loc["roc"] if loc else None,
        "null_calibration": null_section,
        "localization_settings": loc["settings"] if loc else None,
    }
    result["manifest"] = build_manifest(
        inputs=inputs,
        masks=masks_id,
        masks_model=masks_model,
        testbed=str(Path(testbed).resolve()) if testbed is not None else None,
        calibration={
            "forget": str(forget_source),
            "retain": str(retain_source),
            "samples": calib_samples,
            "forget_fields": calibration["forget"]["fields"],
            "retain_fields": calibration["retain"]["fields"],
        }
        if frag_acc is not None
        else None,
        config=_config_dict(config),
        seed=config.seed,
        gamma=gamma,
    )
    result["manifest"].update(wall_seconds=round(time.time() - started, 3), localization_timings=timings)
    return result


def _only(names: set[str], hook: PairHook) -> PairHook:
    """``hook`` for the blocks of ``names`` only."""

    def filtered(name: str, o: torch.Tensor, u: torch.Tensor) -> None:
        if name in names:
            hook(name, o, u)

    return filtered


def _calibration_record(
    forget_source: PathLike,
    retain_source: PathLike,
    forget_fields: list[str] | None,
    retain_fields: list[str] | None,
    texts: tuple[list[str], list[str]],
    samples: int,
) -> dict[str, Any]:
    """``frag.calibration`` of score.json: per side the source, split, fields (``all``: not restricted) and rows
    used, and whether the forget side is restricted to the unlearned field(s) as issue 20 (item 6) asks."""
    out: dict[str, Any] = {}
    for side, source, fields, side_texts in (
        ("forget", forget_source, forget_fields, texts[0]),
        ("retain", retain_source, retain_fields, texts[1]),
    ):
        out[side] = {
            "source": str(source),
            "split": None if Path(source).is_file() else side,
            "fields": "all" if fields is None else list(fields),
            "rows": len(side_texts),
        }
    out["samples"] = samples
    out["restricted_to_unlearned_fields"] = forget_fields is not None
    out["note"] = (
        "forget rows of the unlearned field(s) and retain rows of the retained field(s) only (docs/scoring.md, "
        "'FRAG calibration fields')"
        if forget_fields is not None
        else "the first rows of every field: not restricted to the field(s) a run unlearned (give calib_fields / "
        "--calib-fields; docs/scoring.md, 'FRAG calibration fields')"
    )
    return out


def _masks_model(
    reader: MaskReader, before: dict[str, str], allow_mismatch: bool, warn: Callable[[str], None] | None
) -> dict[str, Any]:
    """Tie the masks to ``before`` by the model fingerprint they record: ``status`` ``verified`` (equal),
    ``unverified`` (the file records none: a released ``mask.pt`` or a user's own file; warned), or
    ``mismatch_allowed`` (different, accepted by ``allow_mismatch``; warned). A mismatch is refused otherwise."""
    say = warn or logger.warning
    recorded = reader.model_fingerprint
    if recorded is None:
        status = "unverified"
        say(f"{reader.path} records no model fingerprint: it cannot be tied to --before {before['path']}")
    elif recorded == before["fingerprint"]:
        status = "verified"
    elif allow_mismatch:
        status = "mismatch_allowed"
        say(f"{reader.path} was built for model {recorded}, not --before ({before['fingerprint']}); scored anyway")
    else:
        raise MaskError(
            f"{reader.path} was built for the model with fingerprint {recorded}, but --before {before['path']} has "
            f"{before['fingerprint']}: masks of another model (--allow-mask-mismatch to score anyway)"
        )
    return {"fingerprint": recorded, "status": status}


def score_to_dir(out: PathLike, *, plots: bool = False, **kwargs: Any) -> Path:
    """Run :func:`score_pair` and write ``score.json``, ``score.md`` (and ``plots/*.png``) into ``out``.

    The files appear together (:func:`lacuna_metrics.manifest.publish_together`); nothing is written when
    scoring or any of the writers fails.
    """
    from lacuna_metrics.manifest import exclusive_writer, publish_together, write_json, write_text
    from lacuna_metrics.plots import PLOT_FILES, write_plots
    from lacuna_metrics.report import markdown_summary

    out = Path(out)
    with exclusive_writer(out, "lacuna score"):  # a second score into OUT would interleave its files with ours
        result = score_pair(**kwargs)
        with publish_together(out) as staging:
            if plots:
                write_plots(result, staging / "plots")
            write_text(staging / "score.md", markdown_summary(result))
            write_json(staging / "score.json", result)
        if not plots:  # an earlier score's figures would stand beside this score.json as if they were its own
            for name in PLOT_FILES:
                (out / "plots" / name).unlink(missing_ok=True)
    return out


def _config_dict(config: LocalizationConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(config)
