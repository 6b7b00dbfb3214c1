"""Exact ROC-AUC against scikit-learn, including ties and degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from lacuna_metrics.auc import roc_auc


@pytest.mark.parametrize("seed", range(5))
def test_matches_sklearn_on_random_scores_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    labels = rng.random(n) < 0.2
    scores = np.round(rng.normal(size=n) + labels * 0.7, 1)  # rounding creates many ties
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_hand_computed_cases():
    assert roc_auc([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]) == 1.0  # perfect
    assert roc_auc([0.4, 0.3, 0.2, 0.1], [0, 0, 1, 1]) == 0.0  # inverted
    assert roc_auc([5, 5, 5, 5], [0, 1, 0, 1]) == 0.5  # all tied: ties count one half
    assert roc_auc([0, 1, 1, 2], [0, 0, 1, 1]) == pytest.approx(0.875)  # one tied pair of four


def test_degenerate_inputs_are_errors():
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1, 2, 3], [1, 1, 1])
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([1, np.nan], [0, 1])
    with pytest.raises(ValueError, match="shape"):
        roc_auc([1, 2, 3], [0, 1])
