"""configure_threads: the user's OMP_NUM_THREADS wins, a malformed one is an error, the default applies otherwise."""

from __future__ import annotations

import pytest
import torch

from lacuna_metrics.weights.threads import configure_threads


def test_user_setting_wins_and_reaches_torch(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        assert configure_threads(default=2) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_default_applies_only_when_unset(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert configure_threads(default=None) is None  # the libraries' own choice
    before = torch.get_num_threads()
    try:
        assert configure_threads(default=1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("raw", ["abc", "0", "-2", "1.5"])
def test_malformed_setting_is_named(monkeypatch, raw):
    monkeypatch.setenv("OMP_NUM_THREADS", raw)
    with pytest.raises(ValueError, match=rf"OMP_NUM_THREADS='{raw}': expected a positive integer"):
        configure_threads()
