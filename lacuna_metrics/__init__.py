"""Reading weights: masks, checkpoint streams, localization scores, FRAG and behavioural metrics."""

from __future__ import annotations

from typing import Any

__all__ = ["score_pair"]


def __getattr__(name: str) -> Any:
    # lazy, so ``import lacuna_metrics.masks`` does not pull in the scorer (and scikit-learn)
    if name == "score_pair":
        from lacuna_metrics.score import score_pair

        return score_pair
    raise AttributeError(f"module 'lacuna_metrics' has no attribute {name!r}")
