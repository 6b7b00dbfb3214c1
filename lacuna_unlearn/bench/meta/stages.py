"""The meta-evaluation's own stages, cached in the run's stage cache beside the run's (docs/meta.md).

Each reads a model the run already produced (by its path and content key) or builds one from the testbed's model:

* the noise controls: method-free updates at the pool's median L2, through the run's own method pipeline
  (:func:`~lacuna_unlearn.bench.method_stages.method_entry`), so they have every predictor and outcome the methods
  have;
* the forget-side behaviour of a model (every metric of :data:`FORGET_SIDE`), after restricted relearning from the
  forget rows and after round-to-nearest quantization to 8 and 4 bits (metric robustness);
* representation diagnostics against the testbed's model (mean PCA distance, CKA, Fisher shift);
* light perturbations of the testbed's model, evaluated on its forget people (it knows them) and on people it never
  saw (faithfulness).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.behaviour import behaviour, eval_stage
from lacuna_unlearn.bench.metric_table import METRIC_TABLE
from lacuna_unlearn.bench.reversibility import negative_control, relearn_and_evaluate, unseen_people
from lacuna_unlearn.bench.stages import Stages, output_key
from lacuna_unlearn.dataclass_config import path_override

__all__ = [
    "FORGET_SIDE",
    "diagnostics",
    "forget_side_tasks",
    "knows_and_never_learned",
    "model_key",
    "noise_control",
    "quantized_behaviour",
    "reference_relearning",
    "relearned_behaviour",
]

#: The behaviour metrics whose faithfulness and robustness are measured: the forget side, per person.
FORGET_SIDE = ("forget_leak", "j_w", "j_p", "j_icr", "em", "es", "prob")

#: Query texts of the representation diagnostics (forget split, LACUNA QA format).
DIAGNOSE_TEXTS = 64


def forget_side_tasks(ctx: Mapping[str, Any], field: str) -> list[str]:
    """The lm-eval tasks that compute :data:`FORGET_SIDE` for ``field`` (from METRIC_TABLE, in order), among those
    the run evaluates (its ``eval.tasks``; a metric whose task the run leaves out stays undefined, as in the run)."""
    tasks = list(dict.fromkeys(f"lacuna_{field}_{METRIC_TABLE[m].task}" for m in FORGET_SIDE))
    group = set(ctx["group"])
    return tasks if f"lacuna_{field}" in group else [t for t in tasks if t in group]


def model_key(ctx: Mapping[str, Any], model: Path) -> str:
    """The content key of a model: the testbed's key for its own model, the key of the stage that wrote it, else
    (a snapshot along a schedule, a checkpoint listed to ``lacuna meta``) its weights' content fingerprint, which
    hashes every byte: compute it once per model and pass it on."""
    from lacuna_metrics import Checkpoint

    model = Path(model)
    if model == Path(ctx["before"]):
        return str(ctx["tb_key"])
    if (model.parent / "stage.json").is_file():
        return output_key(model.parent)
    return Checkpoint(model).fingerprint()


def _values(b: Mapping[str, Any]) -> dict[str, float | None]:
    return {m: b.get(m) for m in FORGET_SIDE}


def noise_control(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    method: str,
    size: float,
    seed: int,
    baseline: Mapping[str, Any],
) -> dict[str, Any]:
    """One method-free update (``method``: ``null_gaussian`` / ``null_weight_decay``) of relative size ``size`` as a
    run entry: unlearn (the update), evaluate, score, attack, restricted relearning, as every method."""
    from lacuna_unlearn.bench.method_stages import method_entry

    overrides = [f"method.args.size={size:.6g}"]
    entry = method_entry(stages, cfg, ctx, field, method, overrides, seed, baseline)
    entry["noise_size"] = float(f"{size:.6g}")
    return entry


def relearned_behaviour(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    key: str,
    seed: int,
) -> dict[str, float | None]:
    """The forget-side metrics of ``model`` (content key ``key``, :func:`model_key`) after restricted relearning
    from the forget rows (the run's relearning stage, reused; only the evaluation is new)."""
    rel = relearn_and_evaluate(
        stages, cfg, ctx, field, label, model, key, seed, "forget", tasks=forget_side_tasks(ctx, field)
    )
    return _values(rel)


def reference_relearning(
    stages: Stages, cfg: Mapping[str, Any], ctx: Mapping[str, Any], field: str, seed: int, people: int
) -> dict[str, Any]:
    """The never-learned reference of OpenUnlearning's relearning robustness: the testbed's model on the negative
    control's people, before and after the same relearning (forget-side metrics)."""
    neg = negative_control(stages, cfg, ctx, field, seed, people, tasks=forget_side_tasks(ctx, field))
    return {
        "before": _values(neg["behaviour_before"]),
        "after": _values(neg["behaviour_relearned"]),
        "data": neg["data"],
    }


def quantized_behaviour(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    label: str,
    model: Path,
    key: str,
    bits: int,
) -> dict[str, float | None]:
    """The forget-side metrics of ``model`` (content key ``key``) quantized to ``bits`` bits (round-to-nearest per
    row, dequantized: :func:`lacuna_metrics.quantize_checkpoint`)."""
    from lacuna_metrics import quantize_checkpoint

    q_stage = stages.get(
        "quantize", f"[{field}] quantize {label} to {bits} bits", {"model": key, "bits": bits},
        lambda tmp: quantize_checkpoint(model, tmp / "model", bits),
    )  # fmt: skip
    evaluated, persons = eval_stage(
        stages, f"[{field}] evaluate {label} at {bits} bits", q_stage / "model", {"model": output_key(q_stage)},
        forget_side_tasks(ctx, field), ctx["data"], cfg,
    )  # fmt: skip
    return _values(behaviour(evaluated, field, ctx["data"], persons))


def diagnostics(
    stages: Stages, ctx: Mapping[str, Any], field: str, label: str, model: Path, key: str
) -> dict[str, float | None]:
    """Representation diagnostics of ``model`` (content key ``key``) against the testbed's model on the forget split's QA text (every
    field's rows, up to :data:`DIAGNOSE_TEXTS`): the mean
    PCA distance, the mean linear CKA over the transformer layers, and the Fisher shift (mean over layers of
    |log10 mean Fisher(updated) − log10 mean Fisher(reference)|) (docs/meta.md)."""
    from lacuna_metrics import calibration_texts, diagnose_models

    def build(tmp: Path) -> None:
        # every field's forget rows: one field's (3 people on mini) leave the PCA plane undefined
        texts = calibration_texts(ctx["data"], "forget", DIAGNOSE_TEXTS)
        diagnose_models(ctx["before"], [model], texts, out_dir=tmp)

    stage = stages.get(
        "diagnose", f"[{field}] diagnose {label}", {"model": key, "reference": ctx["tb_key"],
        "texts": DIAGNOSE_TEXTS, "split": "forget, every field"}, build,
    )  # fmt: skip
    result = json.loads((stage / "diagnose.json").read_text())
    upd = result["updated"][0]
    layers = result.get("options", {}).get("mean_pca_distance", {}).get("layers") or []
    cka = [row.get("cka") for row in upd.get("per_layer") or [] if row.get("layer") in layers]
    cka = [c for c in cka if isinstance(c, (int, float))]
    shift = None
    ref_fisher, upd_fisher = (result.get("reference") or {}).get("fisher"), upd.get("fisher")
    if ref_fisher and upd_fisher:
        gaps = [
            abs(u["log10_mean"] - r["log10_mean"])
            for r, u in zip(ref_fisher["layers"], upd_fisher["layers"], strict=True)
            if r.get("log10_mean") is not None and u.get("log10_mean") is not None
        ]
        shift = sum(gaps) / len(gaps) if gaps else None
    return {
        "mean_pca_distance": upd.get("mean_pca_distance"),
        "cka": sum(cka) / len(cka) if cka else None,
        "fisher_shift": shift,
    }


def perturbed_model(
    stages: Stages, cfg: Mapping[str, Any], ctx: Mapping[str, Any], field: str, size: float, index: int
) -> Path:
    """A light method-free perturbation of the testbed's model (Gaussian, relative size ``size``, seed ``index``): a
    model that still knows the facts, for the faithfulness pools."""
    from lacuna_unlearn.trainer.app import run_overrides

    overrides = ["method=null_gaussian", f"method.args.size={size:.6g}", f"field={field}", f"seed={index}"]

    def build(tmp: Path) -> None:
        run_overrides([*overrides, path_override("testbed", ctx["testbed"])], tmp / "model")

    stage = stages.get(
        "unlearn", f"[{field}] light perturbation {index} of the testbed model", {"testbed": ctx["tb_key"],
        "overrides": overrides}, build,
    )  # fmt: skip
    return stage / "model"


def knows_and_never_learned(
    stages: Stages,
    cfg: Mapping[str, Any],
    ctx: Mapping[str, Any],
    field: str,
    seed: int,
    people: int,
    perturbations: int,
    size: float,
) -> dict[str, list[dict[str, float | None]]]:
    """The faithfulness pools of one field: the testbed's model and ``perturbations`` light perturbations of it,
    each evaluated on the forget people (``knows``) and on people none of them ever saw (``never_learned``, the
    negative control's people of ``seed``)."""
    unseen = unseen_people(stages, ctx, field, seed, people)
    models = [("the testbed model", ctx["before"])]
    models += [(f"perturbation {i}", perturbed_model(stages, cfg, ctx, field, size, i)) for i in range(perturbations)]
    pools: dict[str, list[dict[str, float | None]]] = {"knows": [], "never_learned": []}
    for label, model in models:
        for pool, data, data_key in (
            ("knows", ctx["data"], "testbed"),
            ("never_learned", unseen / "data", unseen.name),
        ):
            evaluated, persons = eval_stage(
                stages, f"[{field}] evaluate {label} on {'forget' if pool == 'knows' else 'unseen'} people", model,
                {"model": model_key(ctx, model), "data": data_key}, forget_side_tasks(ctx, field), data, cfg,
            )  # fmt: skip
            pools[pool].append(_values(behaviour(evaluated, field, data, persons)))
    return pools
