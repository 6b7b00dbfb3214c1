"""AlphaEdit: the closed form against hand-built references. Preserved keys on a real 2-layer model, the job
(checkpoint, manifest, cache) and the Hydra entry point with its errors: tests/e2e/test_alpha_edit_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from lacuna_unlearn.methods.alpha_edit.edit import (
    alpha_edit_update,
    null_space_projector,
)


def _low_rank_keys(d: int, rank: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d, rank, generator=g, dtype=torch.float64) @ torch.randn(
        rank, n, generator=g, dtype=torch.float64
    )


def test_projector_spans_exactly_the_null_space_of_the_preserved_keys() -> None:
    k0 = _low_rank_keys(8, 3, 50)
    p = null_space_projector(k0 @ k0.T / 50, 1e-3)
    assert torch.allclose(p, p.T, atol=1e-12) and torch.allclose(p @ p, p, atol=1e-10)
    assert round(float(torch.trace(p))) == 5  # d - rank
    assert float((p @ k0).abs().max()) < 1e-10
    assert torch.allclose(null_space_projector(torch.zeros(4, 4), 1e-3), torch.eye(4, dtype=torch.float64))
    assert float(null_space_projector(torch.eye(4), 1e-3).abs().max()) == 0.0  # nothing below the threshold


def test_projector_rejects_bad_moments() -> None:
    with pytest.raises(ValueError, match="square"):
        null_space_projector(torch.zeros(3, 4), 1e-3)
    with pytest.raises(ValueError, match="NaN"):
        null_space_projector(torch.full((2, 2), float("nan")), 1e-3)


def test_update_leaves_preserved_keys_unchanged_and_matches_the_normal_equations() -> None:
    d_in, d_out = 8, 5
    k0 = _low_rank_keys(d_in, 3, 40, seed=1)
    g = torch.Generator().manual_seed(2)
    k1 = torch.randn(d_in, 2, generator=g, dtype=torch.float64)
    r = torch.randn(d_out, 2, generator=g, dtype=torch.float64)
    cp = _low_rank_keys(d_in, 1, 3, seed=3)
    cp = cp @ cp.T
    p = null_space_projector(k0 @ k0.T / 40, 1e-3)
    delta = alpha_edit_update(k1, r, p, cp, l2=0.5)
    assert delta.shape == (d_out, d_in)
    assert float((delta @ k0).abs().max()) < 1e-10  # preserved keys: outputs unchanged
    # Δᵀ solves (P (K1 K1ᵀ + Cp) + l2 I) X = P K1 Rᵀ (AlphaEdit's code)
    lhs = (p @ (k1 @ k1.T + cp) + 0.5 * torch.eye(d_in, dtype=torch.float64)) @ delta.T
    assert torch.allclose(lhs, p @ k1 @ r.T, atol=1e-10)


def test_update_without_preserved_keys_is_ridge_regression_onto_the_residuals() -> None:
    g = torch.Generator().manual_seed(4)
    k1 = torch.randn(6, 3, generator=g, dtype=torch.float64)
    r = torch.randn(4, 3, generator=g, dtype=torch.float64)
    eye = torch.eye(6, dtype=torch.float64)
    delta = alpha_edit_update(k1, r, eye, None, l2=1e-9)
    assert torch.allclose(delta @ k1, r, atol=1e-6)  # the new keys map to W k + r
    reference = r @ k1.T @ torch.linalg.inv(k1 @ k1.T + 0.3 * eye)  # brute-force ridge
    assert torch.allclose(alpha_edit_update(k1, r, eye, None, l2=0.3), reference, atol=1e-10)
    with pytest.raises(ValueError, match="equal n"):
        alpha_edit_update(k1, r[:, :2], eye)
