"""lacuna meta's pool and statistics on hand-made results (issue 38): which rows, which values, and that the
correlations, the leave-one-method-out check and the noise controls' check read them as defined."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from lacuna_unlearn.bench.meta.analysis import correlations, robustness
from lacuna_unlearn.bench.meta.pool import PoolModel, pool_models


def _entry(leak: float, l2: float, relearned: float, lift: float | None = 0.1) -> dict:
    return {
        "model": "/m",
        "behaviour": {"forget_leak": leak, "j_w": leak, "prob": 0.1, "es": 0.2, "em": 0.3},
        "auc": {"forget": {"calibrated_best": {"value": 0.6 if lift else None}, "best_lift": {"value": lift}}},
        "frag": 0.01,
        "l2": l2,
        "attack": {"success_at_n_unlearned": 0.0, "success_at_n_relearned": relearned},
        "reversibility": {"sources": {s: {"forget_leak": relearned} for s in ("retain", "unrelated", "forget")}},
    }


def test_the_pool_holds_every_method_field_and_seed_with_its_values():
    results = {
        "manifest": {"config": {"seeds": [42, 1], "seed": 42}},
        "by_field": {
            "email": {
                "methods": {"a": _entry(0.0, 1.0, 0.5), "b": _entry(0.2, 2.0, 1.0, lift=None)},
                "seed_entries": {"1": {"a": _entry(0.1, 1.5, 0.0), "b": _entry(0.3, 2.5, 1.0)}},
            },
            "phone": {"methods": {"a": _entry(0.0, 1.0, 0.5), "b": _entry(0.0, 1.0, 0.5)}},
        },
    }
    pool = pool_models(results)
    assert [m.name for m in pool] == [
        "a/email/seed 42", "b/email/seed 42", "a/email/seed 1", "b/email/seed 1", "a/phone/seed 42", "b/phone/seed 42",
    ]  # fmt: skip
    b = pool[1]
    assert b.predictors["lift_forget"] == 0.0  # no family passed: no lift over the method-free null
    assert b.predictors["auc_forget_calibrated"] is None and b.predictors["l2"] == 2.0
    assert b.outcomes["delta_leak_retain"] == pytest.approx(1.0 - 0.2)
    assert b.outcomes["delta_success_at_n"] == pytest.approx(1.0)
    assert not any(m.noise for m in pool)


def _pool(n_methods: int = 4, per_method: int = 3, seed: int = 0) -> list[PoolModel]:
    rng = np.random.default_rng(seed)
    pool = []
    for i in range(n_methods):
        for j in range(per_method):
            x = float(rng.normal())
            pool.append(PoolModel("email", f"m{i}", j, {}, predictors={"x": x}, outcomes={"y": x + rng.normal(0, 0.5)}))
    return pool


def test_correlations_match_scipy_and_the_leave_one_out_range_by_brute_force():
    pool = _pool()
    cell = correlations(pool, draws=300)["x"]["y"]
    xs = [m.predictors["x"] for m in pool]
    ys = [m.outcomes["y"] for m in pool]
    assert cell["rho"] == pytest.approx(spearmanr(xs, ys).statistic) and cell["n"] == 12
    rhos = {}
    for g in {m.method for m in pool}:
        keep = [m for m in pool if m.method != g]
        rhos[g] = spearmanr([m.predictors["x"] for m in keep], [m.outcomes["y"] for m in keep]).statistic
    loo = cell["leave_one_method_out"]
    assert loo["min"] == pytest.approx(min(rhos.values())) and loo["max"] == pytest.approx(max(rhos.values()))
    assert loo["most_influential"] == max(rhos, key=lambda g: abs(rhos[g] - cell["rho"]))


def test_a_predictor_that_ranks_a_noise_control_robust_is_caught_and_one_that_does_not_passes():
    pool = _pool()  # rho > 0: low x predicts a low leak after relearning (robust)
    low = min(m.predictors["x"] for m in pool)
    high = max(m.predictors["x"] for m in pool)
    # a method-free update that relearns fully, but which the predictor calls the most robust model
    fooled = PoolModel("email", "null_gaussian", 0, {}, noise=True, predictors={"x": low - 1}, outcomes={"y": 5.0})
    cell = correlations([*pool, fooled], draws=200)["x"]["y"]
    assert cell["noise_controls"]["ranked_robust"] is True
    # the same control at the other end of the predictor: not ranked robust
    honest = PoolModel("email", "null_gaussian", 0, {}, noise=True, predictors={"x": high + 1}, outcomes={"y": 5.0})
    cell = correlations([*pool, honest], draws=200)["x"]["y"]
    assert cell["noise_controls"]["ranked_robust"] is False


def test_a_small_or_single_method_pool_is_marked_underpowered_never_a_bare_rho():
    pool = _pool(n_methods=1, per_method=10)
    cell = correlations(pool, draws=200)["x"]["y"]
    assert cell["underpowered"] and "one method only" in cell["reason"] and cell["n"] == 10
    cell = correlations(_pool(n_methods=2, per_method=3), draws=200)["x"]["y"]
    assert cell["underpowered"] and "6 models (< 8)" in cell["reason"]


def test_robustness_over_models_matches_the_per_model_equations():
    ref = {"before": {"forget_leak": 0.0}, "after": {"forget_leak": 0.2}}
    models = [
        {"before": {"forget_leak": 0.0}, "relearned": {"forget_leak": 1.0}, "reference": ref,
         "quantized": {4: {"forget_leak": 0.5}}},  # R = 0.2, Q = 0 / 0.5 = 0
        {"before": {"forget_leak": 0.4}, "relearned": {"forget_leak": 0.4}, "reference": ref,
         "quantized": {4: {"forget_leak": 0.4}}},  # R = 1 (nothing resurfaced), Q = 1
    ]  # fmt: skip
    got = robustness(models, ["forget_leak"], [4], draws=200)["metrics"]["forget_leak"]
    assert got["relearning"]["mean"] == pytest.approx(0.6) and got["relearning"]["n"] == 2
    assert got["quantization_4bit"]["mean"] == pytest.approx(0.5)
    assert got["aggregate"] == pytest.approx(2 * 0.6 * 0.5 / 1.1)


@pytest.mark.parametrize("tied", [True, False])
def test_the_testbed_norms_streamed_per_tensor_equal_the_whole_model_sums(tmp_path, tied):
    """meta's ‖θ‖ and ‖θ‖ over the noise scope, read one tensor at a time, against the loaded model's state_dict
    (tied lm_head counted as the state_dict counts it)."""
    import math

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lacuna_metrics import linear_weight_names
    from lacuna_unlearn.bench.meta.run import _norms

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)  # fmt: skip
    net = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    net.save_pretrained(tmp_path / "m")
    net = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    state = net.state_dict()
    total = math.sqrt(sum(float(t.double().pow(2).sum()) for t in state.values() if t.is_floating_point()))
    scope = linear_weight_names(net, "all").values()
    inside = math.sqrt(sum(float(state[n].double().pow(2).sum()) for n in scope))
    got = _norms(tmp_path / "m")
    assert got[0] == pytest.approx(total, rel=1e-12) and got[1] == pytest.approx(inside, rel=1e-12)
    assert got[0] > got[1] > 0
