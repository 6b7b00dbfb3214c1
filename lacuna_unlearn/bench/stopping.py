"""Stopping points chosen on validation people (docs/report.md "Stopping points").

A method read at the end of a shared schedule is read at an arbitrary point: gradient methods reach zero leak within
a few steps and then keep damaging the model. LACUNA chooses each method's hyper-parameters on validation people and
reports on the forget and retain people; so does ``lacuna run``:

1. the testbed's validation people (memorized like the forget people, in no other split) become the forget set of a
   *validation run* of the method, with the run's schedule and log-spaced snapshots (dense early, where the leak
   falls); a method restricted to the forget mask is restricted to the validation people's groups instead;
2. each snapshot is asked the validation people's facts (``stopping.metric``: J_W, the worst case over paraphrases
   and in-context prompts, or the plain QA leak), and the stopping point is the first step at which that leak is at
   most ``stopping.threshold``; where the snapshots bracketing it are further apart than ``stopping.resolution`` of
   the schedule (and one step), a refinement run keeps the steps in between, up to twice;
3. the chosen point is carried over to the forget run as the same share of its schedule (the validation and forget
   sets can differ in size), and the method is unlearned on the forget people up to that step on the full
   schedule's learning rates (``trainer.args.stop_at_step``).

Forget and retain people never enter the choice. Training-free editors have no schedule: they are read as run.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.behaviour import behaviour, eval_stage
from lacuna_unlearn.bench.stages import Stages, output_key
from lacuna_unlearn.dataclass_config import path_override
from lacuna_unlearn.trainer.selection import choose_step  # the rule, beside lacuna-unlearn's best_step

__all__ = ["STOP_METRICS", "choose_step", "stopping_point", "validation_view"]

#: The retain-side splits of a testbed's data, rebuilt in the validation view.
RETAIN_SPLITS = ("retain", "retain_paraphrased", "retain_eval", "retain_eval_paraphrased")
#: Stopping metric -> the task suffix it comes from (``lacuna_<field>_<suffix>``).
STOP_METRICS: dict[str, str] = {"j_w": "forget_worstcase", "forget_leak": "forget_qa"}


def validation_view(stages: Stages, ctx: Mapping[str, Any]) -> Path:
    """The testbed's data with the validation people as the forget split (and no validation or forget-paraphrased
    split, so no person is in two splits): what a validation run unlearns and is asked. One cached stage. The data
    is read through :func:`lacuna_tasks.load_data`, so a LACUNA release's ``data-<regime>/`` works as a testbed's
    ``data/`` does; the view is written in lacuna-bench's JSONL layout."""
    from lacuna_tasks import KNOWN_SPLITS, load_data

    source = Path(ctx["data"])
    data = load_data(source)
    if not data.has_split("validation"):
        raise ValueError(f"{data.source}: no validation split: stopping points need validation people")

    def build(tmp: Path) -> None:
        view = tmp / "data"
        view.mkdir()

        def write(split: str, rows: list[dict[str, Any]]) -> None:
            (view / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

        groups = {int(r["group_id"]) for r in data.splits["validation"]}
        skip = {"forget", "forget_paraphrased", "validation", *RETAIN_SPLITS}
        split_files = {f"{s}{suffix}" for s in KNOWN_SPLITS for suffix in (".jsonl", ".parquet")}
        if source.is_dir():  # what else the data directory holds (profiles, held-out neutral text)
            for item in source.iterdir():
                if item.is_file() and item.name not in split_files and item.suffix in (".jsonl", ".json"):
                    shutil.copy(item, view / item.name)
        for split, rows in data.splits.items():
            if split not in skip:
                write(split, rows)
        for name, parts in (("retain", ("retain", "retain_eval")), ("retain_paraphrased", RETAIN_SPLITS[1::2])):
            # forget and retain groups stay disjoint (one mask per group): retain people who share a group with a
            # validation person leave the view; the held-out retain people join the retain side, so the in-context
            # probes of J_W still find three other people's pairs
            write(name, [r for part in parts for r in data.splits.get(part, []) if int(r["group_id"]) not in groups])
        write("forget", data.splits["validation"])

    stage = stages.get("data", "validation people as the forget set", {"testbed": ctx["tb_key"], "view": 4}, build)
    return stage / "data"


def stopping_point(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    overrides: list[str],
    seed: int,
    label: str,
) -> dict[str, Any]:
    """Run the validation run(s) of one method (``overrides``: its unlearning overrides without ``testbed=``) and
    choose its stopping step (the module docstring); returns ``stopping`` of the results entry."""
    from hydra import compose, initialize_config_module

    from lacuna_tasks import LacunaDataError, load_data
    from lacuna_unlearn.trainer.app import run_overrides

    scfg = cfg["stopping"]
    metric, threshold = str(scfg["metric"]), float(scfg["threshold"])
    view = validation_view(stages, ctx)
    try:
        people = load_data(view).rows("forget", field)
    except LacunaDataError as exc:
        if "has no rows for field" not in str(exc):  # only a field without validation people is skipped
            raise
        people = []
    if not people:  # rows whose value is missing are dropped per field: a field may have no validation person
        return {"metric": metric, "threshold": threshold, "skipped": f"no validation people of field {field!r}: "
                "read at the end of the schedule"}  # fmt: skip
    groups = sorted({int(r["group_id"]) for r in people})
    base = [o for o in overrides if not o.startswith(("testbed=", "trainer.args.snapshots="))]
    base += [path_override("testbed", ctx["testbed"]), path_override("data", view)]
    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        probe = compose(config_name="unlearn", overrides=[*base, "output_dir=unused"])
    if str(probe.get("restrict")) == "forget_mask":  # the validation people's own masks, not the forget people's
        base.append(f"restrict=groups:{','.join(map(str, groups))}")
    tasks = [f"lacuna_{field}_{STOP_METRICS[metric]}"]
    curve: dict[int, dict[str, Any]] = {}

    def validation_run(extra: list[str], what: str) -> tuple[Path, dict[str, Any]]:
        overrides_of_run = [*base, *extra]

        def build(tmp: Path) -> None:
            run_overrides(overrides_of_run, tmp / "model")

        key = {"testbed": ctx["tb_key"], "overrides": [o for o in overrides_of_run if not o.startswith(("testbed=", "data="))],
               "validation": True}  # fmt: skip
        stage = stages.get("unlearn", f"[{field}] validation run of {label} ({what})", key, build)
        model = stage / "model"
        manifest = json.loads((model / "unlearn_manifest.json").read_text())
        u_key = output_key(stage)
        for snap in sorted((model / "snapshots").glob("step-*")):
            step = int(snap.name.split("-", 1)[1])
            if step in curve:
                continue
            results, persons = eval_stage(
                stages, f"[{field}] validation leak of {label} at step {step}", snap,
                {"model": u_key, "snapshot": snap.name}, tasks, view, cfg,
            )  # fmt: skip
            beh = behaviour(results, field, view, persons)
            curve[step] = {"step": step, metric: beh.get(metric), "n": (beh.get("n") or {}).get(metric)}
        return model, manifest

    points = int(scfg["points"])
    _model, manifest = validation_run(
        [f"trainer.args.snapshots={points}", "trainer.args.snapshot_spacing=log"], "log-spaced snapshots"
    )
    total = int(manifest.get("scheduled_steps") or manifest["steps"])
    tolerance = max(1, math.floor(float(scfg["resolution"]) * total))
    chosen = choose_step(list(curve.values()), metric, threshold)
    rounds = 0
    while chosen["reached"] and chosen["step"] - chosen["previous"] > tolerance and rounds < 2:
        lo, hi = chosen["previous"], chosen["step"]
        inside = sorted({lo + max(1, round((hi - lo) * k / (points + 1))) for k in range(1, points + 1)} - {hi})
        inside = [s for s in inside if lo < s < hi and s not in curve]
        if not inside:
            break
        steps = "[" + ",".join(map(str, inside)) + "]"
        validation_run(
            [f"trainer.args.snapshot_steps={steps}", f"trainer.args.stop_at_step={hi}"], f"steps {lo}-{hi} refined"
        )
        chosen = choose_step(list(curve.values()), metric, threshold)
        rounds += 1
    return {
        "metric": metric,
        "threshold": threshold,
        "people": len({r["ID"] for r in people}),
        "validation_groups": groups,
        "validation_steps": total,
        "chosen_validation_step": chosen["step"],
        "fraction": chosen["step"] / total,
        "reached": chosen["reached"],
        "resolved_within_steps": chosen["step"] - chosen["previous"] if chosen["reached"] else None,
        "tolerance_steps": tolerance,
        "refinement_rounds": rounds,
        "curve": [curve[s] for s in sorted(curve)],
    }
