"""``lacuna run``'s reversibility protocol: restricted relearning from each source, the forgetting regime, and the
verdict of the positive control that checks the attack is strong enough (docs/definitions.md#forgetting-regimes,
docs/definitions.md#restricted-relearning)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.behaviour import behaviour, eval_stage
from lacuna_unlearn.bench.run_config import POSITIVE_CONTROL
from lacuna_unlearn.bench.stages import Stages
from lacuna_unlearn.dataclass_config import path_override

__all__ = [
    "apply_controls",
    "judge_positive_control",
    "last_block_regex",
    "negative_control",
    "regime",
    "relearned_rates",
    "relearned_separation",
    "reversibility",
]


def regime(
    cfg: Mapping[str, Any], base: Mapping[str, Any], unlearned: Mapping[str, Any], relearned: Mapping[str, Any]
) -> dict[str, Any]:
    """The regime (docs/definitions.md#forgetting-regimes) from the forget leak (before, unlearned, relearned) and the
    retained ability no unlearning loss trained on: held-out retain and cross-field accuracy (before, unlearned) and the
    held-out neutral perplexity ratio."""
    from lacuna_metrics import classify_regime

    rcfg = cfg["regime"]
    return classify_regime(
        base["forget_leak"], unlearned["forget_leak"], relearned["forget_leak"],
        retained={k: (base.get(k), unlearned.get(k)) for k in ("retain_eval_accuracy", "crossfield_accuracy")},
        ppl_ratio=unlearned.get("neutral_ppl_ratio"),
        tau_rev=float(rcfg["tau_rev"]), tau_cat=float(rcfg["tau_cat"]), tau_ppl=float(rcfg["tau_ppl"]),
        rule=str(rcfg["rule"]), relative=bool(rcfg["relative"]),
    )  # fmt: skip


def relearned_rates(rel: Mapping[str, Any]) -> dict[str, Any]:
    """What a results entry keeps of a relearned model's :func:`~lacuna_unlearn.bench.behaviour.behaviour`: forget
    leak and retain accuracy with their ``n`` and ``ci``."""
    keys = ("forget_leak", "retain_accuracy")
    return {
        "forget_leak": rel["forget_leak"],
        "retain_accuracy": rel["retain_accuracy"],
        "n": {k: rel["n"][k] for k in keys},
        "ci": {k: rel["ci"][k] for k in keys},
    }


def relearn_and_evaluate(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    model_key: str,
    seed: int,
    source: str,
    *,
    data: Path | None = None,
    data_key: str | None = None,
    tasks: list[str] | None = None,
) -> dict[str, Any]:
    """Restricted relearning of ``model`` from ``source`` (|D_f| rows of ``data``, default the testbed's), then its
    behaviour on ``tasks`` (default forget and retain QA): one relearn stage and one evaluation stage, cached."""
    from lacuna_unlearn.trainer.app import run_overrides

    rcfg = cfg["reversibility"]
    testbed = ctx["testbed"]
    data = data or ctx["data"]
    qa = tasks or [f"lacuna_{field}_forget_qa", f"lacuna_{field}_retain_qa"]
    overrides = [
        "attack=relearn_restricted", f"field={field}", f"seed={seed}", f"source={source}",
        f"trainer.args.learning_rate={float(rcfg['learning_rate'])}",
        f"trainer.args.num_train_epochs={int(rcfg['epochs'])}",
    ]  # fmt: skip
    where = [path_override("testbed", testbed)] if data_key is None else [path_override("data", data)]

    def build(tmp: Path) -> None:
        run_overrides([*overrides, *where, path_override("model", model)], tmp / "model")

    key: dict[str, Any] = {"model": model_key, "overrides": overrides}
    if data_key is not None:  # another dataset than the testbed's: its stage names it
        key["data"] = data_key
    stage = stages.get("relearn", f"[{field}] relearn {label} from {source}", key, build)
    evaluated, persons = eval_stage(
        stages, f"[{field}] evaluate {label} relearned from {source}", stage / "model", {"relearn": stage.name},
        qa, data, cfg,
    )  # fmt: skip
    return behaviour(evaluated, field, data, persons)


def reversibility(
    stages: Stages,
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
    rows each, then forget and retain QA; the regime is the one of the source that brings the forget leak back closest
    to the original (the smallest gap Δr: a method is as reversible as its easiest way back). Per source: the relearned
    rates with n and intervals, and that source's regime. The controls (:func:`apply_controls`) are applied later,
    once both have run for this seed."""
    rcfg = cfg["reversibility"]
    per_source: dict[str, Any] = {}
    for source in rcfg["sources"]:
        rel = relearn_and_evaluate(stages, cfg, ctx, field, label, model, model_key, seed, source)
        per_source[source] = {
            **relearned_rates(rel),
            "regime": regime(cfg, baseline["behaviour"], entry["behaviour"], rel),
        }
    gaps = {s: r["regime"]["forget_gap"] for s, r in per_source.items()}
    worst = min(gaps, key=lambda s: gaps[s])
    chosen = {**per_source[worst]["regime"], "protocol": "restricted_relearning", "source": worst}
    return {
        "protocol": "restricted_relearning",
        "budget": "forget",
        "learning_rate": float(rcfg["learning_rate"]),
        "epochs": int(rcfg["epochs"]),
        "sources": per_source,
        "regime": chosen,
    }


def _unseen_seed(ctx: Mapping[str, Any], field: str, seed: int) -> int:
    """The generator seed of the negative control's people: its own stream per testbed, field and seed."""
    from lacuna_tasks import stable_seed

    return stable_seed("negative-control", ctx["tb_key"], field, seed) % (2**31)


def unseen_people(stages: Stages, ctx: Mapping[str, Any], field: str, seed: int, people: int) -> Path:
    """The data of ``people`` synthetic people the testbed's model never saw (a dataset generated with a seed of its
    own, one QA row per person as the forget split), cached as a stage: the negative control's people."""
    from lacuna_tasks import generate_dataset

    gen_seed = _unseen_seed(ctx, field, seed)

    def build_data(tmp: Path) -> None:
        generate_dataset(
            tmp / "data", profiles=max(60, 12 * people), seed=gen_seed, people_per_field=people, validation_people=1
        )

    return stages.get(
        "data", f"[{field}] negative control: {people} people the model never saw", {"seed": gen_seed,
        "people": people, "field": field}, build_data,
    )  # fmt: skip


def negative_control(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    seed: int,
    people: int,
    tasks: list[str] | None = None,
) -> dict[str, Any]:
    """How much the relearning budget teaches from scratch: the testbed's model (before unlearning) relearned, with
    the same restricted protocol (forget source, |D_f| rows, same learning rate and epochs), on ``people`` people it
    never saw (:func:`unseen_people`), then asked their facts. Its leak before relearning shows the model did not know
    them. ``tasks``: what is evaluated before and after (default forget QA); the behaviour on them is returned in
    ``behaviour_before`` / ``behaviour_relearned`` (lacuna meta reads more than the leak)."""
    d_stage = unseen_people(stages, ctx, field, seed, people)
    data = d_stage / "data"
    model = ctx["before"]
    forget_qa = tasks or [f"lacuna_{field}_forget_qa"]
    before_eval, before_persons = eval_stage(
        stages, f"[{field}] evaluate the testbed model on the negative control's people", model,
        {"testbed": ctx["tb_key"], "data": d_stage.name}, forget_qa, data, cfg,
    )  # fmt: skip
    before = behaviour(before_eval, field, data, before_persons)
    rel = relearn_and_evaluate(
        stages, cfg, ctx, field, "the testbed model on unseen people", model, ctx["tb_key"], seed, "forget",
        data=data, data_key=d_stage.name, tasks=forget_qa,
    )  # fmt: skip
    out = {
        "name": "learn_from_scratch",
        "what": "the testbed's model relearned on people it never saw, same restricted protocol and budget",
        "people": people,
        "data_seed": _unseen_seed(ctx, field, seed),
        "before": {"forget_leak": before["forget_leak"], "n": before["n"]["forget_leak"]},
        "relearned": {"forget_leak": rel["forget_leak"], "n": rel["n"]["forget_leak"], "ci": rel["ci"]["forget_leak"]},
    }
    if tasks is not None:
        out.update(behaviour_before=before, behaviour_relearned=rel, data=str(data))
    return out


def _count(rate: float | None, n: int | None) -> tuple[int, int] | None:
    """``(k, n)`` of a rate over persons."""
    if rate is None or not n:
        return None
    return int(round(float(rate) * int(n))), int(n)


def relearned_separation(reversibility_result: Mapping[str, Any], negative: Mapping[str, Any]) -> dict[str, Any] | None:
    """Whether the relearned forget leak of the regime's source exceeds the negative control's beyond their interval
    (:func:`lacuna_metrics.leak_separation`); None when either count is unknown."""
    from lacuna_metrics import leak_separation

    source = (reversibility_result.get("regime") or {}).get("source")
    entry = (reversibility_result.get("sources") or {}).get(source) or {}
    mine = _count(entry.get("forget_leak"), (entry.get("n") or {}).get("forget_leak"))
    theirs = _count((negative.get("relearned") or {}).get("forget_leak"), (negative.get("relearned") or {}).get("n"))
    if mine is None or theirs is None:
        return None
    return leak_separation(mine[0], mine[1], theirs[0], theirs[1])


def judge_positive_control(
    entry: Mapping[str, Any],
    overrides: list[str],
    baseline: Mapping[str, Any],
    negative: Mapping[str, Any],
    *,
    min_suppression: float = 0.8,
) -> dict[str, Any]:
    """The positive control's verdict from its method ``entry`` (unlearned with ``overrides``): it must silence at
    least ``min_suppression`` of the forget facts that leaked before unlearning (the same QA probe), come out
    reversible, and its relearned leak must exceed the negative control's beyond their interval. Otherwise the
    attack cannot tell suppression from erasure, or relearning from learning afresh (``attack_strong_enough``
    false, with the reason)."""
    control_regime = entry["regime"]
    before = (baseline.get("behaviour") or {}).get("forget_leak")
    after = (entry.get("behaviour") or {}).get("forget_leak")
    silenced = (before - after) / before if before and after is not None else None
    separation = relearned_separation(entry["reversibility"], negative)
    reasons = []
    if silenced is None or silenced < min_suppression:
        share = "nothing" if silenced is None else f"{silenced:.0%}"
        reasons.append(f"the positive control silenced {share} of the forget facts (needs {min_suppression:.0%})")
    if control_regime.get("reversible") is not True:
        reasons.append("the relearning attack did not restore the positive control (output suppression only)")
    if separation is None or not separation["separated"]:
        reasons.append(
            "the positive control's relearned leak does not exceed the negative control's (learning from scratch) "
            "beyond their interval"
        )
    out = {
        "name": POSITIVE_CONTROL,
        "method": "jensun",
        "overrides": overrides,
        "behaviour": entry["behaviour"],
        "reversibility": entry["reversibility"],
        "regime": control_regime,
        "silenced": silenced,
        "min_suppression": min_suppression,
        "separation_from_negative": separation,
        "attack_strong_enough": not reasons,
    }
    if reasons:
        out["reason"] = "; ".join(reasons) + ": the attack is too weak to read regimes"
    return out


def apply_controls(
    entry: dict[str, Any], positive: Mapping[str, Any] | None, negative: Mapping[str, Any] | None
) -> None:
    """The controls' verdict on one method entry of the same seed, in place: with a failed positive control the
    regime is ``undetermined`` (with the reason); a reversible verdict stands only when the method's relearned leak
    exceeds the negative control's beyond their interval, else it is ``undetermined`` too (recovery that learning
    from scratch explains). ``regime.controls`` records what was checked."""
    if "reversibility" not in entry or positive is None or negative is None:
        return
    regime_entry = dict(entry["regime"])
    separation = relearned_separation(entry["reversibility"], negative)
    regime_entry["controls"] = {
        "positive_passed": bool(positive.get("attack_strong_enough")),
        "separation_from_negative": separation,
    }
    if not positive.get("attack_strong_enough"):
        regime_entry.update(regime="undetermined", reversible=None, ideal=False, reason=positive.get("reason"))
    elif regime_entry.get("reversible") is True and not (separation or {}).get("separated"):
        regime_entry.update(
            regime="undetermined", reversible=None, ideal=False,
            reason="the relearned leak does not exceed the negative control's (learning from scratch) beyond their "
            "interval: relearning cannot be told from learning afresh",
        )  # fmt: skip
    entry["regime"] = regime_entry


def last_block_regex(model_dir: Path) -> str:
    """``restrict=regex:`` for every parameter of the checkpoint's last transformer block (testbeds keep their
    last layers out of every mask, so a change there cannot touch the stored facts)."""
    from lacuna_metrics import Checkpoint

    best: tuple[int, str] | None = None
    for name in Checkpoint(model_dir).names:
        found = re.match(r"^(.*?\.)(\d+)\.", name)
        if found and (best is None or int(found.group(2)) > best[0]):
            best = (int(found.group(2)), found.group(1))
    if best is None:
        raise ValueError(f"{model_dir}: no numbered transformer block in its tensor names for the positive control")
    return f"'regex:^{re.escape(best[1])}{best[0]}\\.'"  # quoted: Hydra keeps the backslashes of a quoted value
