"""A method-free classifier of the masks from the weights' magnitudes alone (the leak audit's ``trace_classifier``).

Does a testbed carry a *magnitude trace* of its masks: could a detector that knows nothing of any unlearning
method tell masked scalars from the others by |θ_before| and |θ_before − θ_base| (the injection's displacement)?
The leak audit's ``before_magnitude`` and ``injection_magnitude`` rank scalars by one feature each, pooled over
tensors; this classifier learns from both at once, per tensor, and in curved shapes (a band of middling values, not
only "larger"): the kind of check LACUNA's release passes (a classifier on the weights cannot find the masks).

The classifier, per target (``forget``, ``unified``, ``forget_vs_retain``; docs/definitions.md#localization-precision):

* a seeded sample of the localization universe (:class:`~lacuna_metrics.localization.universe.Universe`: masked
  attention/MLP tensors with forget and other scalars), each tensor sampled in proportion to its size;
* features per sampled scalar: the within-tensor quantile (mid-ranks over the tensor's sample) of |θ_before| and,
  with a ``base``, of |θ_before − θ_base|; quantiles remove the tensors' scales, which say nothing of the masks
  (mask bits are drawn i.i.d. per scalar);
* a logistic regression on the cubic polynomial of those quantiles (so a band of middling values, or one feature
  mattering only where the other is large, is found, not only "larger"), fitted on ``folds − 1`` seeded folds and
  scored on the held-out one, so every AUC is out of fold: on a testbed without a trace it sits at 0.5 ± noise
  (± ~0.005 at the default 200,000 samples), a little below rather than above.

:func:`classify_trace` works on tensors in memory (benchmarks probe a model during injection with it);
:func:`trace_classifier_aucs` reads a testbed's checkpoints and masks as the scorer does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lacuna_metrics.localization.auc import FORGET, TARGETS, roc_auc
from lacuna_metrics.localization.families import categories
from lacuna_tasks import stable_seed

__all__ = ["TRACE_CLASSIFIER", "classify_trace", "method_free_aucs", "sample_features", "trace_classifier_aucs"]

#: The detector's name in the leak audit's ``trivial`` table.
TRACE_CLASSIFIER = "trace_classifier"

PathLike = str | os.PathLike[str]


def _quantiles(values: np.ndarray) -> np.ndarray:
    """Mid-rank quantiles in [0, 1] (ties share one value, so a block of equal values is one cell)."""
    from scipy.stats import rankdata

    n = values.size
    return (rankdata(values, method="average") - 0.5) / max(1, n)


def sample_features(
    tensors: Iterable[tuple[str, torch.Tensor, torch.Tensor | None, torch.Tensor]],
    *,
    total: int,
    samples: int,
    seed: int,
    min_per_tensor: int = 500,
) -> tuple[np.ndarray, np.ndarray]:
    """``(features [n, 1 or 2], categories [n])`` of a seeded sample of scalars: for each ``(name, before, base,
    cats)`` (``cats``: uint8 categories per scalar, :func:`~lacuna_metrics.localization.families.categories`),
    ``samples × numel / total`` scalars (at least ``min_per_tensor``, at most all), their within-tensor quantiles
    of |before| and of |before − base| (the second column only with a base). Each tensor's sample is seeded by its
    name; the rows follow the order of ``tensors`` (the callers sort them by name)."""
    feats: list[np.ndarray] = []
    cats_out: list[np.ndarray] = []
    for name, before, base, cats in tensors:
        flat = before.reshape(-1).to(torch.float32)
        n = flat.numel()
        k = min(n, max(min_per_tensor, round(samples * n / max(1, total))))
        gen = torch.Generator().manual_seed(stable_seed("trace-classifier", seed, name))
        idx = torch.randperm(n, generator=gen)[:k]
        cols = [_quantiles(flat[idx].abs().numpy())]
        if base is not None:
            cols.append(_quantiles((flat[idx] - base.reshape(-1).to(torch.float32)[idx]).abs().numpy()))
        feats.append(np.stack(cols, axis=1))
        cats_out.append(cats.reshape(-1)[idx].numpy())
    if not feats:
        raise ValueError("trace classifier: no tensor to sample")
    return np.concatenate(feats), np.concatenate(cats_out)


def classify_trace(
    features: np.ndarray, cats: np.ndarray, *, seed: int = 0, folds: int = 5, degree: int = 3
) -> dict[str, float | None]:
    """Out-of-fold ROC-AUC per target (None: a class is missing) of a logistic regression on the polynomial of
    ``degree`` in the features (quantiles in [0, 1]: cubic terms fit a band of middling values, or one feature
    mattering only where the other is large), fitted on ``folds − 1`` seeded folds and scored on the held-out one."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import PolynomialFeatures

    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2 or features.shape[0] != len(cats):
        raise ValueError(f"trace classifier: features {features.shape} do not match {len(cats)} categories")
    design = PolynomialFeatures(degree, include_bias=False).fit_transform(features - 0.5)
    rng = np.random.default_rng(stable_seed("trace-classifier-folds", seed))
    fold = rng.permutation(len(cats)) % folds
    out: dict[str, float | None] = {}
    for target, (pos_cats, neg_cats) in TARGETS.items():
        pos = np.isin(cats, pos_cats)
        keep = pos | np.isin(cats, neg_cats)
        if not pos[keep].any() or pos[keep].all():
            out[target] = None
            continue
        scores = np.zeros(len(cats))
        for f in range(folds):
            train, test = keep & (fold != f), keep & (fold == f)
            model = LogisticRegression(max_iter=1000).fit(design[train], pos[train])
            scores[test] = model.decision_function(design[test])
        out[target] = float(roc_auc(scores[keep], pos[keep]))
    return out


def method_free_aucs(
    tensors: Iterable[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]],
    forget_bits: int,
    retain_bits: int,
    *,
    samples: int = 200_000,
    seed: int = 0,
) -> dict[str, dict[str, float | None]]:
    """The leak audit's trivial detectors on tensors in memory, ``(name, before, base, packed mask)`` each (tensors
    with no forget scalar or nothing but forget scalars are left out, as the scorer's universe leaves them):
    ``{detector: {target: AUC}}`` for ``before_magnitude`` and ``injection_magnitude`` (exact, every scalar) and
    :data:`TRACE_CLASSIFIER` (the sample). For probing a model during injection without saving it
    (benchmarks/bench_memorization_curve.py --trace); a testbed on disk: the leak audit."""
    items = []
    for name, before, base, packed in tensors:
        cats = categories(packed, forget_bits, retain_bits)
        n_forget = int((cats == FORGET).sum())
        if 0 < n_forget < cats.numel():
            items.append((name, before.detach().reshape(-1).float(), base.detach().reshape(-1).float(), cats))
    if not items:
        raise ValueError("method-free AUCs: no tensor holds both forget and other scalars")
    items.sort(key=lambda item: item[0])  # the sample (and its folds) in name order, as on disk
    all_cats = torch.cat([c for *_, c in items]).numpy()
    columns = {
        "before_magnitude": torch.cat([b.abs() for _, b, _, _ in items]).numpy(),
        "injection_magnitude": torch.cat([(b - r).abs() for _, b, r, _ in items]).numpy(),
    }
    out: dict[str, dict[str, float | None]] = {}
    for detector, scores in columns.items():
        out[detector] = {}
        for target, (pos_cats, neg_cats) in TARGETS.items():
            keep = np.isin(all_cats, pos_cats + neg_cats)
            pos = np.isin(all_cats[keep], pos_cats)
            out[detector][target] = float(roc_auc(scores[keep], pos)) if 0 < pos.sum() < pos.size else None
    total = sum(b.numel() for _, b, _, _ in items)
    features, cats = sample_features(items, total=total, samples=samples, seed=seed)
    out[TRACE_CLASSIFIER] = classify_trace(features, cats, seed=seed)
    return out


def trace_classifier_aucs(
    before: PathLike,
    masks: PathLike,
    *,
    base: PathLike | None = None,
    samples: int = 200_000,
    seed: int = 0,
    folds: int = 5,
    degree: int = 3,
) -> dict[str, Any]:
    """:func:`classify_trace` of a checkpoint pair on disk: ``{"auc": {target: AUC}, "samples": n, ...}`` over the
    scorer's universe (masked attention/MLP tensors with forget and other scalars)."""
    from lacuna_metrics.localization.universe import Universe
    from lacuna_metrics.masks import MaskReader
    from lacuna_metrics.weights.checkpoints import Checkpoint

    before_ck = Checkpoint(before)
    base_ck = Checkpoint(base) if base is not None else None
    reader = MaskReader(masks)
    universe = Universe(before_ck, before_ck, reader)
    names = sorted(universe.members)  # name order: the sample and its folds do not depend on the file's order
    total = sum(before_ck.info(n).numel for n in names)

    def tensors():
        for name in names:
            shape = before_ck.shape(name)
            packed = reader.read(name, shape, 0, shape[0] if shape else 1)
            cats = categories(packed, int(reader.forget_bits), int(reader.retain_bits))
            yield name, before_ck.read(name), (base_ck.read(name) if base_ck is not None else None), cats

    features, cats = sample_features(tensors(), total=total, samples=samples, seed=seed)
    aucs = classify_trace(features, cats, seed=seed, folds=folds, degree=degree)
    return {
        "auc": aucs,
        "samples": int(len(cats)),
        "features": ["before_magnitude_quantile"] + (["injection_magnitude_quantile"] if base is not None else []),
        "classifier": f"logistic regression on the degree-{degree} polynomial of the within-tensor quantiles, "
        f"{folds}-fold out of fold",
        "seed": seed,
        "inputs": {"before": str(Path(before)), "base": str(Path(base)) if base is not None else None},
    }
