"""The meta-evaluation's statistics over a pool (docs/meta.md): Spearman's ρ of every predictor with every outcome
(pooled, and leaving each method out in turn), the noise controls' ranking, faithfulness and metric robustness."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lacuna_unlearn.bench.meta.pool import PoolModel

__all__ = ["correlations", "faithfulness", "robustness"]


def correlations(
    pool: Sequence[PoolModel], *, draws: int = 2000, seed: int = 0, top: float = 0.25
) -> dict[str, dict[str, Any]]:
    """predictor -> outcome -> ρ with its interval and n over the whole pool (noise controls included), the
    leave-one-method-out ρs (FRAG's circularity check: the range, and the method whose removal moves ρ most), and
    where the noise controls fall in the ranking the predictor implies (:func:`lacuna_metrics.noise_ranking`)."""
    from lacuna_metrics import leave_one_out, noise_ranking, spearman

    predictors = list(dict.fromkeys(k for m in pool for k in m.predictors))
    outcomes = list(dict.fromkeys(k for m in pool for k in m.outcomes))
    groups = [m.method for m in pool]
    noise = [m.noise for m in pool]
    out: dict[str, dict[str, Any]] = {}
    for p in predictors:
        x = [m.predictors.get(p) for m in pool]
        row: dict[str, Any] = {}
        for o in outcomes:
            y = [m.outcomes.get(o) for m in pool]
            cell = spearman(x, y, groups=groups, draws=draws, seed=seed)
            loo = leave_one_out(x, y, groups, method="fisher")  # only the ρs are read: no bootstrap
            rhos = {g: r["rho"] for g, r in loo.items() if r["rho"] is not None}
            if rhos and cell["rho"] is not None:
                swing = max(rhos, key=lambda g: abs(rhos[g] - cell["rho"]))
                cell["leave_one_method_out"] = {
                    "min": min(rhos.values()),
                    "max": max(rhos.values()),
                    "most_influential": swing,
                    "rho_without_it": rhos[swing],
                    "sign_flips": sorted(g for g, r in rhos.items() if r * cell["rho"] < 0),
                }
            else:
                cell["leave_one_method_out"] = None
            usable = [i for i in range(len(pool)) if x[i] is not None and y[i] is not None]
            cell["noise_controls"] = noise_ranking(
                [x[i] for i in usable], cell["rho"], [noise[i] for i in usable], top=top
            )
            row[o] = cell
        out[p] = row
    return out


def faithfulness(
    pools: Mapping[str, Sequence[Mapping[str, float | None]]],
    metrics: Sequence[str],
    *,
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """metric -> the AUC separating the ``knows`` evaluations from the ``never_learned`` ones, with its interval
    (:func:`lacuna_metrics.faithfulness_auc`; every forget-side metric rises with knowledge)."""
    from lacuna_metrics import faithfulness_auc

    return {
        m: faithfulness_auc(
            [e.get(m) for e in pools["knows"]], [e.get(m) for e in pools["never_learned"]], draws=draws, seed=seed
        )
        for m in metrics
    }


def robustness(
    models: Sequence[Mapping[str, Any]],
    metrics: Sequence[str],
    bits: Sequence[int],
    *,
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """metric -> OpenUnlearning's robustness over the models (each ``{"before", "relearned", "reference": {"before",
    "after"}, "quantized": {bits: values}}``): R under relearning, Q per bit width, and HM(R, Q) of their means at the
    narrowest width, each mean with its bootstrap interval and n (:mod:`lacuna_metrics.meta.robustness`)."""
    from lacuna_metrics import (
        UNDEFINED_RULES,
        harmonic_mean,
        mean_interval,
        quantization_robustness,
        relearning_robustness,
    )

    out: dict[str, Any] = {"undefined": UNDEFINED_RULES, "metrics": {}}
    for m in metrics:
        r_values = [
            relearning_robustness(
                e["before"].get(m),
                e["relearned"].get(m),
                e["reference"]["before"].get(m),
                e["reference"]["after"].get(m),
            )
            for e in models
        ]
        entry: dict[str, Any] = {"relearning": mean_interval(r_values, draws=draws, seed=seed)}
        for b in bits:
            q_values = [quantization_robustness(e["before"].get(m), e["quantized"][b].get(m)) for e in models]
            entry[f"quantization_{b}bit"] = mean_interval(q_values, draws=draws, seed=seed)
        if bits:
            narrow = entry[f"quantization_{min(bits)}bit"]["mean"]
            entry["aggregate"] = harmonic_mean(entry["relearning"]["mean"], narrow)
            entry["aggregate_bits"] = min(bits)
        out["metrics"][m] = entry
    return out
