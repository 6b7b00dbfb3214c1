"""``lacuna run``: the whole benchmark as one declarative, cached pipeline.

Stages (each cached under ``OUT/stages/<kind>-<hash>/`` by the SHA-256 of its inputs, so a rerun redoes only
what changed): build (or reuse) the testbed; evaluate the model before unlearning with the lm-eval task pack;
per field and method: unlearn (``lacuna-unlearn`` config ``method=<name>`` + overrides), evaluate, score the
pair (``lacuna score``: best-of AUC, FRAG, L2), relearning attack with the extraction probe (``lacuna attack``),
evaluate the relearned model and classify the forgetting regime. Then ``results.json`` (schema
``lacuna-bench/run`` v1), ``report.md`` and ``plots/*.png`` in ``OUT``.

The default (``preset: mini``) is the README's first command: the mini testbed, the email field, GradDiff,
SimNPO, JensUn, RMU, FRP and OracleGrad.

This module assembles ``results.json``; the parts live one concept per module: the settings in
:mod:`~lacuna_unlearn.bench.run_config`, the stage cache and lock in :mod:`~lacuna_unlearn.bench.stages`, the evaluation
stage and behaviour metrics in :mod:`~lacuna_unlearn.bench.behaviour`, a method's stages in
:mod:`~lacuna_unlearn.bench.method_stages` and the reversibility protocol in :mod:`~lacuna_unlearn.bench.reversibility`.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lacuna_metrics import schema_stamp
from lacuna_tasks import NEUTRAL_HELDOUT_FILE, NEUTRAL_PPL_TASK
from lacuna_unlearn.bench.behaviour import behaviour, eval_stage
from lacuna_unlearn.bench.method_stages import controls, method_entry
from lacuna_unlearn.bench.metric_table import BEHAVIOUR_METRICS
from lacuna_unlearn.bench.reversibility import apply_controls
from lacuna_unlearn.bench.run_config import (  # noqa: F401  (re-exported: the pipeline's config)
    DEFAULT_RUN,
    POSITIVE_CONTROL,
    PRESETS,
    RELEARN_SOURCES,
    load_run_config,
    validate_run_config,
)
from lacuna_unlearn.bench.stages import Stages, locked, testbed_fingerprint, testbed_preset
from lacuna_unlearn.dataclass_config import path_override

__all__ = [
    "DEFAULT_RUN",
    "RUN_SCHEMA",
    "SEED_METRICS",
    "across_seeds",
    "controls_by_seed",
    "load_run_config",
    "pooled",
    "pooled_across_seeds",
    "run_benchmark",
]

RUN_SCHEMA = schema_stamp("run")

logger = logging.getLogger(__name__)


#: Numbers of a method entry summarised across seeds (dotted paths; ``auc.*`` expands to every target).
SEED_METRICS = (
    *(f"behaviour.{m}" for m in BEHAVIOUR_METRICS),
    "behaviour.neutral_ppl_ratio",
    "relearned_behaviour.forget_leak",
    "relearned_behaviour.retain_accuracy",
    "frag",
    "l2",
    "attack.success_at_n_unlearned",
    "attack.success_at_n_relearned",
    "regime.forget_gap",
    "regime.recovery_ratio",
)


def across_seeds(runs: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Mean ± sd (sample sd, ddof 1) of every number in :data:`SEED_METRICS` and of each target's ``best`` and
    ``raw`` AUC over the runs of one method with different unlearning seeds; ``values`` in seed order; the regime
    of each seed in ``regimes``."""
    from lacuna_metrics import mean_sd

    def get(entry: Mapping[str, Any], path: str) -> Any:
        node: Any = entry
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node.get("value") if isinstance(node, Mapping) else node  # an AUC's best: {value, score}

    first = next(iter(runs.values()))
    aucs = ("best", "raw", "calibrated_best", "best_lift")
    paths = [*SEED_METRICS, *(f"auc.{t}.{k}" for t in (first.get("auc") or {}) for k in aucs)]
    metrics: dict[str, Any] = {}
    for path in paths:
        values = [get(entry, path) for entry in runs.values()]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            metrics[path] = {**mean_sd(values), "values": values}
    regimes = [(entry.get("regime") or {}).get("regime") for entry in runs.values()]  # categorical: listed
    return {"seeds": list(runs), "metrics": metrics, "regimes": regimes}


#: Rates pooled over fields into one row per method (``results.json: pooled``).
POOLED_METRICS = ("forget_leak", "j_w", "retain_eval_accuracy", "crossfield_accuracy", "retain_accuracy")


#: What the other seeds' entries (``by_field.<field>.seed_entries``) leave out: the first seed's entry has them.
SLIM_DROPPED = ("per_layer", "precision_at_k", "trajectory", "localization_settings", "not_applicable")


def controls_by_seed(checks: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Per seed, what the controls showed and whether they let a regime be read: the positive control's share
    silenced and its forget leak after relearning (from the source its regime took), the negative control's leak
    before and after the same relearning, the verdict and its reason."""

    def recovered(positive: Mapping[str, Any]) -> Any:
        rev = positive.get("reversibility") or {}
        source = (rev.get("regime") or {}).get("source")
        return ((rev.get("sources") or {}).get(source) or {}).get("forget_leak")

    return {
        str(s): {
            "positive_passed": c["positive"]["attack_strong_enough"],
            "reason": c["positive"].get("reason"),
            "silenced": c["positive"]["silenced"],
            "positive_relearned_leak": recovered(c["positive"]),
            "negative_before_leak": c["negative"]["before"]["forget_leak"],
            "negative_relearned_leak": c["negative"]["relearned"]["forget_leak"],
        }
        for s, c in checks.items()
    }


def field_context(cfg: Mapping[str, Any], testbed: Path, tb_key: str, field: str) -> dict[str, Any]:
    """What every stage of one field reads: the testbed, its model before unlearning, its cache key, the data
    directory and the field's lm-eval task group (the run's ``eval.tasks`` suffixes, plus the neutral perplexity
    task where the testbed holds its held-out text)."""
    from lacuna_metrics import resolve_testbed

    layout = resolve_testbed(testbed)  # a lacuna-bench testbed or a LACUNA release regime directory
    data = layout.data or testbed / "data"  # a release without data is refused up front
    suffixes = cfg["eval"].get("tasks")
    group = [f"lacuna_{field}_{t}" for t in suffixes] if suffixes else [f"lacuna_{field}"]
    if cfg["eval"].get("neutral_ppl") and (data / NEUTRAL_HELDOUT_FILE).is_file():
        group.append(NEUTRAL_PPL_TASK)
    return {"testbed": testbed, "before": layout.before, "tb_key": tb_key, "data": data, "group": group}


def pooled(by_field: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One row per method over every field of a run: each rate of :data:`POOLED_METRICS` as the persons' total k of
    n over the fields (``n`` = people × fields), with its exact interval (:func:`lacuna_metrics.clopper_pearson`;
    ``clopper_pearson_fractional`` where a field's k is a sum of shares). A method or rate missing in any field is
    left out, never pooled over fewer fields."""
    from lacuna_metrics import clopper_pearson

    names = [n for n in next(iter(by_field.values()))["methods"] if all(n in e["methods"] for e in by_field.values())]
    out: dict[str, Any] = {}
    for name in names:
        row: dict[str, Any] = {}
        for metric in POOLED_METRICS:
            cis = [((e["methods"][name].get("behaviour") or {}).get("ci") or {}).get(metric) for e in by_field.values()]
            if not all(isinstance(ci, Mapping) and ci.get("n") for ci in cis):
                continue
            k, n = sum(float(ci["k"]) for ci in cis), sum(int(ci["n"]) for ci in cis)
            low, high = clopper_pearson(k, n)
            fractional = any(ci.get("method") == "clopper_pearson_fractional" for ci in cis)
            method = "clopper_pearson_fractional" if fractional else "clopper_pearson"
            row[metric] = {
                "value": k / n, "ci": {"low": low, "high": high, "k": k, "n": n, "level": 0.95, "method": method},
            }  # fmt: skip
        regimes = [(e["methods"][name].get("regime") or {}).get("regime") for e in by_field.values()]
        out[name] = {"fields": list(by_field), "rates": row, "regimes": regimes}
    return out


def pooled_across_seeds(runs: Mapping[str, Mapping[str, Mapping[int, Mapping[str, Any]]]]) -> dict[str, Any]:
    """Mean ± sd over unlearning seeds of each method's pooled rates (``runs``: field -> method -> seed -> entry):
    :func:`pooled` once per seed, then :func:`lacuna_metrics.mean_sd` of each rate's value, with the values and each
    seed's exact interval (``cis``) in seed order and the n behind each (people × fields, the same in every seed);
    the per-field regimes of each seed."""
    from lacuna_metrics import mean_sd

    fields = list(runs)
    seeds = list(next(iter(next(iter(runs.values())).values())))
    per_seed = {
        s: pooled({f: {"methods": {n: by_seed[s] for n, by_seed in runs[f].items()}} for f in fields}) for s in seeds
    }
    out: dict[str, Any] = {}
    for name, first in per_seed[seeds[0]].items():
        metrics: dict[str, Any] = {}
        for metric, rate in first["rates"].items():
            rates = [per_seed[s].get(name, {}).get("rates", {}).get(metric) for s in seeds]
            if all(rates):
                values = [r["value"] for r in rates]
                metrics[metric] = {
                    **mean_sd(values), "values": values, "people": rate["ci"]["n"],
                    "cis": [r["ci"] for r in rates],  # each seed's exact interval over its k of n
                }  # fmt: skip
        regimes = [per_seed[s].get(name, {}).get("regimes") for s in seeds]
        out[name] = {"seeds": seeds, "metrics": metrics, "regimes": regimes}
    return out


def preflight_overrides(cfg: Mapping[str, Any]) -> None:
    """Compose every method's and the attack's Hydra overrides and run the trainer's preflight on them, before any
    stage: a bad override (an unknown ``trainer.args`` key, a wrong type, an unknown method setting) is refused in a
    second, naming the method or ``attack.overrides``, instead of after the testbed and the evaluations ran."""
    import tempfile

    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lacuna_unlearn.trainer.app import EDITORS, preflight

    field = cfg["fields"][0]
    checks: dict[str, list[str]] = {}
    for name, extra in cfg["methods"].items():
        experiment = [f"experiment={cfg['experiment']}"] if cfg["experiment"] and name not in EDITORS else []
        checks[f"methods.{name}"] = [*experiment, f"method={name}", *list(extra or [])]
    if cfg["attack"]["enabled"]:
        checks["attack.overrides"] = [f"attack={cfg['attack']['protocol']}", *list(cfg["attack"]["overrides"] or [])]
    with tempfile.TemporaryDirectory(prefix="lacuna-preflight-") as tmp:
        for where, overrides in checks.items():
            try:
                with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
                    hcfg = compose(
                        config_name="unlearn",
                        overrides=[*overrides, f"field={field}", path_override("output_dir", f"{tmp}/out")],
                    )
                preflight(hcfg)
            except (HydraException, OmegaConfBaseException, ValueError, TypeError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ValueError(f"run config: {where}: {first}") from None


def run_benchmark(
    out_dir: str | os.PathLike[str],
    cfg: Mapping[str, Any] | None = None,
    *,
    log: Callable[[str], None] = logger.info,
    lacuna_root: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume from cache) the benchmark described by ``cfg`` into ``out_dir``; return ``results.json``.
    One run at a time per ``out_dir`` (a lock file). ``log`` receives one status line per stage (default: this
    module's logger at INFO, shown where :func:`lacuna_tasks.logs.configure_logging` set it up). ``lacuna_root``:
    also write LACUNA's files and the unlearned checkpoints in LACUNA's layout there (a release's regime
    directory, where its scripts look; they are always written under ``out_dir/lacuna/`` too)."""
    cfg = copy.deepcopy(dict(cfg or DEFAULT_RUN))
    validate_run_config(cfg)
    preflight_overrides(cfg)
    if cfg["testbed"]:
        from lacuna_metrics import mask_num_groups, resolve_testbed
        from lacuna_tasks import check_group_ids, load_data

        layout = resolve_testbed(cfg["testbed"])
        if layout.data is not None:
            loaded = load_data(layout.data)  # every stage reads it: bad data is refused before the first
            if layout.masks is not None and layout.masks.is_file():  # every person in a group of the masks
                check_group_ids(loaded.splits, loaded.files, mask_num_groups(layout.masks), str(layout.masks))
    with locked(Path(out_dir)):
        return _run_locked(Path(out_dir), cfg, log, Path(lacuna_root) if lacuna_root is not None else None)


def _run_locked(out: Path, cfg: dict[str, Any], log: Callable[[str], None], lacuna_root: Path | None) -> dict[str, Any]:
    from lacuna_metrics import build_manifest, publish_together, write_json
    from lacuna_unlearn.bench.report.lacuna_keys import run_lacuna_files
    from lacuna_unlearn.bench.report.markdown import write_run_report

    started = time.time()
    stages = Stages(out / "stages", log)
    seed = int(cfg["seed"])
    seeds = [int(s) for s in cfg["seeds"]] if cfg.get("seeds") else [seed]  # unlearning seeds; the first is reported

    # testbed
    if cfg["testbed"]:
        testbed = Path(cfg["testbed"])
        tb_key = testbed_fingerprint(testbed)
    else:
        from lacuna_unlearn.testbed.build import build_testbed
        from lacuna_unlearn.testbed.presets import get_preset

        # the preset's settings are part of the key: a changed preset rebuilds instead of reusing a stale testbed
        inputs = {"preset": cfg["preset"], "seed": cfg["testbed_seed"], "config": get_preset(cfg["preset"]).to_dict()}
        stage = stages.get(
            "testbed",
            f"testbed ({cfg['preset']})",
            inputs,
            lambda tmp: build_testbed(tmp / "testbed", preset=cfg["preset"], seed=cfg["testbed_seed"]),
        )
        testbed = stage / "testbed"
        tb_key = testbed_fingerprint(testbed)

    # the testbed's own preset: a given testbed need not be the one the config's `preset` would build
    results: dict[str, Any] = {"schema": RUN_SCHEMA, "preset": testbed_preset(testbed), "testbed": str(testbed)}
    by_field: dict[str, Any] = {}
    seed_runs: dict[str, dict[str, dict[int, Any]]] = {}  # field -> method -> seed -> entry, for the pooled seeds
    for field in cfg["fields"]:
        ctx = field_context(cfg, testbed, tb_key, field)
        data, before, group = ctx["data"], ctx["before"], ctx["group"]
        base_eval = eval_stage(stages, f"[{field}] evaluate before", before, {"testbed": tb_key}, group, data, cfg)
        base_behaviour = behaviour(base_eval[0], field, data, base_eval[1])
        field_out: dict[str, Any] = {"baseline": {"behaviour": base_behaviour}, "methods": {}}
        # the relearning attack's controls, in every seed: a regime is read only where they allow it
        with_controls = cfg["reversibility"]["enabled"] and cfg["reversibility"]["positive_control"]
        checks = (
            {s: controls(stages, cfg, ctx, field, s, field_out["baseline"]) for s in seeds} if with_controls else {}
        )
        for name, extra in cfg["methods"].items():
            runs = {
                s: method_entry(stages, cfg, ctx, field, name, list(extra or []), s, field_out["baseline"])
                for s in seeds
            }
            for s, run_entry in runs.items():
                if s in checks:
                    apply_controls(run_entry, checks[s]["positive"], checks[s]["negative"])
                baseline_auc = run_entry.pop("baseline_auc", None)
                if baseline_auc is not None:
                    results.setdefault("baseline_auc", baseline_auc)
            entry = runs[seeds[0]]
            if len(seeds) > 1:
                entry["across_seeds"] = across_seeds(runs)
            field_out["methods"][name] = entry
            seed_runs.setdefault(field, {})[name] = runs
            for s in seeds[1:]:  # the other seeds' entries, for lacuna meta's pool (docs/meta.md)
                slim = {k: v for k, v in runs[s].items() if k not in SLIM_DROPPED}
                field_out.setdefault("seed_entries", {}).setdefault(str(s), {})[name] = slim
        if checks:
            field_out["positive_control"] = checks[seeds[0]]["positive"]
            field_out["negative_control"] = checks[seeds[0]]["negative"]
            if len(seeds) > 1:
                field_out["controls_by_seed"] = controls_by_seed(checks)
        by_field[field] = field_out

    first = by_field[cfg["fields"][0]]
    if len(by_field) > 1:
        results["pooled"] = pooled(by_field)
        if len(seeds) > 1:
            for name, summary in pooled_across_seeds(seed_runs).items():
                results["pooled"][name]["across_seeds"] = summary
    results.update(
        {
            "field": cfg["fields"][0],
            "baseline": {**first["baseline"], "auc": results.pop("baseline_auc", None)},
            "methods": first["methods"],
            "by_field": by_field,
            "manifest": build_manifest(
                config=cfg,
                seed=seed,
                stage_seconds=stages.timings,
                wall_seconds=round(time.time() - started, 1),
            ),
        }
    )
    with publish_together(out) as staging:  # results.json, report.md and plots/ appear together
        write_run_report(staging, results)
        # the same results in LACUNA's names and layout, with the unlearned checkpoints (docs/release.md)
        run_lacuna_files(results, staging / "lacuna", models=True)
        write_json(staging / "results.json", results)
    if lacuna_root is not None:  # a LACUNA release: also where its own scripts look, <regime>/unlearned_models/
        run_lacuna_files(results, lacuna_root, models=True)
    return results
