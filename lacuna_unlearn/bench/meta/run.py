"""``lacuna meta``: which measurement predicts that forgetting lasts, over the pool of a ``lacuna run``
(docs/meta.md). Reads the run's ``results.json``, adds its own stages to the run's stage cache (noise controls,
relearned and quantized evaluations, diagnostics, faithfulness pools), and writes ``meta.json``, ``meta.md`` and
``plots/`` together."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.meta.pool import (
    HEADLINE_OUTCOME,
    NOISE_METHODS,
    OUTCOMES,
    PREDICTORS,
    PoolModel,
    pool_models,
    run_seeds,
)
from lacuna_unlearn.bench.meta.sources import (
    ExtraModel,
    check_points,
    other_points,
    read_checkpoints,
    unlearn_manifest,
)

__all__ = ["MetaSettings", "check_pool", "load_meta_preset", "run_meta"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetaSettings:
    """What ``lacuna meta`` computes beyond the run's own numbers (docs/meta.md)."""

    noise: bool = True  #: the noise controls (method-free updates at the pool's median L2) enter the pool
    diagnostics: bool = True  #: mean PCA distance, CKA and Fisher shift as predictors
    quantize_bits: tuple[int, ...] = (8, 4)  #: metric robustness under round-to-nearest quantization
    perturbations: int = 2  #: light perturbations of the testbed model in each faithfulness pool
    perturbation_size: float = 0.01  #: their relative L2 per tensor
    draws: int = 2000  #: bootstrap draws of every interval
    seed: int = 0  #: the bootstrap's seed
    top: float = 0.25  #: the share predicted most robust where a noise control must not appear
    #: the ρ table again over the models that forgot (forget leak at most this): leak after relearning then reads
    #: what came back, not what never left (docs/meta.md, "Among the models that forgot")
    forgot_leak: float = 0.1
    #: the stopping points of the first seed's methods in the pool (sources.POINTS): the chosen one always; ``end``
    #: adds the end of the schedule, ``snapshots`` every trajectory snapshot (each measured as a method is)
    points: tuple[str, ...] = ("chosen",)
    #: the outcome the scatter plots and the ranking chart are drawn for (pool.OUTCOMES; the tables have them all)
    headline: str = HEADLINE_OUTCOME

    def __post_init__(self) -> None:
        check_points(self.points, "meta.points")
        if self.headline not in OUTCOMES:
            raise ValueError(f"meta.headline: one of {', '.join(OUTCOMES)}, got {self.headline!r}")


def load_meta_preset(name: str, overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], MetaSettings]:
    """A meta preset (``lacuna_unlearn/presets/meta/<name>.yaml``): the run config of its ``run`` (a run preset
    and overrides, then ``overrides``, validated as ``lacuna run`` does) and its ``meta`` settings. Unknown keys
    are refused by name."""
    import yaml

    from lacuna_unlearn.bench.run import load_run_config
    from lacuna_unlearn.dataclass_config import preset_path

    path = preset_path("meta", name)
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(raw) - {"run", "meta"})
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} (expected run, meta)")
    run = raw.get("run") or {}
    cfg = load_run_config(
        preset=run.get("preset", "mini"), overrides={**(run.get("overrides") or {}), **dict(overrides or {})}
    )
    fields = {f.name for f in dataclasses.fields(MetaSettings)}
    meta = raw.get("meta") or {}
    bad = sorted(set(meta) - fields)
    if bad:
        raise ValueError(f"{path}: meta.{bad[0]}: unknown setting (expected one of {sorted(fields)})")
    for key in ("quantize_bits", "points"):
        if key in meta:
            meta[key] = tuple(meta[key])
    return cfg, MetaSettings(**meta)


def _load_results(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; lacuna meta reads a `lacuna run --out {run_dir}` directory")
    try:
        results = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    for key in ("by_field", "testbed", "manifest"):
        if key not in results:
            raise ValueError(f"{path}: no `{key}`: not a lacuna run's results.json")
    return results


def check_pool(models: Iterable[tuple[str, Path]], before: Path) -> None:
    """Every model of the pool (name, checkpoint directory) is a checkpoint of the run's testbed: its config names
    the testbed model's architecture (model type, layers, width, vocabulary). Refused in one line naming the first
    that is not."""
    keys = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")
    ref = json.loads((before / "config.json").read_text())
    for name, model in models:
        path = Path(model) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{name}: {path}: not found (the run's stage cache was cleared?)")
        try:
            cfg = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{name}: {path}: not JSON ({exc})") from None
        diff = [k for k in keys if cfg.get(k) != ref.get(k)]
        if diff:
            raise ValueError(
                f"{name}: {model} is not a checkpoint of the run's testbed ({before}): "
                + ", ".join(f"{k} {cfg.get(k)!r} vs {ref.get(k)!r}" for k in diff)
            )


def _extra_model(extra: ExtraModel, seed: int) -> PoolModel:
    """The pool row of a listed checkpoint or another stopping point, its entry filled by the stages later."""
    seed = seed if extra.seed is None else extra.seed
    return PoolModel(extra.field, extra.method, seed, {"model": str(extra.path)}, point=extra.point,
                     where=str(extra.path) if extra.point == "checkpoint" else None)  # fmt: skip


def _label(m: PoolModel) -> str:
    """A pool row's label in the stages' log: the method at its chosen point (as the run labels it), else the
    method and which checkpoint of it."""
    if m.point == "checkpoint":
        return f"{m.method} checkpoint {m.where}"
    return m.method if m.point == "chosen" else f"{m.method} at {m.point}"


def _norms(model: Path) -> tuple[float, float]:
    """(‖θ‖₂ over every floating tensor, ‖θ‖₂ over the method-free updates' scope: the blocks' linear weights)
    of the testbed's model, read one tensor at a time (float64 sums): a 7B model never sits in memory whole."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from lacuna_metrics import Checkpoint, linear_weight_names

    with torch.device("meta"):  # the module tree names the scope; no weights are allocated
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    scope = set(linear_weight_names(skeleton, "all").values())
    ckpt = Checkpoint(model)
    total = inside = 0.0
    for name in ckpt.names:  # tied aliases included, as in the model's state_dict
        square = float(ckpt.read(name).double().pow(2).sum())
        total += square
        inside += square if name in scope else 0.0
    return math.sqrt(total), math.sqrt(inside)


def _forgot(model: PoolModel, max_leak: float) -> bool:
    """The model's plain forget leak is known and at most ``max_leak``."""
    leak = model.predictors.get("forget_leak")
    return leak is not None and leak <= max_leak


def run_meta(
    run_dir: str | Path,
    out: str | Path | None = None,
    settings: MetaSettings | None = None,
    *,
    checkpoints: Sequence[str | Path] = (),
    log: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """The meta-evaluation of the run in ``run_dir`` (module docstring), written to ``out`` (default
    ``run_dir/meta``); returns ``meta.json``'s content. ``checkpoints``: more models for the pool
    (:func:`~lacuna_unlearn.bench.meta.sources.read_checkpoints`), measured with the run's settings."""
    from lacuna_metrics import build_manifest, publish_together, schema_stamp, write_json
    from lacuna_unlearn.bench.meta import analysis
    from lacuna_unlearn.bench.meta import stages as meta_stages
    from lacuna_unlearn.bench.meta.report import write_meta_report
    from lacuna_unlearn.bench.method_stages import checkpoint_entry
    from lacuna_unlearn.bench.run import field_context
    from lacuna_unlearn.bench.stages import Stages, locked, testbed_fingerprint

    settings = settings or MetaSettings()
    run_dir = Path(run_dir)
    out_dir = Path(out) if out is not None else run_dir / "meta"
    results = _load_results(run_dir)
    cfg = results["manifest"]["config"]
    testbed = Path(results["testbed"])
    pool = pool_models(results)
    fields = list(results["by_field"])
    listed, skipped = read_checkpoints(checkpoints, fields) if checkpoints else ([], [])
    first_seed = run_seeds(results)[0]
    extras = [_extra_model(x, first_seed) for x in listed]
    for m in [m for m in pool if m.seed == first_seed]:  # other stopping points: the first seed's methods
        extras += [
            _extra_model(x, first_seed) for x in other_points(m.entry, m.method, m.field, m.seed, settings.points)
        ]
    if not pool and not extras:
        raise ValueError(
            f"{run_dir / 'results.json'}: no unlearned model in the run (methods: {{}}) and no --checkpoints"
        )
    started = time.time()
    with locked(run_dir):
        tb_key = testbed_fingerprint(testbed)
        before = Path(field_context(cfg, testbed, tb_key, fields[0])["before"])
        check_pool([(m.name, Path(m.model)) for m in pool + extras], before)  # before any stage runs
        theta, theta_scope = _norms(before)
        stages = Stages(run_dir / "stages", log)
        robust_models: list[dict[str, Any]] = []
        faith_pools: dict[str, list[dict[str, Any]]] = {"knows": [], "never_learned": []}
        noise_sizes: dict[str, Any] = {}
        keys: dict[str, str] = {}  # a listed checkpoint's or snapshot's content key, hashed once
        for field in fields:
            ctx = field_context(cfg, testbed, tb_key, field)
            baseline = results["by_field"][field]["baseline"]
            people = int(((baseline.get("behaviour") or {}).get("n") or {}).get("forget_leak") or 1)
            for m in [m for m in extras if m.field == field]:
                path = Path(m.model)
                keys[m.model] = meta_stages.model_key(ctx, path)  # a content hash of the weights: once per model
                m.entry = checkpoint_entry(
                    stages, cfg, ctx, field, _label(m), path, keys[m.model], m.seed, baseline, unlearn_manifest(path)
                )
                m.read()
                pool.append(m)
            if settings.noise:
                # the noise's size: the methods' at their chosen points (or the listed checkpoints')
                l2s = [
                    m.predictors["l2"]
                    for m in pool
                    if m.field == field and m.point in ("chosen", "checkpoint") and not m.noise
                    and m.predictors.get("l2") is not None
                ]  # fmt: skip
                if l2s:
                    # a relative size per tensor whose global L2 over the scope is the median method's L2
                    size = statistics.median(l2s) / theta_scope
                    noise_sizes[field] = {"median_method_l2": statistics.median(l2s), "relative_size": size}
                    for method in NOISE_METHODS:
                        entry = meta_stages.noise_control(stages, cfg, ctx, field, method, size, first_seed, baseline)
                        model = PoolModel(field, method, first_seed, entry, noise=True)
                        model.read()
                        noise_sizes[field][f"{method}_l2"] = model.predictors.get("l2")
                        pool.append(model)
            reference = meta_stages.reference_relearning(stages, cfg, ctx, field, first_seed, people)
            for m in [m for m in pool if m.field == field and m.seed == first_seed]:
                model = Path(m.model)
                label = _label(m)
                key = keys.get(m.model) or meta_stages.model_key(ctx, model)
                if m.predictors.get("l2") is not None:
                    m.predictors["relative_l2"] = m.predictors["l2"] / theta
                if settings.diagnostics:
                    m.predictors.update(meta_stages.diagnostics(stages, ctx, field, label, model, key))
                entry = {
                    "model": m.name,
                    "before": {k: (m.entry.get("behaviour") or {}).get(k) for k in meta_stages.FORGET_SIDE},
                    "relearned": meta_stages.relearned_behaviour(stages, cfg, ctx, field, label, model, key, m.seed),
                    "reference": reference,
                    "quantized": {
                        b: meta_stages.quantized_behaviour(stages, cfg, ctx, field, label, model, key, b)
                        for b in settings.quantize_bits
                    },
                    "noise": m.noise,
                }
                robust_models.append(entry)
            pools = meta_stages.knows_and_never_learned(
                stages, cfg, ctx, field, first_seed, people, settings.perturbations, settings.perturbation_size
            )
            for k in faith_pools:
                faith_pools[k].extend(pools[k])

        kw = {"draws": settings.draws, "seed": settings.seed}
        meta: dict[str, Any] = {
            "schema": schema_stamp("meta"),
            "run": str(run_dir),
            "testbed": str(testbed),
            "settings": asdict(settings),
            "pool": {
                "models": len(pool),
                "methods": sorted({m.method for m in pool}),
                "fields": fields,
                "seeds": sorted({m.seed for m in pool}),
                "noise_controls": [m.name for m in pool if m.noise],
                "noise_sizes": noise_sizes,
                "points": list(settings.points),
                "checkpoints": [
                    {"path": str(x.path), "method": x.method, "field": x.field, "listed_in": x.origin} for x in listed
                ],
                "skipped": skipped,
                "rows": [
                    {
                        "model": m.name,
                        "method": m.method,
                        "field": m.field,
                        "seed": m.seed,
                        "point": m.point,
                        "noise": m.noise,
                        "predictors": m.predictors,
                        "outcomes": m.outcomes,
                    }  # fmt: skip
                    for m in pool
                ],
            },
            "predictors": {p: d for p, (_, d) in PREDICTORS.items()}
            | {
                "relative_l2": "L2 of the update over ‖θ_before‖ (all floating tensors)",
                "mean_pca_distance": "mean PCA distance over the transformer layers (Unlearning Isn't Deletion)",
                "cka": "mean linear CKA over the transformer layers (lower: representations moved more)",
                "fisher_shift": "mean over layers of |Δ log10 mean Fisher| against the testbed model",
            },
            "outcomes": {o: d for o, (_, d) in OUTCOMES.items()},
            "correlation": analysis.correlations(pool, top=settings.top, **kw),
            "correlation_forgot": {
                "max_forget_leak": settings.forgot_leak,
                "models": len(forgot := [m for m in pool if _forgot(m, settings.forgot_leak)]),
                "noise_controls": sum(m.noise for m in forgot),
                "rho": analysis.correlations(forgot, top=settings.top, **kw) if forgot else {},
            },
            "faithfulness": {
                "pools": {k: len(v) for k, v in faith_pools.items()},
                "knows": "the testbed model and its light perturbations on their forget people",
                "never_learned": "the same models on people none of them saw (the negative control's people)",
                "metrics": analysis.faithfulness(faith_pools, meta_stages.FORGET_SIDE, **kw),
            },
            "robustness": {
                "models": len(robust_models),
                "reference": "the testbed model on the negative control's people, relearned on the same budget",
                **analysis.robustness(robust_models, meta_stages.FORGET_SIDE, settings.quantize_bits, **kw),
            },
        }
        meta["manifest"] = build_manifest(
            config={"meta": asdict(settings), "run": cfg},
            seed=settings.seed,
            stage_seconds=stages.timings,
            wall_seconds=round(time.time() - started, 1),
        )
        with publish_together(out_dir) as staging:
            write_meta_report(staging, meta)
            write_json(staging / "meta.json", meta)
    return meta
