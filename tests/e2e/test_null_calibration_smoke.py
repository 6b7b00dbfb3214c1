"""The battery of method-free updates on the smoke testbed (built with the default injection regime): none may
win a calibrated localization verdict, and a mask-restricted update must keep one (issue 34 item 5). The updates
are written in the tests (tests/helpers/method_free.py), independent of the scorer's own null generator; the
tables of the rule: tests/metrics/localization/test_null_calibration.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.method_free import BATTERY, forget_mask_of, write_update

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _score(pair, testbed):
    from lacuna_metrics.localization.precision import LocalizationConfig
    from lacuna_metrics.score import score_pair

    return score_pair(
        pair / "after", before=pair / "before", masks=testbed / "masks.safetensors", base=testbed / "base",
        frag=False, progress=False, allow_mask_mismatch=True, warn=lambda _m: None,
        config=LocalizationConfig(composite=False),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("update", list(BATTERY))
def test_a_method_free_update_wins_no_calibrated_verdict(smoke_testbed, tmp_path, update, dtype):
    """Gaussian noise at 1e-3 .. 1e-1 x RMS, weight decay, |θ|-proportional noise and sign steps, saved in float32
    and bf16 (the before model re-saved in the same dtype, so the pair differs only by the update): on every target
    the calibrated best is none or at most 0.55, with a lift of at most 0.02."""
    pair = write_update(smoke_testbed / "model", tmp_path / "pair", BATTERY[update], dtype=DTYPES[dtype])
    cal = _score(pair, smoke_testbed)["null_calibration"]
    for target, entry in cal["targets"].items():
        best, lift = entry["best"]["value"], entry["best_lift"]["value"]
        assert best is None or (best <= 0.55 and lift <= 0.02), (update, dtype, target, entry["best"], lift)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_noise_on_forget_mask_scalars_only_keeps_its_verdict(smoke_testbed, tmp_path, dtype):
    """The positive control: the same 0.1 x RMS noise, restricted to the forget masks' scalars, keeps a calibrated
    best of at least 0.90 on the forget target, with its raw family calibrated."""
    from helpers.method_free import gaussian

    only = forget_mask_of(smoke_testbed / "masks.safetensors")
    pair = write_update(smoke_testbed / "model", tmp_path / "pair", gaussian(1e-1), dtype=DTYPES[dtype], only=only)
    forget = _score(pair, smoke_testbed)["null_calibration"]["targets"]["forget"]
    assert "raw" not in forget["excluded"], forget["excluded"].get("raw")
    assert forget["best"]["value"] >= 0.90 and forget["best_lift"]["value"] > 0.3, (forget["best"], forget["best_lift"])
