"""``lacuna run``'s per-method stages: one method on one field with one unlearning seed, unlearn -> evaluate ->
score -> attack -> regime, each a cached stage; the trajectory along its schedule; the positive control."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.behaviour import behaviour, eval_stage
from lacuna_unlearn.bench.reversibility import (
    judge_positive_control,
    last_block_regex,
    negative_control,
    regime,
    relearned_rates,
    reversibility,
)
from lacuna_unlearn.bench.run_config import POSITIVE_CONTROL
from lacuna_unlearn.bench.stages import Stages, output_key
from lacuna_unlearn.bench.stopping import stopping_point
from lacuna_unlearn.dataclass_config import path_override

__all__ = ["checkpoint_entry", "controls", "method_entry", "trajectory"]


def method_entry(
    stages: Stages,
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
    from lacuna_unlearn.trainer.app import EDITORS, run_overrides

    testbed, tb_key = ctx["testbed"], ctx["tb_key"]
    tag = "" if seed == int(cfg["seed"]) else f" (seed {seed})"
    display = f"{label or name}{tag}"  # the stages' log label
    extra = list(extra or [])
    overrides = [f"method={name}", path_override("testbed", testbed), f"field={field}", f"seed={seed}", *extra]
    with_trajectory = cfg["trajectory"]["enabled"] and not control and name not in EDITORS
    if with_trajectory:
        overrides.append(f"trainer.args.snapshots={int(cfg['trajectory']['points'])}")
    if cfg["experiment"] and name not in EDITORS:  # training-free: the schedule does not apply
        overrides.insert(0, f"experiment={cfg['experiment']}")
    u_inputs = {"testbed": tb_key, "overrides": [o for o in overrides if not o.startswith("testbed=")]}

    def build_unlearn(tmp: Path, overrides: list[str] = overrides) -> None:
        run_overrides(overrides, tmp / "model")

    u_stage = stages.get("unlearn", f"[{field}] unlearn {display}", u_inputs, build_unlearn)
    model = end_model = u_stage / "model"
    u_key = end_key = output_key(u_stage)  # downstream stages key on the unlearned model's content
    manifest = json.loads((model / "unlearn_manifest.json").read_text())
    stopping = None
    if cfg["stopping"]["enabled"] and not control and name not in EDITORS:
        # the headline reads the method at a step chosen on validation people; the full schedule stays as an ablation
        stopping = stopping_point(stages, cfg, ctx, field, overrides, seed, display)
        total = int(manifest.get("scheduled_steps") or manifest["steps"])
        step = min(total, max(1, round(stopping["fraction"] * total))) if "fraction" in stopping else total
        stopping.update(forget_steps=total, chosen_step=step)
        if step < total:
            s_overrides = [o for o in overrides if not o.startswith("trainer.args.snapshots=")]
            s_overrides.append(f"trainer.args.stop_at_step={step}")
            s_inputs = {"testbed": tb_key, "overrides": [o for o in s_overrides if not o.startswith("testbed=")]}
            s_stage = stages.get(
                "unlearn", f"[{field}] unlearn {display} to step {step}", s_inputs,
                lambda tmp: build_unlearn(tmp, s_overrides),
            )  # fmt: skip
            model, u_key = s_stage / "model", output_key(s_stage)
            manifest = json.loads((model / "unlearn_manifest.json").read_text())
    entry: dict[str, Any] = {"overrides": extra, "model": str(model)}
    if stopping is not None:
        entry["stopping"] = stopping
    entry["unlearn_seconds"] = manifest.get("wall_seconds")
    measured = checkpoint_entry(
        stages, cfg, ctx, field, display, model, u_key, seed, baseline, manifest, control=control
    )
    entry.update({k: measured.pop(k) for k in ("checkpoint", "behaviour")})
    if stopping is not None and end_model != model:  # the end of the shared schedule: a labelled ablation
        end_behaviour = _evaluate(
            stages, cfg, ctx, field, f"{display} at the end of the schedule", end_model, end_key, baseline
        )
        entry["end_of_schedule"] = {
            "steps": stopping["forget_steps"],
            "model": str(end_model),
            "behaviour": end_behaviour,
        }
    if with_trajectory:
        entry["trajectory"] = trajectory(stages, cfg, ctx, field, display, end_model, end_key, seed)
    entry.update({k: v for k, v in measured.items() if k != "model"})
    return entry


def checkpoint_entry(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    display: str,
    model: Path,
    model_key: str,
    seed: int,
    baseline: Mapping[str, Any],
    manifest: Mapping[str, Any] | None = None,
    *,
    control: bool = False,
) -> dict[str, Any]:
    """What the run measures of one unlearned checkpoint, however it was made (a method's run, a snapshot along its
    schedule, a checkpoint listed to ``lacuna meta``): evaluate, score, attack, restricted relearning, each a cached
    stage keyed on ``model_key`` (the checkpoint's content). ``manifest``: its unlearning manifest, which names the
    retain fields FRAG is calibrated on (none: the forget field's). ``control``: the positive control, which runs
    only the evaluation and the reversibility protocol."""
    from lacuna_metrics import Checkpoint

    entry: dict[str, Any] = {"model": str(model)}
    # the checkpoint this entry describes; lacuna gate checks it against the score's `after`
    entry["checkpoint"] = {"path": str(Path(model).resolve()), "fingerprint": Checkpoint(model).fingerprint()}
    entry["behaviour"] = _evaluate(stages, cfg, ctx, field, display, model, model_key, baseline)
    if cfg["score"]["enabled"] and not control:
        entry.update(_score(stages, cfg, ctx, field, display, model, model_key, seed, manifest or {}))
    if cfg["attack"]["enabled"] and not control:
        entry["attack"], relearned = _attack(stages, cfg, ctx, field, display, model, model_key, seed)
        entry["relearned_behaviour"] = relearned_rates(relearned)
        entry["regime"] = regime(cfg, baseline["behaviour"], entry["behaviour"], relearned)
        entry["regime"]["protocol"] = "heldout_relearning"
    if cfg["reversibility"]["enabled"]:
        entry["reversibility"] = reversibility(
            stages, cfg, ctx, field, display, model, model_key, seed, baseline, entry
        )
        if "regime" in entry:  # the held-out attack's regime stays for comparison with earlier runs
            entry["heldout_regime"] = entry["regime"]
        entry["regime"] = entry["reversibility"]["regime"]
    return entry


def _evaluate(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    display: str,
    model: Path,
    model_key: str,
    baseline: Mapping[str, Any],
) -> dict[str, Any]:
    """The behaviour of one checkpoint on the field's task group (a cached evaluation stage), with its neutral
    perplexity ratio against the testbed model: utility on text no unlearning loss saw, > 1 when the update damaged
    general language modelling (docs/tasks.md)."""
    from lacuna_tasks import word_perplexity_ratio

    evaluated, per_person = eval_stage(
        stages, f"[{field}] evaluate {display}", model, {"model": model_key}, ctx["group"], ctx["data"], cfg
    )
    out = behaviour(evaluated, field, ctx["data"], per_person)
    out["neutral_ppl_ratio"] = word_perplexity_ratio(
        out.get("neutral_word_perplexity"), (baseline.get("behaviour") or {}).get("neutral_word_perplexity")
    )
    return out


def _score(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    model_key: str,
    seed: int,
    manifest: Mapping[str, Any],
) -> dict[str, Any]:
    """The score stage of one unlearned model (``lacuna score``: AUCs with null calibration, FRAG, L2, per layer)
    as the entry's ``score_checkpoint``, ``auc``, ``frag``, ``l2``, ``per_layer``, ``precision_at_k``,
    ``localization_settings``, ``not_applicable`` and ``baseline_auc``."""
    from lacuna_metrics import SCHEMA_VERSION as SCORE_SCHEMA_VERSION
    from lacuna_metrics import LocalizationConfig, score_to_dir

    testbed, tb_key = ctx["testbed"], ctx["tb_key"]
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
        f"[{field}] score {label}",
        {"model": model_key, "testbed": tb_key, "score": scfg, "schema": SCORE_SCHEMA_VERSION, "calib_fields": calib},
        lambda tmp: score_to_dir(
            tmp / "score",
            plots=False,
            after=model,
            testbed=testbed,
            calib_fields=calib["forget"],
            calib_retain_fields=calib["retain"],
            frag=bool(scfg["frag"]),
            null=bool(scfg["null"]),
            null_tolerance=float(scfg["null_tolerance"]),
            null_z=float(scfg["null_z"]),
            null_min_lift=float(scfg["null_min_lift"]),
            null_draws=int(scfg["null_draws"]),
            null_samples=int(scfg["null_samples"]),
            config=loc,
            progress=False,
        ),  # fmt: skip
    )
    score = json.loads((s_stage / "score" / "score.json").read_text())
    calibrated = (score.get("null_calibration") or {}).get("targets") or {}
    return {
        "score_checkpoint": score["manifest"]["inputs"]["after"],
        "auc": {
            target: {
                "best": score["auc"][target].get("best"),
                "raw": score["auc"][target].get("raw"),
                # null-calibrated (docs/scoring.md): best over families a method-free update cannot win, and lift
                "calibrated_best": (calibrated.get(target) or {}).get("best"),
                "best_lift": (calibrated.get(target) or {}).get("best_lift"),
                "excluded": sorted((calibrated.get(target) or {}).get("excluded") or {}),
                # the verdict's null (mean and spread of the null updates, for the band in plots/auc.png) and every
                # family's uncalibrated AUC (the thin marks)
                "null": _verdict_null(calibrated.get(target) or {}),
                "families": {f: v for f, v in score["auc"][target].items() if f != "best" and v is not None},
            }
            for target in score["auc"]
        },
        "frag": (score.get("frag") or {}).get("frag"),
        "l2": (score.get("distance") or {}).get("l2"),
        "per_layer": [{k: row[k] for k in ("layer", "component", "update_mass", "auc")} for row in score["per_layer"]],
        # top-k shares per family (LACUNA's p@k), tie rule and absent families: the LACUNA-named precision files
        # read them (docs/release.md)
        "precision_at_k": score.get("precision_at_k"),
        "localization_settings": score.get("localization_settings"),
        "not_applicable": score.get("not_applicable"),
        "baseline_auc": score.get("baselines"),  # the testbed's, the same for every method: moved up
    }


def _attack(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    model_key: str,
    seed: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The held-out relearning attack with the extraction probe (``lacuna attack``): the entry's ``attack``, and
    the behaviour of the relearned model (forget and retain QA)."""
    from lacuna_metrics import rate_interval
    from lacuna_unlearn.bench.attacks import resurfacing_attack

    testbed, data = ctx["testbed"], ctx["data"]
    acfg = cfg["attack"]
    a_stage = stages.get(
        "attack",
        f"[{field}] attack {label}",
        {"model": model_key, "attack": acfg, "field": field},
        lambda tmp: resurfacing_attack(
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
    out = {
        k: attack[k]
        for k in (
            "protocol", "attempts", "persons", "judge", "success_at_n_unlearned", "success_at_n_relearned",
            "leak_rate_unlearned", "leak_rate_relearned", "pct_resurfaced_of_forgotten",
        )
    }  # fmt: skip
    out["by_judge"] = {  # Success@N under every judge, from the same generations
        j: {k: v for k, v in fig.items() if k.startswith("success_at_n")} for j, fig in attack["by_judge"].items()
    }
    per_person = attack.get("per_person") or {}
    out["ci"] = {  # exact 95% interval over the attacked persons, k of n leaking (issue 35)
        f"success_at_n_{state}": rate_interval(
            {p: float(bool(v.get(state))) for p, v in per_person.items()}, metric=f"success_at_n_{state}"
        )
        for state in ("unlearned", "relearned")
    }
    out["forgotten"] = len(attack["forgotten"])
    out["resurfaced"] = len(attack["resurfaced"])
    qa = [f"lacuna_{field}_forget_qa", f"lacuna_{field}_retain_qa"]
    rel_eval, rel_persons = eval_stage(
        stages, f"[{field}] evaluate relearned {label}", a_stage / "attack" / "relearned", {"attack": a_stage.name},
        qa, data, cfg,
    )  # fmt: skip
    return out, behaviour(rel_eval, field, data, rel_persons)


def trajectory(
    stages: Stages,
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
    from lacuna_metrics import LocalizationConfig, score_to_dir
    from lacuna_tasks import tasks_dir

    testbed, tb_key, data = ctx["testbed"], ctx["tb_key"], ctx["data"]
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
        results, persons = eval_stage(stages, f"[{field}] evaluate {label} at step {step}", snap, key, tasks, data, cfg)
        beh = behaviour(results, field, data, persons)
        held_out = results.get(f"lacuna_{field}_retain_eval_qa", {}).get("accuracy")
        s_stage = stages.get(
            "score",
            f"[{field}] raw AUC {label} at step {step}",
            {**key, "testbed": tb_key, "scores": ["raw"]},
            lambda tmp, snap=snap: score_to_dir(
                tmp / "score",
                plots=False,
                after=snap,
                testbed=testbed,
                frag=False,
                null=False,
                config=loc,
                progress=False,
            ),  # the curve reads the raw AUC only: no null calibration per snapshot
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


def controls(
    stages: Stages, cfg: Mapping[str, Any], ctx: Mapping[str, Any], field: str, seed: int, baseline: dict[str, Any]
) -> dict[str, Any]:
    """The relearning attack's two controls for one seed (docs/report.md "Controls of the relearning attack"): the
    negative control (:func:`~lacuna_unlearn.bench.reversibility.negative_control`: learning from scratch at the same
    budget) and the positive control, a method that only hides the answer (JensUn's refusal objective confined to
    the last, never masked layer) through the same reversibility protocol, judged against the negative control by
    :func:`~lacuna_unlearn.bench.reversibility.judge_positive_control`."""
    people = (baseline.get("behaviour") or {}).get("n", {}).get("forget_leak") or 1
    negative = negative_control(stages, cfg, ctx, field, seed, int(people))
    overrides = [f"restrict={last_block_regex(ctx['testbed'] / 'model')}"]
    entry = method_entry(
        stages, cfg, ctx, field, "jensun", overrides, seed, baseline, label=POSITIVE_CONTROL, control=True
    )
    positive = judge_positive_control(
        entry, overrides, baseline, negative, min_suppression=float(cfg["reversibility"]["min_suppression"])
    )
    return {"positive": positive, "negative": negative}


def _verdict_null(calibrated: dict[str, Any]) -> dict[str, Any] | None:
    """The null AUC and spread of the calibrated best's family (None: no verdict)."""
    family = (calibrated.get("best") or {}).get("score")
    entry = (calibrated.get("families") or {}).get(family) if family else None
    if not entry:
        return None
    return {"family": family, "auc": entry.get("null_auc"), "sd": entry.get("null_sd")}
