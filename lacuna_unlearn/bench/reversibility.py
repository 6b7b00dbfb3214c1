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

__all__ = ["judge_positive_control", "last_block_regex", "regime", "relearned_rates", "reversibility"]


def regime(
    cfg: Mapping[str, Any], base: Mapping[str, Any], unlearned: Mapping[str, Any], relearned: Mapping[str, Any]
) -> dict[str, Any]:
    """The regime (docs/definitions.md#forgetting-regimes) from forget leak (before, unlearned, relearned) and retain
    accuracy (before, unlearned)."""
    from lacuna_metrics import classify_regime

    rcfg = cfg["regime"]
    return classify_regime(
        base["forget_leak"], unlearned["forget_leak"], relearned["forget_leak"],
        base["retain_accuracy"], unlearned["retain_accuracy"],
        tau_rev=float(rcfg["tau_rev"]), tau_cat=float(rcfg["tau_cat"]), relative=bool(rcfg["relative"]),
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
    rows each, then forget and retain QA; the regime is the one of the source with the highest recovery ratio (a method
    is as reversible as its easiest way back). Per source: the relearned rates with n and intervals, and that source's
    regime."""
    from hydra import compose, initialize_config_module

    from lacuna_unlearn.trainer.app import run as unlearn_run

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
        evaluated, persons = eval_stage(
            stages, f"[{field}] evaluate {label} relearned from {source}", stage / "model", {"relearn": stage.name},
            qa, data, cfg,
        )  # fmt: skip
        rel = behaviour(evaluated, field, data, persons)
        per_source[source] = {
            **relearned_rates(rel),
            "regime": regime(cfg, baseline["behaviour"], entry["behaviour"], rel),
        }
    ratios = {s: r["regime"]["recovery_ratio"] for s, r in per_source.items()}
    known = {s: v for s, v in ratios.items() if v is not None}
    worst = max(known, key=lambda s: known[s]) if known else next(iter(per_source))
    chosen = {**per_source[worst]["regime"], "protocol": "restricted_relearning", "source": worst}
    return {
        "protocol": "restricted_relearning",
        "budget": "forget",
        "learning_rate": float(rcfg["learning_rate"]),
        "epochs": int(rcfg["epochs"]),
        "sources": per_source,
        "regime": chosen,
    }


def judge_positive_control(
    entry: Mapping[str, Any], overrides: list[str], methods: Mapping[str, dict[str, Any]]
) -> dict[str, Any]:
    """The positive control's results entry from its method ``entry`` (unlearned with ``overrides``). It must come
    out reversible; if it does not, the attack is too weak to tell erasure from suppression, and every method in
    ``methods`` with a reversibility result gets the regime ``undetermined`` (with the reason), in place."""
    control_regime = entry["regime"]
    suppressed = control_regime.get("regime") != "no_forgetting"
    ok = suppressed and control_regime.get("reversible") is True
    out = {
        "name": POSITIVE_CONTROL,
        "method": "jensun",
        "overrides": overrides,
        "behaviour": entry["behaviour"],
        "reversibility": entry["reversibility"],
        "regime": control_regime,
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
        for method in methods.values():
            if "reversibility" in method:
                method["regime"] = {**method["regime"], "regime": "undetermined", "reversible": None, "reason": why}
    return out


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
