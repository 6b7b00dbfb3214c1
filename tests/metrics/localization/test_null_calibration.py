"""lacuna_metrics.localization.null_calibration against hand-computed tables (on the smoke testbed:
tests/e2e/test_null_calibration_smoke.py).
"""

from __future__ import annotations

import pytest

from lacuna_metrics.localization.null_calibration import calibrate

AUC = {
    "forget": {"raw": 0.62, "reversal": 0.99, "qtile": 0.55, "composite": None, "best": {"score": "reversal"}},
    "unified": {"raw": 0.50, "reversal": 1.0, "qtile": 0.51, "best": {"score": "reversal"}},
}
NULL = {
    "gaussian": {"raw": {"forget": 0.50, "unified": 0.49}, "reversal": {"forget": 0.97, "unified": 1.0}},
    "adam_sign": {"raw": {"forget": 0.52, "unified": 0.50}, "reversal": {"forget": 0.60, "unified": 0.98}},
}


def test_best_excludes_families_a_null_update_already_wins():
    out = calibrate(AUC, NULL, tolerance=0.05)
    forget = out["targets"]["forget"]
    assert forget["families"]["raw"]["null_auc"] == 0.52  # the highest null AUC
    assert forget["families"]["raw"]["lift"] == pytest.approx(0.10)
    assert forget["families"]["reversal"]["null_auc"] == 0.97
    assert forget["families"]["reversal"]["lift"] == pytest.approx(0.02)
    assert forget["best"] == {"score": "raw", "value": 0.62}  # reversal (0.99) is excluded
    assert forget["best_lift"]["score"] == "raw"
    assert "outside 0.5 ± 0.05" in forget["excluded"]["reversal"]
    assert "no null AUC" in forget["excluded"]["qtile"]  # not scored by the audit: not trusted
    assert "composite" not in forget["families"]  # no value for the method
    unified = out["targets"]["unified"]
    assert unified["best"] == {"score": "raw", "value": 0.50}
    assert unified["best_lift"] == {"score": "raw", "value": pytest.approx(0.0)}  # 0.50 - max(0.49, 0.50)


def test_lift_comes_from_the_verdicts_family_never_from_an_excluded_one():
    """A method-free update whose excluded family has a large lift (a bf16 Gaussian read "0.500 (signrev), lift
    +0.185" before) must not pass a lift gate: its lift is that of the calibrated best's own family."""
    auc = {"forget": {"raw": 0.500, "signrev": 0.80}}
    null = {"gaussian": {"raw": {"forget": 0.50}, "signrev": {"forget": 0.615}}}
    forget = calibrate(auc, null, tolerance=0.05)["targets"]["forget"]
    assert forget["families"]["signrev"]["lift"] == pytest.approx(0.185)  # still in the JSON, per family
    assert "signrev" in forget["excluded"]
    assert forget["best"] == {"score": "raw", "value": 0.500}
    assert forget["best_lift"] == {"score": "raw", "value": pytest.approx(0.0)}


def test_a_random_update_gets_chance_and_an_oracle_keeps_its_best():
    null = {"gaussian": {"raw": {"forget": 0.501}, "qtile": {"forget": 0.499}}}
    random = calibrate({"forget": {"raw": 0.502, "qtile": 0.498}}, null)["targets"]["forget"]
    assert random["best"]["value"] == pytest.approx(0.502) and abs(random["best_lift"]["value"]) < 0.01
    oracle = calibrate({"forget": {"raw": 1.0, "qtile": 0.97}}, null)["targets"]["forget"]
    assert oracle["best"] == {"score": "raw", "value": 1.0} and oracle["best_lift"]["value"] == pytest.approx(0.499)


def test_degenerate_inputs():
    everything_leaks = calibrate({"forget": {"reversal": 0.9}}, {"gaussian": {"reversal": {"forget": 0.9}}})
    best = everything_leaks["targets"]["forget"]["best"]
    assert best["score"] is None and best["value"] is None
    assert "reversal: null AUC 0.900 outside 0.5 ± 0.05" in best["reason"]
    assert everything_leaks["targets"]["forget"]["best_lift"] == {"score": None, "value": None}
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(AUC, NULL, tolerance=0.5)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(AUC, NULL, tolerance=0.0)
    with pytest.raises(ValueError, match="at least one null"):
        calibrate(AUC, {})


def _tiny_state(seed: int, layers: int = 4, hidden: int = 16, inter: int = 32) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(layers):
        for proj in ("q", "k", "v", "o"):
            state[f"model.layers.{i}.self_attn.{proj}_proj.weight"] = torch.randn(hidden, hidden, generator=g)
        state[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(inter, hidden, generator=g)
        state[f"model.layers.{i}.mlp.down_proj.weight"] = torch.randn(hidden, inter, generator=g)
    return state


def _save(directory, state) -> str:
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4}))
    save_file(state, str(directory / "model.safetensors"))
    return str(directory)


def _moved(state: dict, seed: int, scale: float = 0.01) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in state.items()}


def test_contrast_and_crossfield_families_are_calibrated_with_the_methods_own_runs(tmp_path):
    """The null updates are scored with the method's control and per-field runs, so the families that read them get
    a null AUC (before, they were excluded for having none); crossfield reads only the per-field runs, so a null
    update scores exactly what the method scores there: lift 0, never a verdict of its own."""
    from lacuna_metrics import build_masks, save_masks, score_pair

    before = _tiny_state(0)
    masks = tmp_path / "masks.safetensors"
    save_masks(build_masks({k: tuple(v.shape) for k, v in before.items()}, 4, seed=3), masks)
    dirs = {
        "before": _save(tmp_path / "before", before),
        "after": _save(tmp_path / "after", _moved(before, 1)),
        "control_before": _save(tmp_path / "control_before", _tiny_state(5)),
    }
    dirs["control_after"] = _save(tmp_path / "control_after", _moved(_tiny_state(5), 2))
    fields = [_save(tmp_path / f"field{i}", _moved(before, 10 + i)) for i in range(2)]
    result = score_pair(
        dirs["after"], before=dirs["before"], masks=str(masks), control_before=dirs["control_before"],
        control_after=dirs["control_after"], crossfield=fields, frag=False, progress=False,
    )  # fmt: skip
    null = result["null_calibration"]
    assert null["source"] == "computed"
    for target, entry in null["targets"].items():
        assert not [f for f, why in entry["excluded"].items() if "no null AUC" in why], (target, entry["excluded"])
        cross = entry["families"]["crossfield"]
        assert cross["null_auc"] == pytest.approx(cross["auc"]) and cross["lift"] == pytest.approx(0.0)
    assert any(f.startswith("contrast") for f in null["targets"]["forget"]["families"])


def test_a_recorded_audit_stands_only_for_a_score_with_the_same_inputs_and_auc_settings():
    from lacuna_metrics.localization.leak_audit import auc_settings, audit_mismatch
    from lacuna_metrics.localization.precision import LocalizationConfig

    config = LocalizationConfig(composite_samples=200_000)
    recorded = {"null": {"gaussian": {}}, "settings": auc_settings(config)}
    assert audit_mismatch(recorded, config=config, same_inputs=True, extra_runs=False) is None
    cases = {
        "control or per-field": dict(recorded=recorded, config=config, same_inputs=True, extra_runs=True),
        "another before, masks or base": dict(recorded=recorded, config=config, same_inputs=False, extra_runs=False),
        "AUC settings": dict(
            recorded=recorded, config=LocalizationConfig(composite_samples=50_000), same_inputs=True, extra_runs=False
        ),
        "ties": dict(
            recorded=recorded,
            config=LocalizationConfig(composite_samples=200_000, qtile_ties="ordinal"),
            same_inputs=True,
            extra_runs=False,
        ),  # fmt: skip
        "no null": dict(recorded={"settings": auc_settings(config)}, config=config, same_inputs=True, extra_runs=False),
        "older audit": dict(recorded={"null": {"gaussian": {}}}, config=config, same_inputs=True, extra_runs=False),
    }
    for name, kwargs in cases.items():
        assert audit_mismatch(kwargs.pop("recorded"), **kwargs) is not None, name
    off = {"null": {"gaussian": {}}, "settings": auc_settings(LocalizationConfig(composite_samples=0))}
    same_off = LocalizationConfig(composite=False)  # no composite either way: its sample size changes no AUC
    assert audit_mismatch(off, config=same_off, same_inputs=True, extra_runs=False) is None


def test_a_score_without_plots_removes_an_earlier_scores_figures(tmp_path):
    """Stale plots/ of an earlier pair stayed beside a new score.json as if they were its own (issue 37 item 7)."""
    from lacuna_metrics import build_masks, save_masks, score_to_dir

    before = _tiny_state(0)
    masks = tmp_path / "masks.safetensors"
    save_masks(build_masks({k: tuple(v.shape) for k, v in before.items()}, 4, seed=3), masks)
    pair = dict(before=_save(tmp_path / "before", before), masks=str(masks), frag=False, null=False, progress=False)
    out = tmp_path / "score"
    score_to_dir(out, plots=True, after=_save(tmp_path / "a", _moved(before, 1)), **pair)
    assert (out / "plots" / "roc.png").is_file() and (out / "plots" / "layers.png").is_file()
    score_to_dir(out, plots=False, after=_save(tmp_path / "b", _moved(before, 2)), **pair)
    assert not (out / "plots" / "roc.png").exists() and not (out / "plots" / "layers.png").exists()
    assert (out / "score.json").is_file()
