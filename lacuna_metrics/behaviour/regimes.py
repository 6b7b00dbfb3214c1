"""Four forgetting regimes: is the forgetting undone by relearning, and did it break the rest?
(docs/definitions.md#forgetting-regimes)

"Unlearning Isn't Deletion" sorts unlearned models on two axes, each read here as the paper defines it:

* **Reversibility** from the absolute gap left after restricted relearning (docs/definitions.md#restricted-relearning),
  Δr(T_f) = E(θ₀, T_f) − E(θ_r, T_f): the forget-set accuracy of the original model minus that of the relearned one.
  Reversible iff ``Δr < tau_rev`` (relearning brings the facts back to within ``tau_rev`` of where they were). The
  earlier rule, the recovery ratio ``ρ = (A_rel − A_unl) / (A_orig − A_unl)`` with reversible iff ``ρ >= tau_rev``, is
  kept as ``rule="relative"`` (it calls a method that removed 1 of 5 facts and kept it removed irreversible).
* **Catastrophicity** from retained ability that no unlearning loss trained on (the paper's ideal needs Δu(T_r) ≈ 0
  on retained ability *and* utility): the drop of held-out retain accuracy (people no loss saw), the drop of
  cross-field retention (the forget people's other fields), and the held-out neutral perplexity ratio. Catastrophic
  iff any measured drop exceeds ``tau_cat`` or the perplexity ratio exceeds ``tau_ppl``; the retain rows a retain loss
  trains on are never read. Each input's value and verdict is recorded, and an input that was not measured is
  listed as such; with none measured, catastrophicity is unknown and the regime is ``undetermined``.

The thresholds are the project's (the paper states the quantities, not a cut-off): explicit, configurable and
recorded with every result. The ideal regime is ``irreversible_noncatastrophic``.

For LACUNA tasks "forget accuracy" is the forget-side ``leak_rate`` of the QA tasks (see :func:`accuracies_from_lm_eval`).

Definitions: ``docs/definitions.md#forgetting-regimes``, ``#restricted-relearning``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from lacuna_tasks import metric_value, read_lm_eval_results

__all__ = [
    "CATASTROPHIC_INPUTS",
    "DEFAULT_METRICS",
    "IDEAL_REGIME",
    "NO_FORGETTING",
    "REGIMES",
    "REVERSIBILITY_RULES",
    "UNDETERMINED",
    "accuracies_from_lm_eval",
    "classify_regime",
    "leak_separation",
    "recovery_ratio",
    "wilson_interval",
]

REGIMES: tuple[str, ...] = (
    "reversible_noncatastrophic",
    "reversible_catastrophic",
    "irreversible_catastrophic",
    "irreversible_noncatastrophic",
)
#: Forgetting that relearning cannot undo, at no cost to retained knowledge.
IDEAL_REGIME = "irreversible_noncatastrophic"
#: Returned instead of a regime when unlearning did not lower forget accuracy: there is nothing to recover.
NO_FORGETTING = "no_forgetting"
#: Returned when an axis cannot be read (nothing measured on the catastrophic axis, or controls that do not separate).
UNDETERMINED = "undetermined"
#: The reversibility rules: the paper's absolute gap Δr(T_f), or the recovery ratio (the earlier, relative form).
REVERSIBILITY_RULES: tuple[str, ...] = ("absolute", "relative")
#: What the catastrophic axis reads: retained ability measured on people and text no unlearning loss saw.
CATASTROPHIC_INPUTS: dict[str, str] = {
    "retain_eval_accuracy": "held-out retain QA accuracy (people no unlearning loss saw): drop > tau_cat",
    "crossfield_accuracy": "cross-field retention (the forget people's other fields): drop > tau_cat",
    "neutral_ppl_ratio": "held-out neutral word perplexity after / before: ratio > tau_ppl",
}
#: Metric names of the LACUNA QA tasks (``lacuna_<field>_forget_qa`` / ``lacuna_<field>_retain_qa``).
DEFAULT_METRICS: tuple[str, str] = ("leak_rate", "accuracy")
#: Default tolerance: a forget-accuracy drop at or below this is "nothing was removed".
DEFAULT_EPS = 1e-9


def _accuracy(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


def _threshold(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def recovery_ratio(a_orig_f: float, a_unl_f: float, a_rel_f: float, *, eps: float = DEFAULT_EPS) -> float:
    """``(A_rel_f - A_unl_f) / (A_orig_f - A_unl_f)``: the share of the removed forget accuracy that relearning
    brought back (the ``relative`` rule). 1 = fully restored, 0 = nothing restored; not clipped (> 1: relearning
    overshoots the original, < 0: relearning lowered it further).

    Degenerate denominator: if ``A_orig_f - A_unl_f <= eps`` unlearning removed nothing (or made the model better on
    the forget set), so "recovery" is undefined: returns NaN, and :func:`classify_regime` reports
    ``"no_forgetting"``. Inputs must lie in [0, 1] (ValueError naming the argument).
    """
    orig = _accuracy("a_orig_f", a_orig_f)
    unl = _accuracy("a_unl_f", a_unl_f)
    rel = _accuracy("a_rel_f", a_rel_f)
    eps = _threshold("eps", eps)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    removed = orig - unl
    if removed <= eps:
        return float("nan")
    return (rel - unl) / removed


def _catastrophic(
    retained: Mapping[str, tuple[float | None, float | None]],
    ppl_ratio: float | None,
    *,
    tau_cat: float,
    tau_ppl: float,
    relative: bool,
) -> tuple[bool | None, dict[str, Any]]:
    """The catastrophic verdict and, per input of :data:`CATASTROPHIC_INPUTS`, its value and verdict (None: not
    measured)."""
    unknown = [k for k in retained if k not in CATASTROPHIC_INPUTS or k == "neutral_ppl_ratio"]
    if unknown:
        raise ValueError(f"catastrophic inputs {unknown}: choose from {list(CATASTROPHIC_INPUTS)[:2]}")
    inputs: dict[str, Any] = {}
    for name in ("retain_eval_accuracy", "crossfield_accuracy"):
        orig, unl = retained.get(name, (None, None))
        if orig is None or unl is None:
            inputs[name] = {"measured": False}
            continue
        orig, unl = _accuracy(f"{name} (original)", orig), _accuracy(f"{name} (unlearned)", unl)
        drop = orig - unl
        if relative:
            drop = drop / orig if orig > 0 else 0.0
        inputs[name] = {
            "measured": True,
            "original": orig,
            "unlearned": unl,
            "drop": drop,
            "catastrophic": drop > tau_cat,
        }
    if ppl_ratio is None:
        inputs["neutral_ppl_ratio"] = {"measured": False}
    else:
        ratio = float(ppl_ratio)
        if not ratio > 0 or math.isnan(ratio):
            raise ValueError(f"neutral_ppl_ratio must be a positive number, got {ppl_ratio!r}")
        inputs["neutral_ppl_ratio"] = {"measured": True, "ratio": ratio, "catastrophic": ratio > tau_ppl}
    verdicts = [v["catastrophic"] for v in inputs.values() if v["measured"]]
    return (any(verdicts) if verdicts else None), inputs


def classify_regime(
    a_orig_f: float,
    a_unl_f: float,
    a_rel_f: float,
    *,
    retained: Mapping[str, tuple[float | None, float | None]] | None = None,
    ppl_ratio: float | None = None,
    tau_rev: float = 0.5,
    tau_cat: float = 0.2,
    tau_ppl: float = 2.0,
    rule: str = "absolute",
    relative: bool = False,
    eps: float = DEFAULT_EPS,
) -> dict[str, Any]:
    """The forgetting regime of one unlearned model (docs/definitions.md#forgetting-regimes).

    ``a_*_f``: forget-set accuracy (leak) of the original, unlearned and relearned models, in [0, 1]. ``retained``:
    ``{"retain_eval_accuracy" | "crossfield_accuracy": (original, unlearned)}`` (None where not measured);
    ``ppl_ratio``: held-out neutral perplexity after / before (None: not measured). ``rule="absolute"`` (default):
    reversible iff ``Δr = A_orig_f − A_rel_f < tau_rev``; ``"relative"``: iff the recovery ratio ``>= tau_rev``.
    Catastrophic iff a measured retained-ability drop exceeds ``tau_cat`` (``relative``: divided by the original) or
    the perplexity ratio exceeds ``tau_ppl``. When unlearning removed nothing the regime is ``no_forgetting``; with
    nothing measured on the catastrophic axis it is ``undetermined``. Returns a JSON-able dict ``{regime, ideal,
    reversible, catastrophic, forget_gap, recovery_ratio, catastrophic_inputs, thresholds}``.
    """
    if rule not in REVERSIBILITY_RULES:
        raise ValueError(f"rule must be one of {REVERSIBILITY_RULES}, got {rule!r}")
    tau_rev = _threshold("tau_rev", tau_rev)
    tau_cat = _threshold("tau_cat", tau_cat)
    tau_ppl = _threshold("tau_ppl", tau_ppl)
    rho = recovery_ratio(a_orig_f, a_unl_f, a_rel_f, eps=eps)
    gap = float(a_orig_f) - float(a_rel_f)
    catastrophic, inputs = _catastrophic(retained or {}, ppl_ratio, tau_cat=tau_cat, tau_ppl=tau_ppl, relative=relative)
    thresholds = {
        "rule": rule, "tau_rev": tau_rev, "tau_cat": tau_cat, "tau_ppl": tau_ppl, "relative": bool(relative),
        "eps": float(eps),
    }  # fmt: skip
    out: dict[str, Any] = {
        "forget_gap": gap,
        "recovery_ratio": None if math.isnan(rho) else rho,
        "catastrophic": catastrophic,
        "catastrophic_inputs": inputs,
        "thresholds": thresholds,
    }
    if math.isnan(rho):
        return {"regime": NO_FORGETTING, "ideal": False, "reversible": None, **out}
    reversible = gap < tau_rev if rule == "absolute" else rho >= tau_rev
    if catastrophic is None:
        reason = "nothing measured on the catastrophic axis (held-out retain, cross-field, neutral perplexity)"
        return {"regime": UNDETERMINED, "ideal": False, "reversible": reversible, "reason": reason, **out}
    regime = f"{'reversible' if reversible else 'irreversible'}_{'catastrophic' if catastrophic else 'noncatastrophic'}"
    return {"regime": regime, "ideal": regime == IDEAL_REGIME, "reversible": reversible, **out}


def wilson_interval(k: int, n: int, *, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the rate ``k / n`` (the building block of :func:`leak_separation`)."""
    from scipy.stats import norm

    if not (isinstance(k, int) and isinstance(n, int)) or n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson_interval needs 0 <= k <= n and n >= 1 (integers), got k={k!r}, n={n!r}")
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def leak_separation(k: int, n: int, k0: int, n0: int, *, level: float = 0.95) -> dict[str, Any]:
    """Does the rate ``k / n`` exceed ``k0 / n0`` by more than their interval? Newcombe's hybrid score interval
    (method 10 of Newcombe 1998, from two Wilson intervals) for the difference ``k/n − k0/n0``; ``separated`` when
    its lower end is above 0. Used to tell relearning (a leak that comes back) from learning afresh (the negative
    control's leak on people the model never saw, at the same budget)."""
    lo1, hi1 = wilson_interval(k, n, level=level)
    lo0, hi0 = wilson_interval(k0, n0, level=level)
    p1, p0 = k / n, k0 / n0
    low = (p1 - p0) - math.sqrt((p1 - lo1) ** 2 + (hi0 - p0) ** 2)
    high = (p1 - p0) + math.sqrt((hi1 - p1) ** 2 + (p0 - lo0) ** 2)
    return {
        "separated": low > 0,
        "difference": p1 - p0,
        "interval": [low, high],
        "level": level,
        "method": "newcombe_hybrid_score",
        "counts": {"k": k, "n": n, "k0": k0, "n0": n0},
    }


def accuracies_from_lm_eval(
    results_json_path: str | os.PathLike[str],
    forget_task: str,
    retain_task: str,
    metric: str | tuple[str, str] | None = None,
    *,
    filter_name: str | None = None,
) -> tuple[float, float]:
    """``(forget accuracy, retain accuracy)`` read from lm-eval results (``results[task]["<metric>,<filter>"]``).

    ``metric`` None uses :data:`DEFAULT_METRICS`: ``leak_rate`` for the forget task and ``accuracy`` for the retain
    task, the metrics of ``lacuna_<field>_forget_qa`` / ``lacuna_<field>_retain_qa``; a string uses one metric for
    both; a pair is ``(forget_metric, retain_metric)``. ``results_json_path`` is the file or an lm-eval
    ``--output_path`` directory, and ``filter_name`` None reads the ``none`` filter or a metric's only one: the
    rules of :mod:`lacuna_tasks.harness.results` (docs/ci.md, "Which lm-eval results file"; a directory means the
    newest run of its one model). Values must be in [0, 1].
    """
    if metric is None:
        metrics = DEFAULT_METRICS
    elif isinstance(metric, str):
        metrics = (metric, metric)
    else:
        metrics = tuple(metric)
        if len(metrics) != 2 or not all(isinstance(m, str) for m in metrics):
            raise ValueError(f"metric must be a name or a (forget, retain) pair of names, got {metric!r}")
    path, doc = read_lm_eval_results(results_json_path)
    results = doc["results"]
    values = []
    for side, task, name in (("forget", forget_task, metrics[0]), ("retain", retain_task, metrics[1])):
        if task not in results:
            raise ValueError(f"{path}: no results for {side} task {task!r} (found: {sorted(results)})")
        value = metric_value(results[task], name, filter_name)
        key = name if filter_name is None else f"{name},{filter_name}"
        if value is None:
            entry = results[task] if isinstance(results[task], dict) else {}
            found = sorted(k for k in entry if "," in k and "_stderr" not in k)
            if filter_name is None and any(k.startswith(f"{name},") for k in found):
                raise ValueError(
                    f"{path}: task {task!r} has metric {name!r} under several filters and none is 'none'; "
                    f"choose one with filter_name (found: {found})"
                )
            raise ValueError(f"{path}: task {task!r} has no metric {key!r} (found: {found})")
        values.append(_accuracy(f"{task} {key}", value))
    return values[0], values[1]
