"""Null calibration on the smoke testbed: a random update scores chance after calibration (the tables:
tests/metrics/localization/test_null_calibration.py).
"""

from __future__ import annotations


def test_a_random_update_scores_chance_after_calibration(smoke_testbed, tmp_path):
    """lacuna score on the smoke testbed with an 'after' that is Gaussian noise on every weight (no method): the
    calibrated best AUC sits at chance under every target, whatever the uncalibrated best says."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from lacuna_metrics.localization.precision import LocalizationConfig
    from lacuna_metrics.score import score_pair

    after = tmp_path / "noise"
    shutil.copytree(smoke_testbed / "model", after)
    gen = torch.Generator().manual_seed(11)
    for file in after.glob("*.safetensors"):
        state = load_file(str(file))
        noisy = {
            n: (t.float() + 1e-3 * t.float().pow(2).mean().sqrt() * torch.randn(t.shape, generator=gen)).to(t.dtype)
            if t.is_floating_point()
            else t
            for n, t in state.items()
        }
        save_file(noisy, str(file), metadata={"format": "pt"})
    result = score_pair(
        after, testbed=smoke_testbed, frag=False, config=LocalizationConfig(composite=False), progress=False
    )
    cal = result["null_calibration"]
    assert cal["source"] in ("computed", str(smoke_testbed / "manifest.json"))
    for target, entry in cal["targets"].items():
        assert entry["best"]["value"] is None or abs(entry["best"]["value"] - 0.5) < 0.05, (target, entry["best"])
        assert entry["best_lift"]["value"] < 0.05, (target, entry["best_lift"])  # no family beats the nulls
