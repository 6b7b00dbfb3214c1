"""Exact ROC-AUC (Mann-Whitney with ties counted one half), validated against scikit-learn."""

from __future__ import annotations

import numpy as np


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC-AUC of ``scores`` for binary ``labels``; NaN scores and one-class labels are errors."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores ({scores.shape}) and labels ({labels.shape}) differ in shape")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"ROC-AUC needs both classes (positives={n_pos}, negatives={n_neg})")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average ranks (1-based) over runs of equal scores
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [scores.size]))
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
