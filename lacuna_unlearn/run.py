"""``lacuna run``: the whole benchmark as one declarative, cached pipeline.

Stages (each cached under ``OUT/stages/<kind>-<hash>/`` by the SHA-256 of its inputs, so a rerun redoes only
what changed): build (or reuse) the testbed; evaluate the model before unlearning with the lm-eval task pack;
per field and method: unlearn (``lacuna-unlearn`` config ``method=<name>`` + overrides), evaluate, score the
pair (``lacuna score``: best-of AUC, FRAG, L2), relearning attack with the extraction probe (``lacuna attack``),
evaluate the relearned model and classify the forgetting regime. Then ``results.json`` (schema
``lacuna-bench/run`` v1), ``report.md`` and ``plots/*.png`` in ``OUT``.

The default (``preset: mini``) is the README's first command: the mini testbed, the email field, GradDiff,
SimNPO, JensUn, RMU, FRP and OracleGrad.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lacuna_tasks.schema import NEUTRAL_HELDOUT_FILE, NEUTRAL_PPL_TASK
from lacuna_unlearn.publish import building
from lacuna_unlearn.run_config import (  # noqa: F401  (re-exported: the pipeline's config)
    DEFAULT_RUN,
    POSITIVE_CONTROL,
    PRESETS,
    RELEARN_SOURCES,
    load_run_config,
    validate_run_config,
)

__all__ = ["DEFAULT_RUN", "RUN_SCHEMA", "load_run_config", "run_benchmark"]

RUN_SCHEMA = {"name": "lacuna-bench/run", "version": 1}

# --------------------------------------------------------------------------- stage cache


def _key(inputs: Mapping[str, Any]) -> str:
    """A stage's cache key: its inputs and the package version (a new release recomputes, never reuses)."""
    from lacuna_metrics.manifest import package_versions

    version = package_versions(("lacuna-bench",)).get("lacuna-bench")
    payload = json.dumps({"lacuna-bench": version, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``OUT/.lock`` for the run: a second ``lacuna run`` into the same ``--out`` fails at once instead of
    racing the first one's stages."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise FileExistsError(
                f"{out}: another lacuna run is writing here (pid {holder}); use another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Stages:
    """Content-addressed stage directories: ``build(tmp_dir)`` runs only if the key's directory is missing."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root, self.log, self.timings = root, log, {}
        root.mkdir(parents=True, exist_ok=True)

    def get(self, kind: str, label: str, inputs: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
        key = _key({"kind": kind, **inputs})
        final = self.root / f"{kind}-{key}"
        if (final / "stage.json").is_file():
            self.log(f"{label}: cached ({final.name})")
            self.timings[label] = 0.0
            return final
        started = time.time()
        self.log(f"{label}: running ...")
        with building(final) as partial:
            build(partial)
            (partial / "stage.json").write_text(json.dumps({"kind": kind, "inputs": inputs}, indent=2, default=str))
        self.timings[label] = round(time.time() - started, 1)
        self.log(f"{label}: done in {self.timings[label]:.0f} s")
        return final


# --------------------------------------------------------------------------- the pipeline


def _testbed_fingerprint(testbed: Path) -> str:
    manifest = testbed / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{testbed}: not a testbed (no manifest.json)")
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]


#: Behaviour metric -> (task suffix, lm-eval metric) of ``lacuna_<field>_<suffix>``.
BEHAVIOUR_METRICS: dict[str, tuple[str, str]] = {
    "forget_leak": ("forget_qa", "leak_rate"),
    "retain_accuracy": ("retain_qa", "accuracy"),
    "j_w": ("forget_worstcase", "j_w"),
    "j_p": ("forget_worstcase", "j_p"),
    "j_icr": ("forget_worstcase", "j_icr"),
    "retain_j_avg": ("retain_paraphrase", "j_avg"),
    "retain_eval_accuracy": ("retain_eval_qa", "accuracy"),  # held-out people no unlearning loss saw
    "crossfield_accuracy": ("crossfield_qa", "accuracy"),  # the forget people's other three fields
    "retain_eval_crossfield_accuracy": ("retain_eval_crossfield_qa", "accuracy"),
    "em": ("forget_memorization", "em"),
    "es": ("forget_memorization", "es"),
    "prob": ("forget_memorization", "prob"),
}


def _behaviour(
    results: Mapping[str, Mapping[str, float]],
    field: str,
    data: Path | None = None,
    persons: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
    *,
    seed: int = 0,
) -> dict[str, Any]:
    """The run's behavioural metrics of one evaluation, with ``n`` (persons behind each metric) and, given the
    evaluation's per-person values ``persons`` (task -> metric -> person -> value), ``ci``: a 95% percentile
    bootstrap interval over persons (lacuna_metrics.intervals). ``n`` counts the persons the metric observed when
    ``persons`` is given, else the forget or retain people of ``field`` in ``data`` (lm-eval's ``n-samples``
    counts documents, not persons). ``n`` and ``ci`` are None where the task did not run."""
    from lacuna_metrics.intervals import bootstrap_interval

    out: dict[str, Any] = {
        name: results.get(f"lacuna_{field}_{task}", {}).get(metric)
        for name, (task, metric) in BEHAVIOUR_METRICS.items()
    }
    # word perplexity on the testbed's held-out neutral prose (lacuna_neutral_ppl, docs/tasks.md); not per person
    out["neutral_word_perplexity"] = results.get(NEUTRAL_PPL_TASK, {}).get("word_perplexity")
    n: dict[str, int | None] = {}
    if persons is not None:
        ci: dict[str, list[float] | None] = {}
        for name, (task, metric) in BEHAVIOUR_METRICS.items():
            values = persons.get(f"lacuna_{field}_{task}", {}).get(metric)
            ci[name] = bootstrap_interval(values, seed=seed) if values and out[name] is not None else None
            n[name] = len(values) if values and out[name] is not None else None
        out["n"], out["ci"] = n, ci
    elif data is not None:
        from lacuna_tasks.loader import load_data

        loaded = load_data(data)  # cached per path: one read per run
        split_people: dict[str, int] = {}  # side: distinct people of the field in that split
        for name in BEHAVIOUR_METRICS:
            side = "retain" if name.startswith("retain") else "forget"
            if name.endswith("eval_accuracy") or "crossfield" in name:  # counted from persons.json only
                n[name] = None
                continue
            if out[name] is not None and side not in split_people:
                split_people[side] = len({row["ID"] for row in loaded.rows(side, field)})
            n[name] = None if out[name] is None else split_people[side]
        out["n"] = n
    return out


def _eval_stage(
    stages: _Stages, label: str, model: Path, key: Mapping[str, Any], tasks: list[str], data: Path, cfg
) -> tuple[dict[str, Any], dict[str, Any]]:
    """lm-eval results of ``model`` (task -> metric -> value) and per-person values (task -> metric -> person ->
    value, from the logged samples), cached as one stage."""
    from lacuna_metrics.intervals import per_person_values
    from lacuna_tasks.evaluate import evaluate

    def build(tmp: Path) -> None:
        out = evaluate(model, tasks, data=data, batch_size=int(cfg["eval"]["batch_size"]))
        persons = {
            task: {metric: per_person_values(out["samples"].get(task, []), metric) for metric in metrics}
            for task, metrics in out["results"].items()
            if task != NEUTRAL_PPL_TASK  # documents, not persons
        }
        (tmp / "results.json").write_text(json.dumps(out["results"], indent=2))
        (tmp / "persons.json").write_text(json.dumps(persons, indent=1, sort_keys=True))

    stage = stages.get("eval", label, {**key, "tasks": tasks, "persons": 1}, build)
    return json.loads((stage / "results.json").read_text()), json.loads((stage / "persons.json").read_text())


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
    "regime.recovery_ratio",
)


def across_seeds(runs: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Mean ± sd (sample sd, ddof 1) of every number in :data:`SEED_METRICS` and of each target's ``best`` and
    ``raw`` AUC over the runs of one method with different unlearning seeds; ``values`` in seed order; the regime
    of each seed in ``regimes``."""
    from lacuna_metrics.intervals import mean_sd

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


def _method_entry(
    stages: _Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    name: str,
    extra: list[str],
    seed: int,
    baseline: Mapping[str, Any],
    *,
    label: str | None = None,
    control: bool = False,
) -> dict[str, Any]:
    """One method on one field with one unlearning seed: unlearn, evaluate, score, attack, regime (each a cached
    stage). ``ctx`` carries the run's testbed, its cache key, its data directory and the field's task group.
    ``control``: the positive control, which runs only unlearning, evaluation and the reversibility protocol."""
    from hydra import compose, initialize_config_module

    from lacuna_metrics.checkpoints import Checkpoint
    from lacuna_metrics.localization import LocalizationConfig
    from lacuna_metrics.score import SCHEMA_VERSION as SCORE_SCHEMA_VERSION
    from lacuna_metrics.score import score_to_dir
    from lacuna_unlearn.attacks import resurfacing_attack
    from lacuna_unlearn.train import EDITORS
    from lacuna_unlearn.train import run as unlearn_run

    testbed, tb_key, data, group = ctx["testbed"], ctx["tb_key"], ctx["data"], ctx["group"]
    tag = "" if seed == int(cfg["seed"]) else f" (seed {seed})"
    display = label or name
    extra = list(extra or [])
    overrides = [f"method={name}", f"testbed={testbed}", f"field={field}", f"seed={seed}", *extra]
    trajectory = cfg["trajectory"]["enabled"] and not control and name not in EDITORS
    if trajectory:
        overrides.append(f"trainer.args.snapshots={int(cfg['trajectory']['points'])}")
    if cfg["experiment"] and name not in EDITORS:  # training-free: the schedule does not apply
        overrides.insert(0, f"experiment={cfg['experiment']}")
    u_inputs = {"testbed": tb_key, "overrides": [o for o in overrides if not o.startswith("testbed=")]}

    def build_unlearn(tmp: Path, overrides: list[str] = overrides) -> None:
        with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
            hcfg = compose(config_name="unlearn", overrides=[*overrides, f"output_dir={tmp / 'model'}"])
        unlearn_run(hcfg)

    u_stage = stages.get("unlearn", f"[{field}] unlearn {display}{tag}", u_inputs, build_unlearn)
    model = u_stage / "model"
    u_key = u_stage.name
    entry: dict[str, Any] = {"overrides": extra, "model": str(model)}
    # the checkpoint this entry describes; lacuna gate checks it against the score's `after`
    entry["checkpoint"] = {"path": str(model.resolve()), "fingerprint": Checkpoint(model).fingerprint()}
    manifest = json.loads((model / "unlearn_manifest.json").read_text())
    entry["unlearn_seconds"] = manifest.get("wall_seconds")
    evaluated, per_person = _eval_stage(
        stages, f"[{field}] evaluate {display}{tag}", model, {"model": u_key}, group, data, cfg
    )
    entry["behaviour"] = _behaviour(evaluated, field, data, per_person, seed=seed)
    before_ppl = (baseline.get("behaviour") or {}).get("neutral_word_perplexity")
    after_ppl = entry["behaviour"].get("neutral_word_perplexity")
    entry["behaviour"]["neutral_ppl_ratio"] = (
        round(after_ppl / before_ppl, 6) if before_ppl and after_ppl is not None else None
    )  # utility on text no unlearning loss saw: > 1 means the method damaged general language modelling
    if trajectory:
        entry["trajectory"] = _trajectory(stages, cfg, ctx, field, f"{display}{tag}", model, u_key, seed)
    if cfg["score"]["enabled"] and not control:
        scfg = cfg["score"]
        loc = LocalizationConfig(
            composite=int(scfg["composite_samples"]) > 0,
            composite_samples=max(1, int(scfg["composite_samples"])),
            seed=seed,
        )
        # FRAG calibrated on the rows this run unlearned and retained (issue 20, item 6): the forget rows of `field`,
        # the retain rows of the field(s) the unlearning manifest names (LACUNA's cross-field pairing, or `field`)
        retained = [str(r["field"]) for r in (manifest.get("config") or {}).get("retain_from") or []]
        calib = {"forget": [field], "retain": "all" if "all" in retained else list(dict.fromkeys(retained)) or [field]}
        s_stage = stages.get(
            "score",
            f"[{field}] score {display}{tag}",
            {"model": u_key, "testbed": tb_key, "score": scfg, "schema": SCORE_SCHEMA_VERSION, "calib_fields": calib},
            lambda tmp, model=model, loc=loc, scfg=scfg, calib=calib: score_to_dir(
                tmp / "score",
                plots=False,
                after=model,
                testbed=testbed,
                calib_fields=calib["forget"],
                calib_retain_fields=calib["retain"],
                frag=bool(scfg["frag"]),
                null=bool(scfg["null"]),
                null_tolerance=float(scfg["null_tolerance"]),
                config=loc,
                progress=False,
            ),  # fmt: skip
        )
        score = json.loads((s_stage / "score" / "score.json").read_text())
        entry["score_checkpoint"] = score["manifest"]["inputs"]["after"]
        calibrated = (score.get("null_calibration") or {}).get("targets") or {}
        entry["auc"] = {
            target: {
                "best": score["auc"][target].get("best"),
                "raw": score["auc"][target].get("raw"),
                # null-calibrated (docs/scoring.md): best over families a method-free update cannot win, and lift
                "calibrated_best": (calibrated.get(target) or {}).get("best"),
                "best_lift": (calibrated.get(target) or {}).get("best_lift"),
                "excluded": sorted((calibrated.get(target) or {}).get("excluded") or {}),
            }
            for target in score["auc"]
        }
        entry["frag"] = (score.get("frag") or {}).get("frag")
        entry["l2"] = (score.get("distance") or {}).get("l2")
        entry["per_layer"] = [
            {k: row[k] for k in ("layer", "component", "update_mass", "auc")} for row in score["per_layer"]
        ]
        entry["baseline_auc"] = score.get("baselines")  # the testbed's, the same for every method: moved up
    if cfg["attack"]["enabled"] and not control:
        acfg = cfg["attack"]
        a_stage = stages.get(
            "attack",
            f"[{field}] attack {display}{tag}",
            {"model": u_key, "attack": acfg, "field": field},
            lambda tmp, model=model, acfg=acfg, field=field: resurfacing_attack(
                model,
                tmp / "attack",
                testbed=testbed,
                field=field,
                protocol=acfg["protocol"],
                overrides=list(acfg.get("overrides") or []),
                attempts=int(acfg["attempts"]),
                batch_size=int(cfg["eval"]["batch_size"]),
                seed=seed,
                judge=acfg["judge"],
            ),  # fmt: skip
        )
        attack = json.loads((a_stage / "attack" / "attack.json").read_text())
        entry["attack"] = {
            k: attack[k]
            for k in (
                "protocol", "attempts", "persons", "judge", "success_at_n_unlearned", "success_at_n_relearned",
                "leak_rate_unlearned", "leak_rate_relearned", "pct_resurfaced_of_forgotten",
            )
        }  # fmt: skip
        entry["attack"]["by_judge"] = {  # Success@N under every judge, from the same generations
            j: {k: v for k, v in fig.items() if k.startswith("success_at_n")} for j, fig in attack["by_judge"].items()
        }
        from lacuna_metrics.intervals import bootstrap_interval

        per_person = attack.get("per_person") or {}
        entry["attack"]["ci"] = {  # 95% bootstrap over the attacked persons (issue 20: every behaviour metric)
            f"success_at_n_{state}": bootstrap_interval(
                {p: float(bool(v.get(state))) for p, v in per_person.items()}, seed=seed
            )
            if per_person
            else None
            for state in ("unlearned", "relearned")
        }
        entry["attack"]["forgotten"] = len(attack["forgotten"])
        entry["attack"]["resurfaced"] = len(attack["resurfaced"])
        qa = [f"lacuna_{field}_forget_qa", f"lacuna_{field}_retain_qa"]
        rel_eval, rel_persons = _eval_stage(
            stages,
            f"[{field}] evaluate relearned {display}{tag}",
            a_stage / "attack" / "relearned",
            {"attack": a_stage.name},
            qa,
            data,
            cfg,
        )  # fmt: skip
        rel = _behaviour(rel_eval, field, data, rel_persons, seed=seed)
        entry["relearned_behaviour"] = {
            "forget_leak": rel["forget_leak"],
            "retain_accuracy": rel["retain_accuracy"],
            "n": {k: rel["n"][k] for k in ("forget_leak", "retain_accuracy")},
            "ci": {k: rel["ci"][k] for k in ("forget_leak", "retain_accuracy")},
        }
        entry["regime"] = _regime(cfg, baseline["behaviour"], entry["behaviour"], rel)
        entry["regime"]["protocol"] = "heldout_relearning"
    if cfg["reversibility"]["enabled"]:
        entry["reversibility"] = _reversibility(
            stages, cfg, ctx, field, f"{display}{tag}", model, u_key, seed, baseline, entry
        )
        if "regime" in entry:  # the held-out attack's regime stays for comparison with earlier runs
            entry["heldout_regime"] = entry["regime"]
        entry["regime"] = entry["reversibility"]["regime"]
    return entry


def _trajectory(
    stages: _Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    model_key: str,
    seed: int,
) -> dict[str, Any]:
    """Forget leak, held-out retain accuracy and raw AUC at each snapshot along a method's schedule, and the method
    read at matched forgetting: the first snapshot whose forget leak is <= ``trajectory.leak_threshold``."""
    from lacuna_metrics.localization import LocalizationConfig
    from lacuna_metrics.score import score_to_dir

    testbed, tb_key, data = ctx["testbed"], ctx["tb_key"], ctx["data"]
    from lacuna_tasks.register import tasks_dir

    tasks = [f"lacuna_{field}_forget_qa", f"lacuna_{field}_retain_qa"]
    if (tasks_dir() / f"lacuna_{field}_retain_eval_qa.yaml").is_file():  # held-out people (docs/tasks.md)
        tasks.append(f"lacuna_{field}_retain_eval_qa")
    snapshots = sorted((model / "snapshots").glob("step-*"))
    if not snapshots:
        raise RuntimeError(f"{model}: the unlearning run kept no snapshots (trainer.args.snapshots)")
    loc = LocalizationConfig(scores=("raw",), composite=False, seed=seed)
    curve = []
    for snap in snapshots:
        step = int(snap.name.split("-", 1)[1])
        key = {"model": model_key, "snapshot": snap.name}
        results, persons = _eval_stage(
            stages, f"[{field}] evaluate {label} at step {step}", snap, key, tasks, data, cfg
        )
        beh = _behaviour(results, field, data, persons, seed=seed)
        held_out = results.get(f"lacuna_{field}_retain_eval_qa", {}).get("accuracy")
        s_stage = stages.get(
            "score",
            f"[{field}] raw AUC {label} at step {step}",
            {**key, "testbed": tb_key, "scores": ["raw"]},
            lambda tmp, snap=snap: score_to_dir(
                tmp / "score", plots=False, after=snap, testbed=testbed, frag=False, config=loc, progress=False
            ),
        )
        score = json.loads((s_stage / "score" / "score.json").read_text())
        curve.append(
            {
                "step": step,
                "forget_leak": beh["forget_leak"],
                "retain_accuracy": beh["retain_accuracy"],
                "retain_eval_accuracy": held_out,
                "n": beh["n"]["forget_leak"],
                "auc_raw": {target: score["auc"][target].get("raw") for target in score["auc"]},
            }
        )
    threshold = float(cfg["trajectory"]["leak_threshold"])
    matched = next((p for p in curve if p["forget_leak"] is not None and p["forget_leak"] <= threshold), None)
    return {"leak_threshold": threshold, "points": curve, "matched": matched, "end": curve[-1]}


def _regime(
    cfg: Mapping[str, Any], base: Mapping[str, Any], unlearned: Mapping[str, Any], relearned: Mapping[str, Any]
) -> dict[str, Any]:
    """The regime (docs/definitions.md#forgetting-regimes) from forget leak (before, unlearned, relearned) and retain
    accuracy (before, unlearned)."""
    from lacuna_metrics.reversibility import classify_regime

    rcfg = cfg["regime"]
    return classify_regime(
        base["forget_leak"], unlearned["forget_leak"], relearned["forget_leak"],
        base["retain_accuracy"], unlearned["retain_accuracy"],
        tau_rev=float(rcfg["tau_rev"]), tau_cat=float(rcfg["tau_cat"]), relative=bool(rcfg["relative"]),
    )  # fmt: skip


def _reversibility(
    stages: _Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    model_key: str,
    seed: int,
    baseline: Mapping[str, Any],
    entry: Mapping[str, Any],
) -> dict[str, Any]:
    """Restricted relearning (docs/definitions.md#restricted-relearning) of one unlearned model from each source, |D_f|
    rows each, then forget and retain QA; the regime is the one of the source with the highest recovery ratio (a method
    is as reversible as its easiest way back). Per source: the relearned rates with n and intervals, and that source's
    regime."""
    from hydra import compose, initialize_config_module

    from lacuna_unlearn.train import run as unlearn_run

    rcfg = cfg["reversibility"]
    testbed, data = ctx["testbed"], ctx["data"]
    qa = [f"lacuna_{field}_forget_qa", f"lacuna_{field}_retain_qa"]
    per_source: dict[str, Any] = {}
    for source in rcfg["sources"]:
        overrides = [
            "attack=relearn_restricted", f"field={field}", f"seed={seed}", f"source={source}",
            f"trainer.args.learning_rate={float(rcfg['learning_rate'])}",
            f"trainer.args.num_train_epochs={int(rcfg['epochs'])}",
        ]  # fmt: skip

        def build(tmp: Path, overrides: list[str] = overrides) -> None:
            with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
                hcfg = compose(
                    config_name="unlearn",
                    overrides=[*overrides, f"model={model}", f"testbed={testbed}", f"output_dir={tmp / 'model'}"],
                )
            unlearn_run(hcfg)

        stage = stages.get(
            "relearn", f"[{field}] relearn {label} from {source}", {"model": model_key, "overrides": overrides}, build
        )
        evaluated, persons = _eval_stage(
            stages, f"[{field}] evaluate {label} relearned from {source}", stage / "model", {"relearn": stage.name},
            qa, data, cfg,
        )  # fmt: skip
        rel = _behaviour(evaluated, field, data, persons, seed=seed)
        per_source[source] = {
            "forget_leak": rel["forget_leak"],
            "retain_accuracy": rel["retain_accuracy"],
            "n": {k: rel["n"][k] for k in ("forget_leak", "retain_accuracy")},
            "ci": {k: rel["ci"][k] for k in ("forget_leak", "retain_accuracy")},
            "regime": _regime(cfg, baseline["behaviour"], entry["behaviour"], rel),
        }
    ratios = {s: r["regime"]["recovery_ratio"] for s, r in per_source.items()}
    known = {s: v for s, v in ratios.items() if v is not None}
    worst = max(known, key=lambda s: known[s]) if known else next(iter(per_source))
    regime = {**per_source[worst]["regime"], "protocol": "restricted_relearning", "source": worst}
    return {
        "protocol": "restricted_relearning",
        "budget": "forget",
        "learning_rate": float(rcfg["learning_rate"]),
        "epochs": int(rcfg["epochs"]),
        "sources": per_source,
        "regime": regime,
    }


def _positive_control(
    stages: _Stages, cfg: Mapping[str, Any], ctx: Mapping[str, Any], field: str, seed: int, field_out: dict[str, Any]
) -> dict[str, Any]:
    """A method that only hides the answer (JensUn's refusal objective confined to the last, never masked layer)
    through the same reversibility protocol. It must come out reversible; if it does not, the attack is too weak to
    tell erasure from suppression, and every method's regime becomes ``undetermined`` (with the reason)."""
    overrides = [f"restrict={_last_block_regex(ctx['testbed'] / 'model')}"]
    entry = _method_entry(
        stages, cfg, ctx, field, "jensun", overrides, seed, field_out["baseline"], label=POSITIVE_CONTROL, control=True
    )
    regime = entry["regime"]
    suppressed = regime.get("regime") != "no_forgetting"
    ok = suppressed and regime.get("reversible") is True
    out = {
        "name": POSITIVE_CONTROL,
        "method": "jensun",
        "overrides": overrides,
        "behaviour": entry["behaviour"],
        "reversibility": entry["reversibility"],
        "regime": regime,
        "attack_strong_enough": ok,
    }
    if not ok:
        why = (
            "the positive control (output suppression in the last layer) did not lower the forget leak"
            if not suppressed
            else "the relearning attack did not restore the positive control (output suppression only), so it "
            "cannot tell suppression from erasure"
        )
        out["reason"] = why
        for method in field_out["methods"].values():
            if "reversibility" in method:
                method["regime"] = {**method["regime"], "regime": "undetermined", "reversible": None, "reason": why}
    return out


def _last_block_regex(model_dir: Path) -> str:
    """``restrict=regex:`` for every parameter of the checkpoint's last transformer block (testbeds keep their
    last layers out of every mask, so a change there cannot touch the stored facts)."""
    import re

    from lacuna_metrics.checkpoints import Checkpoint

    best: tuple[int, str] | None = None
    for name in Checkpoint(model_dir).names:
        found = re.match(r"^(.*?\.)(\d+)\.", name)
        if found and (best is None or int(found.group(2)) > best[0]):
            best = (int(found.group(2)), found.group(1))
    if best is None:
        raise ValueError(f"{model_dir}: no numbered transformer block in its tensor names for the positive control")
    return f"'regex:^{re.escape(best[1])}{best[0]}\\.'"  # quoted: Hydra keeps the backslashes of a quoted value


def run_benchmark(
    out_dir: str | os.PathLike[str],
    cfg: Mapping[str, Any] | None = None,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume from cache) the benchmark described by ``cfg`` into ``out_dir``; return ``results.json``.
    One run at a time per ``out_dir`` (a lock file)."""
    cfg = copy.deepcopy(dict(cfg or DEFAULT_RUN))
    validate_run_config(cfg)
    with _locked(Path(out_dir)):
        return _run_locked(Path(out_dir), cfg, log)


def _run_locked(out: Path, cfg: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    from lacuna_metrics.manifest import hardware, package_versions, publish_together, write_json
    from lacuna_metrics.report import write_run_report

    started = time.time()
    stages = _Stages(out / "stages", log)
    seed = int(cfg["seed"])
    seeds = [int(s) for s in cfg["seeds"]] if cfg.get("seeds") else [seed]  # unlearning seeds; the first is reported

    # testbed
    if cfg["testbed"]:
        testbed = Path(cfg["testbed"])
        tb_key = _testbed_fingerprint(testbed)
    else:
        from lacuna_unlearn.testbed import build_testbed
        from lacuna_unlearn.testbed_presets import get_preset

        # the preset's settings are part of the key: a changed preset rebuilds instead of reusing a stale testbed
        inputs = {"preset": cfg["preset"], "seed": cfg["testbed_seed"], "config": get_preset(cfg["preset"]).to_dict()}
        stage = stages.get(
            "testbed",
            f"testbed ({cfg['preset']})",
            inputs,
            lambda tmp: build_testbed(tmp / "testbed", preset=cfg["preset"], seed=cfg["testbed_seed"]),
        )
        testbed = stage / "testbed"
        tb_key = _testbed_fingerprint(testbed)
    data = testbed / "data"
    before = testbed / "model"

    results: dict[str, Any] = {"schema": RUN_SCHEMA, "preset": cfg["preset"], "testbed": str(testbed)}
    by_field: dict[str, Any] = {}
    for field in cfg["fields"]:
        suffixes = cfg["eval"].get("tasks")
        group = [f"lacuna_{field}_{t}" for t in suffixes] if suffixes else [f"lacuna_{field}"]
        if cfg["eval"].get("neutral_ppl") and (data / NEUTRAL_HELDOUT_FILE).is_file():
            group.append(NEUTRAL_PPL_TASK)
        base_eval = _eval_stage(stages, f"[{field}] evaluate before", before, {"testbed": tb_key}, group, data, cfg)
        base_behaviour = _behaviour(base_eval[0], field, data, base_eval[1], seed=seed)
        field_out: dict[str, Any] = {"baseline": {"behaviour": base_behaviour}, "methods": {}}
        ctx = {"testbed": testbed, "tb_key": tb_key, "data": data, "group": group}
        for name, extra in cfg["methods"].items():
            runs = {
                s: _method_entry(stages, cfg, ctx, field, name, list(extra or []), s, field_out["baseline"])
                for s in seeds
            }
            for run_entry in runs.values():
                baseline_auc = run_entry.pop("baseline_auc", None)
                if baseline_auc is not None:
                    results.setdefault("baseline_auc", baseline_auc)
            entry = runs[seeds[0]]
            if len(seeds) > 1:
                entry["across_seeds"] = across_seeds(runs)
            field_out["methods"][name] = entry
        if cfg["reversibility"]["enabled"] and cfg["reversibility"]["positive_control"]:
            field_out["positive_control"] = _positive_control(stages, cfg, ctx, field, seeds[0], field_out)
        by_field[field] = field_out

    first = by_field[cfg["fields"][0]]
    results.update(
        {
            "field": cfg["fields"][0],
            "baseline": {**first["baseline"], "auc": results.pop("baseline_auc", None)},
            "methods": first["methods"],
            "by_field": by_field,
            "manifest": {
                "config": cfg,
                "seed": seed,
                "stage_seconds": stages.timings,
                "wall_seconds": round(time.time() - started, 1),
                "versions": package_versions(("lacuna-bench", "torch", "transformers", "lm_eval", "peft")),
                "hardware": hardware(),
            },
        }
    )
    with publish_together(out) as staging:  # results.json, report.md and plots/ appear together
        write_run_report(staging, results)
        write_json(staging / "results.json", results)
    return results
