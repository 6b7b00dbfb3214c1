"""The composite score (docs/definitions.md#localization-precision): 5-fold cross-validated logistic regression on a
subsample of the scalars, with the other scores as features.

The scorer collects the features of a seeded subsample while it walks the checkpoints
(:mod:`lacuna_metrics.localization.precision`); :func:`fit_composite` fits the model on them once the walk is done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import numpy as np

from lacuna_metrics.localization.auc import TARGETS, binned_roc, roc_auc

__all__ = ["composite_model", "fit_composite", "out_of_fold_proba", "sample_roc", "warm_composite"]


def composite_model() -> Any:
    """The composite's classifier (docs/definitions.md#localization-precision): ``StandardScaler`` then
    ``LogisticRegression(C=1, lbfgs, max_iter=1000)``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000))


def warm_composite() -> None:
    """Import what the composite's fits use and fit it once on a toy problem (scipy's optimiser loads lazily)."""
    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    composite_model().fit(x, np.arange(10) % 2 == 0)


def out_of_fold_proba(
    problems: Mapping[str, tuple[np.ndarray, np.ndarray]], folds: int, threads: int
) -> dict[str, np.ndarray]:
    """``cross_val_predict(composite_model(), x, y, cv=StratifiedKFold(folds), method="predict_proba")[:, 1]``
    for every ``name: (x, y)``, bit for bit, with all the problems' fits in one pool of ``threads``.

    Why not ``cross_val_predict`` itself: called once per target, each call's pool idles while its last fold
    fits (5 folds on 2 threads), and the three targets' fits run one call after another. Here the 3 × 5 fits are
    scheduled together, largest first, one BLAS/OpenMP thread each (nested pools only contend).
    """
    from sklearn.base import clone
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    model = composite_model()
    out = {name: np.empty(y.size) for name, (_x, y) in problems.items()}
    jobs = [
        (name, train, test)
        for name, (_x, y) in problems.items()
        for train, test in StratifiedKFold(n_splits=folds).split(np.zeros(y.size), y)
    ]

    def fit(job: tuple[str, np.ndarray, np.ndarray]) -> None:
        name, train, test = job
        x, y = problems[name]
        out[name][test] = clone(model).fit(x[train], y[train]).predict_proba(x[test])[:, 1]

    with threadpool_limits(limits=1), ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lacuna-lr") as pool:
        for future in [pool.submit(fit, job) for job in sorted(jobs, key=lambda j: -j[1].size)]:
            future.result()
    return out


def sample_roc(scores: np.ndarray, positive: np.ndarray, max_points: int) -> dict[str, list[float]]:
    """ROC points of per-sample ``scores`` (ties grouped into one step), as :meth:`StreamingAUC.roc_curve` gives."""
    _values, bins = np.unique(scores, return_inverse=True)
    pos = np.bincount(bins.ravel(), weights=positive.astype(np.float64), minlength=_values.size)
    neg = np.bincount(bins.ravel(), minlength=_values.size) - pos
    return binned_roc(pos, neg, max_points)


def fit_composite(
    names: Sequence[str],
    features: Sequence[np.ndarray],
    feature_cats: Sequence[np.ndarray],
    *,
    folds: int,
    threads: int,
    roc_points: int,
    pool: Executor,
) -> dict[str, Any]:
    """The composite's section of score.json from the sampled ``features`` (rows) and their categories.

    A target whose samples have every feature constant (nothing moved: a zero update) scores 0.5, a constant
    score, without fits: cross-validated, an intercept-only model's probabilities differ between folds only by
    their training folds' class shares, which would rank whole folds against each other (AUC ≈ 0.4999). The
    AUCs of the out-of-fold probabilities are sorted on ``pool`` (no GIL)."""
    x = np.concatenate(features)
    cats = np.concatenate(feature_cats)
    out: dict[str, Any] = {"features": list(names), "samples": int(x.shape[0]), "folds": folds}
    problems: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for target, (pos, neg) in TARGETS.items():
        keep = np.isin(cats, pos + neg)
        y = np.isin(cats[keep], pos)
        if min(int(y.sum()), int((~y).sum())) < folds:
            continue
        problems[target] = (x[keep], y)
    constant = {t for t, (xt, _y) in problems.items() if bool((xt == xt[:1]).all())}  # no feature varies
    fitted = {t: problems[t] for t in problems if t not in constant}
    probas = out_of_fold_proba(fitted, folds, threads)
    aucs = {t: pool.submit(roc_auc, proba, problems[t][1]) for t, proba in probas.items()}
    out["auc"] = {t: 0.5 if t in constant else aucs[t].result() if t in aucs else None for t in TARGETS}
    out["roc"] = {  # out-of-fold probabilities' ROC; a constant score is the diagonal
        t: {"fpr": [0.0, 1.0], "tpr": [0.0, 1.0]}
        if t in constant
        else sample_roc(probas[t], problems[t][1], roc_points)
        for t in problems
    }
    return out
