"""lacuna_metrics.localization.null_calibration and .nulls: the calibration rule against hand-computed tables, the
sample AUCs against scikit-learn, the null updates' invariants, and scores of real safetensors pairs (the battery
of method-free updates on a testbed: tests/e2e/test_null_calibration_smoke.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from lacuna_metrics.localization.auc import TARGETS
from lacuna_metrics.localization.null_calibration import calibrate
from lacuna_metrics.localization.nulls import NULL_KINDS, RANDOM_KINDS, NullSample, null_deltas, target_aucs

AUC = {
    "forget": {"raw": 0.62, "reversal": 0.99, "qtile": 0.55, "composite": None, "best": {"score": "reversal"}},
    "unified": {"raw": 0.50, "reversal": 1.0, "qtile": 0.51, "best": {"score": "reversal"}},
}
#: the method on the null sample
METHOD = {"raw": {"forget": 0.63, "unified": 0.50}, "reversal": {"forget": 0.99, "unified": 1.0}}


def _draws(table: dict[str, dict[str, list[float]]]) -> list[dict]:
    """``{family: {target: [draw values]}}`` -> one ``{family: {target: value}}`` table per draw."""
    n = max(len(v) for by_target in table.values() for v in by_target.values())
    return [
        {f: {t: v[i] for t, v in by_target.items() if i < len(v)} for f, by_target in table.items()} for i in range(n)
    ]


NULL = {
    "permutation": _draws({"raw": {"forget": [0.50, 0.51, 0.49], "unified": [0.49, 0.50, 0.51]},
                           "reversal": {"forget": [0.97, 0.96, 0.98], "unified": [1.0, 1.0, 1.0]}}),
    "weight_decay": _draws({"raw": {"forget": [0.52], "unified": [0.50]}, "reversal": {"forget": [0.60], "unified": [0.98]}}),
}  # fmt: skip


def test_best_and_lift_come_from_one_calibrated_family():
    out = calibrate(AUC, METHOD, NULL, tolerance=0.05, z=3, min_lift=0.01)
    forget = out["targets"]["forget"]
    raw = forget["families"]["raw"]
    assert raw["null_auc"] == pytest.approx(0.52)  # the highest mean over kinds (weight decay)
    assert raw["null_sd"] == pytest.approx(0.01)  # the random kind's sample std
    assert raw["lift"] == pytest.approx(0.63 - 0.52)  # the method's sample AUC against the null, like with like
    assert raw["auc"] == 0.62 and raw["sample_auc"] == 0.63
    assert raw["null_auc_by_kind"]["weight_decay"]["sd"] is None  # one deterministic draw
    assert forget["best"] == {"score": "raw", "value": 0.62}  # reversal's null sits at 0.97: excluded
    assert forget["best_lift"] == {"score": "raw", "value": pytest.approx(0.11)}
    assert "outside 0.5 ± 0.05" in forget["excluded"]["reversal"]
    assert "no null AUC" in forget["excluded"]["qtile"]  # never scored by the nulls: not trusted
    assert "composite" not in forget["families"]
    unified = out["targets"]["unified"]  # raw 0.50 against nulls at 0.50: no verdict, never a number
    assert unified["best"]["value"] is None and unified["best_lift"] == {"score": None, "value": None}
    assert "raw: not above its null" in unified["best"]["reason"]
    assert out["tolerance"] == 0.05 and out["z"] == 3 and out["min_lift"] == 0.01


def test_a_lift_inside_the_nulls_spread_or_below_the_floor_gives_no_verdict():
    auc = {"forget": {"raw": 0.56}}
    null = {"permutation": _draws({"raw": {"forget": [0.50, 0.52, 0.54, 0.50, 0.52, 0.54]}})}  # mean 0.52, sd ~0.018
    wide = calibrate(auc, {"raw": {"forget": 0.56}}, null, z=3)["targets"]["forget"]
    assert wide["best"]["value"] is None and "3 x spread" in wide["excluded"]["raw"]
    assert calibrate(auc, {"raw": {"forget": 0.56}}, null, z=2)["targets"]["forget"]["best"]["value"] == 0.56
    tight = {"permutation": _draws({"raw": {"forget": [0.5000, 0.5001, 0.4999]}})}
    just_above = calibrate(auc, {"raw": {"forget": 0.5099}}, tight, min_lift=0.01)["targets"]["forget"]
    assert just_above["best"]["value"] is None  # z is huge, but the lift is under the floor
    passes = calibrate(auc, {"raw": {"forget": 0.5101}}, tight, min_lift=0.01)["targets"]["forget"]
    assert passes["best"] == {"score": "raw", "value": 0.56}  # the control that barely passes


def test_an_excluded_family_never_lends_its_lift_or_auc():
    """A method-free update whose excluded family has a large lift must not pass a lift gate (a bf16 Gaussian read
    "0.500 (signrev), lift +0.185" once)."""
    auc = {"forget": {"raw": 0.500, "signrev": 0.80}}
    null = {"permutation": _draws({"raw": {"forget": [0.5, 0.5]}, "signrev": {"forget": [0.615, 0.615]}})}
    forget = calibrate(auc, {"raw": {"forget": 0.5}, "signrev": {"forget": 0.8}}, null)["targets"]["forget"]
    assert forget["families"]["signrev"]["lift"] == pytest.approx(0.185)  # still in the JSON, per family
    assert "signrev" in forget["excluded"] and "raw" in forget["excluded"]
    assert forget["best"]["value"] is None and forget["best_lift"]["value"] is None


def test_degenerate_settings_and_inputs():
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(AUC, METHOD, NULL, tolerance=0.5)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(AUC, METHOD, NULL, tolerance=0.0)
    with pytest.raises(ValueError, match="z must"):
        calibrate(AUC, METHOD, NULL, z=float("inf"))
    with pytest.raises(ValueError, match="min lift"):
        calibrate(AUC, METHOD, NULL, min_lift=-0.1)
    with pytest.raises(ValueError, match="at least one null"):
        calibrate(AUC, METHOD, {})
    zero = {"permutation": _draws({"raw": {"forget": [0.5, 0.5]}})}  # a zero update: every null ties at 0.5, sd 0
    out = calibrate({"forget": {"raw": 0.5}}, {"raw": {"forget": 0.5}}, zero)["targets"]["forget"]
    assert out["families"]["raw"]["z"] == 0.0 and out["best"]["value"] is None


@pytest.mark.parametrize("seed", range(6))
def test_target_aucs_match_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 300
    cats = rng.integers(0, 3, n).astype(np.uint8)
    scores = np.round(rng.normal(size=n) + 0.3 * cats, 1) if seed % 2 else rng.integers(0, 4, n).astype(float)
    scores[:5] = -0.0 if seed == 0 else scores[:5]
    got = target_aucs(scores, cats)
    for target, (pos, neg) in TARGETS.items():
        keep = np.isin(cats, pos + neg)
        assert got[target] == pytest.approx(roc_auc_score(np.isin(cats[keep], pos), scores[keep]), abs=1e-12)


def test_target_aucs_degenerate():
    assert target_aucs(np.array([1.0, 2.0]), np.array([2, 2])) == dict.fromkeys(TARGETS)  # no negatives anywhere
    assert target_aucs(np.array([3.0, 3.0, 3.0]), np.array([2, 1, 0]))["forget"] == 0.5  # all tied
    with pytest.raises(ValueError, match="NaN"):
        target_aucs(np.array([np.nan, 1.0]), np.array([2, 0]))


def _sample(n: int = 4000, *, dtype: torch.dtype | None = None, seed: int = 0) -> NullSample:
    g = torch.Generator().manual_seed(seed)
    tensor = np.repeat(np.arange(4, dtype=np.int32), n // 4)
    before = torch.randn(n, generator=g) * 0.05
    base = before - torch.randn(n, generator=g) * 0.01
    if dtype is not None:
        before = before.to(dtype).float()
    after = before + torch.randn(n, generator=g) * 1e-3
    if dtype is not None:
        after = after.to(dtype).float()
    return NullSample(
        names=[f"t{i}" for i in range(4)], groups=[(0, "attn"), (1, "attn")], tensor=tensor, group=tensor // 2,
        cats=np.random.default_rng(seed).integers(0, 3, n).astype(np.uint8), before=before, after=after, base=base,
        control=None, rounding=[dtype] * 4, universe_scalars=n,
    )  # fmt: skip


def test_permutation_null_keeps_each_strata_values_and_is_seeded():
    sample = _sample()
    d = sample.after - sample.before
    one, again, other = (null_deltas(sample, "permutation", draw, seed=1) for draw in (0, 0, 1))
    assert torch.equal(one, again) and not torch.equal(one, other)
    for _t, span in sample.spans():  # a within-tensor permutation: the same multiset of signed deltas
        assert torch.equal(one[span].sort().values, d[span].sort().values)
    assert not torch.equal(one, d)


def test_scaled_nulls_match_the_updates_per_tensor_norm():
    sample = _sample()
    d = (sample.after - sample.before).double()
    wd = null_deltas(sample, "weight_decay", 0, seed=0).double()
    for _t, span in sample.spans():
        assert float(wd[span].norm()) == pytest.approx(float(d[span].norm()), rel=1e-5)
        ratio = wd[span] / sample.before[span].double()
        assert float(ratio.max() - ratio.min()) < 1e-6  # -lambda x theta: one lambda per tensor
    for kind in ("theta_noise", "gaussian"):
        draw = null_deltas(sample, kind, 0, seed=0).double()
        for _t, span in sample.spans():
            assert float(draw[span].norm()) == pytest.approx(float(d[span].norm()), rel=0.15), kind
    assert set(RANDOM_KINDS) < set(NULL_KINDS) and "weight_decay" not in RANDOM_KINDS


def test_nulls_are_rounded_to_the_dtype_after_stores():
    sample = _sample(dtype=torch.bfloat16)
    for kind in NULL_KINDS:
        u = sample.before + null_deltas(sample, kind, 0, seed=0)
        assert torch.equal(u, u.to(torch.bfloat16).float()), kind  # what a saved bf16 checkpoint holds
    with pytest.raises(ValueError, match="unknown null kind"):
        null_deltas(sample, "adam", 0, seed=0)


# -- real pairs through score_pair -------------------------------------------------------------------------------


def _tiny_state(seed: int, layers: int = 4, hidden: int = 16, inter: int = 32) -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(layers):
        for proj in ("q", "k", "v", "o"):
            state[f"model.layers.{i}.self_attn.{proj}_proj.weight"] = torch.randn(hidden, hidden, generator=g)
        state[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(inter, hidden, generator=g)
        state[f"model.layers.{i}.mlp.down_proj.weight"] = torch.randn(hidden, inter, generator=g)
    return state


def _save(directory, state) -> str:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4}))
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return str(directory)


def _moved(state: dict, seed: int, scale: float = 0.01, where: dict | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        step = scale * torch.randn(v.shape, generator=g)
        if where is not None:
            step = step * where[k] if k in where else 0 * step
        out[k] = v + step
    return out


def _masks(tmp_path, state):
    from lacuna_metrics import build_masks, save_masks

    masks = build_masks({k: tuple(v.shape) for k, v in state.items()}, 4, seed=3)
    save_masks(masks, tmp_path / "masks.safetensors")
    return masks, str(tmp_path / "masks.safetensors")


def test_contrast_and_crossfield_families_are_calibrated_with_the_methods_own_runs(tmp_path):
    """The nulls are scored with the method's control run, so the families that read it get a null AUC; crossfield
    reads only the per-field runs (a null scores exactly what the method scores there): excluded, with the reason."""
    from lacuna_metrics import score_pair

    before = _tiny_state(0)
    _m, masks = _masks(tmp_path, before)
    dirs = {
        "before": _save(tmp_path / "before", before),
        "after": _save(tmp_path / "after", _moved(before, 1)),
        "control_before": _save(tmp_path / "control_before", _tiny_state(5)),
    }
    dirs["control_after"] = _save(tmp_path / "control_after", _moved(_tiny_state(5), 2))
    fields = [_save(tmp_path / f"field{i}", _moved(before, 10 + i)) for i in range(2)]
    result = score_pair(
        dirs["after"], before=dirs["before"], masks=masks, control_before=dirs["control_before"],
        control_after=dirs["control_after"], crossfield=fields, frag=False, progress=False,
    )  # fmt: skip
    null = result["null_calibration"]
    for target, entry in null["targets"].items():
        assert not [f for f, why in entry["excluded"].items() if "no null AUC" in why], (target, entry["excluded"])
        assert "reads only the per-field runs" in entry["excluded"]["crossfield"]
        assert {"contrast", "eratio", "compnorm", "composite"} <= set(entry["families"])
    assert null["sample"]["scalars"] == null["sample"]["universe_scalars"]  # a tiny universe is sampled whole


def test_the_null_sample_does_not_depend_on_blocks_or_threads(tmp_path):
    from lacuna_metrics import score_pair
    from lacuna_metrics.localization.precision import LocalizationConfig

    before = _tiny_state(0, hidden=64, inter=128)
    _m, masks = _masks(tmp_path, before)
    pair = dict(before=_save(tmp_path / "before", before), masks=masks, frag=False, progress=False, null_samples=5000)
    after = _save(tmp_path / "after", _moved(before, 1))
    runs = [
        score_pair(after, config=LocalizationConfig(block_elems=b, threads=t, composite=False), **pair)
        for b, t in ((1 << 20, 1), (1000, 2))
    ]
    strip = [r["null_calibration"] for r in runs]
    assert strip[0] == strip[1]  # no timing in the section: the same inputs give the same section
    assert strip[0]["sample"]["scalars"] < strip[0]["sample"]["universe_scalars"]


@pytest.mark.parametrize("traced", [True, False])
def test_a_mask_blind_update_gets_no_verdict_and_a_mask_restricted_one_keeps_raw(tmp_path, traced):
    """bf16 pairs, on a model whose masked scalars are 3x larger (``traced``: the magnitude trace) or not. Weight decay
    and a Gaussian know nothing of the masks and must get no verdict (what they read through |θ| the nulls read
    too). Noise on forget-mask scalars only keeps a calibrated raw family where the model has no trace; on the
    traced one, raw is excluded (weight decay alone already scores it), which is the calibration doing its job."""
    from lacuna_metrics import score_pair
    from lacuna_metrics.localization.precision import LocalizationConfig
    from lacuna_metrics.masks.files import MaskReader

    state = _tiny_state(0, hidden=48, inter=96)
    masks, masks_path = _masks(tmp_path, state)
    bits = MaskReader(masks_path).forget_bits
    packed = {k: masks.packed[k].reshape(v.shape).int() for k, v in state.items() if k in masks.packed}
    forget = {k: ((p & bits) != 0).float() for k, p in packed.items()}
    if traced:
        state = {k: v * (1 + 2 * (packed[k] != 0).float()) if k in packed else v for k, v in state.items()}
    config = LocalizationConfig(composite=False)
    before = _save(tmp_path / "before", {k: v.to(torch.bfloat16) for k, v in state.items()})
    afters = {
        "weight_decay": {k: (v * 0.99).to(torch.bfloat16) for k, v in state.items()},
        "gaussian": {k: v.to(torch.bfloat16) for k, v in _moved(state, 7, scale=0.05).items()},
        "forget_only": {k: v.to(torch.bfloat16) for k, v in _moved(state, 8, scale=0.05, where=forget).items()},
    }
    out = {}
    for name, state_after in afters.items():
        result = score_pair(_save(tmp_path / name, state_after), before=before, masks=masks_path, frag=False,
                            progress=False, config=config)  # fmt: skip
        out[name] = result["null_calibration"]["targets"]
    for name in ("weight_decay", "gaussian"):
        for target, entry in out[name].items():
            assert entry["best"]["value"] is None, (name, target, entry["best"], entry["best_lift"])
    if traced:  # the check can fail: the uncalibrated best credits weight decay with the trace
        assert out["weight_decay"]["forget"]["families"]["raw"]["auc"] > 0.6
    forget_entry = out["forget_only"]["forget"]
    if traced:
        assert "weight_decay" in forget_entry["excluded"]["raw"]
    else:
        assert "raw" not in forget_entry["excluded"] and forget_entry["best"]["value"] >= 0.9
        assert forget_entry["best_lift"]["value"] > 0.3


def test_a_score_without_plots_removes_an_earlier_scores_figures(tmp_path):
    """Stale plots/ of an earlier pair stayed beside a new score.json as if they were its own (issue 37 item 7)."""
    from lacuna_metrics import score_to_dir

    before = _tiny_state(0)
    _m, masks = _masks(tmp_path, before)
    pair = dict(before=_save(tmp_path / "before", before), masks=masks, frag=False, null=False, progress=False)
    out = tmp_path / "score"
    score_to_dir(out, plots=True, after=_save(tmp_path / "a", _moved(before, 1)), **pair)
    assert (out / "plots" / "roc.png").is_file() and (out / "plots" / "layers.png").is_file()
    score_to_dir(out, plots=False, after=_save(tmp_path / "b", _moved(before, 2)), **pair)
    assert not (out / "plots" / "roc.png").exists() and not (out / "plots" / "layers.png").exists()
    assert (out / "score.json").is_file()
