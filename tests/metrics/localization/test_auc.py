"""Exact ROC-AUC against scikit-learn, including ties and degenerate inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from lacuna_metrics.localization.auc import (
    TARGETS,
    StreamingAUC,
    binned_auc,
    binned_precision,
    binned_roc,
    float_keys,
    roc_auc,
)

FORGET = 2


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


# --------------------------------------------------------------------------------------------------
# float_keys, StreamingAUC and the binned helpers


def _sk(target, scores, cats):
    """sklearn ROC-AUC of ``target`` over the rows whose category belongs to the target."""
    pos_cats, neg_cats = TARGETS[target]
    keep = np.isin(cats, pos_cats + neg_cats)
    return roc_auc_score(np.isin(cats[keep], pos_cats), scores[keep].astype(np.float64))


def _feed(auc, scores, cats, rng, max_chunk=700):
    """Add ``scores``/``cats`` in many chunks of uneven sizes (some empty)."""
    i = 0
    while i < scores.size:
        size = int(rng.integers(0, max_chunk))
        auc.add(torch.from_numpy(scores[i : i + size].copy()), torch.from_numpy(cats[i : i + size].copy()))
        i += size
    return auc


def _cats(rng, n):
    return rng.integers(0, 3, n).astype(np.uint8)


def _signal(rng, cats, kind):
    """float32 scores with a category-dependent shift; ``kind`` controls the ties."""
    n = cats.size
    base = rng.normal(size=n) + 0.6 * (cats == 2) + 0.3 * (cats == 1)
    if kind == "continuous":
        out = base
    elif kind == "rounded":
        out = np.round(base, 1)
    elif kind == "integer":
        out = np.round(base * 2)
    elif kind == "all-equal":
        out = np.full(n, 0.25)
    elif kind == "signed-zeros":
        out = np.where(rng.random(n) < 0.7, np.where(rng.random(n) < 0.5, -0.0, 0.0), base)
    else:
        raise AssertionError(kind)
    return out.astype(np.float32)


def test_float_keys_preserve_order():
    tiny = np.finfo(np.float32).smallest_subnormal
    big = np.finfo(np.float32).max
    special = np.array(
        [0.0, -0.0, tiny, -tiny, 2 * tiny, -2 * tiny, 1e-40, -1e-40, np.finfo(np.float32).tiny, 1.0, -1.0]
        + [big, -big, 3e38, -3e38, 1e30, -1e30, np.inf, -np.inf, 0.5, -0.5, 1.0000001, -1.0000001],
        dtype=np.float32,
    )
    rng = np.random.default_rng(0)
    random = (rng.normal(size=300) * 10.0 ** rng.integers(-30, 30, 300)).astype(np.float32)
    values = np.concatenate([special, special, random, np.round(random[:50], 0)])
    rng.shuffle(values)
    keys = float_keys(torch.from_numpy(values.copy())).numpy()
    assert keys.dtype == np.int64
    assert keys.min() >= 0 and keys.max() < 2**32
    np.testing.assert_array_equal(np.argsort(keys, kind="stable"), np.argsort(values, kind="stable"))
    # pairwise: equal values <=> equal keys (so -0.0 and +0.0 share a key), order otherwise
    key_cmp = (keys[:, None] > keys[None, :]).astype(int) - (keys[:, None] < keys[None, :])
    value_cmp = (values[:, None] > values[None, :]).astype(int) - (values[:, None] < values[None, :])
    np.testing.assert_array_equal(key_cmp, value_cmp)
    zero = float_keys(torch.tensor([0.0, -0.0]))
    assert zero[0] == zero[1]
    # shape and dtype of the input do not matter; the input is not modified
    t = torch.tensor([[-0.0, 2.0], [-3.0, 1.0]])
    assert torch.equal(float_keys(t), float_keys(t.double().flatten()))
    assert str(t[0, 0].item()) == "-0.0"


def test_float_keys_of_bf16_values_are_distinct_in_the_top_16_bits():
    x = torch.randn(5000).bfloat16().float()
    x[:10] = 0.0
    x[10:20] = -0.0
    keys = float_keys(x)
    top = keys >> 16
    assert torch.unique(top).numel() == torch.unique(x).numel()
    # within one 16-bit bin, every bf16 value has the same low bits (0 for positives, all ones for negatives)
    low = keys & 0xFFFF
    assert set(low[x >= 0].tolist()) == {0}
    assert set(low[x < 0].tolist()) == {0xFFFF}


KINDS = ["continuous", "rounded", "integer", "all-equal", "signed-zeros"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_streaming_exact_mode_matches_sklearn(target, kind):
    rng = np.random.default_rng([list(TARGETS).index(target), KINDS.index(kind)])
    n = 3000
    cats = _cats(rng, n)
    scores = _signal(rng, cats, kind)
    scores[cats == 0] += 2.0 if kind != "all-equal" else 0.0  # the excluded category must not matter
    auc = _feed(StreamingAUC(), scores, cats, rng)
    assert auc.count == n
    res = auc.result(target)
    pos_cats, neg_cats = TARGETS[target]
    assert res.n_pos == int(np.isin(cats, pos_cats).sum())
    assert res.n_neg == int(np.isin(cats, neg_cats).sum())
    assert res.error_bound == 0.0 and res.exact
    assert abs(res.value - _sk(target, scores, cats)) <= 1e-12


def test_streaming_all_targets_from_one_stream():
    rng = np.random.default_rng(1)
    cats = _cats(rng, 4000)
    scores = _signal(rng, cats, "rounded")
    auc = _feed(StreamingAUC(), scores, cats, rng)
    for target in TARGETS:
        assert abs(auc.result(target).value - _sk(target, scores, cats)) <= 1e-12
    # more data after a result() call is taken into account
    more_cats = _cats(rng, 500)
    more = _signal(rng, more_cats, "integer")
    auc.add(torch.from_numpy(more), torch.from_numpy(more_cats))
    all_scores, all_cats = np.concatenate([scores, more]), np.concatenate([cats, more_cats])
    for target in TARGETS:
        assert abs(auc.result(target).value - _sk(target, all_scores, all_cats)) <= 1e-12


@pytest.mark.parametrize("bits", [12, 16, 20])
@pytest.mark.parametrize("seed", range(3))
def test_histogram_mode_within_error_bound(bits, seed):
    rng = np.random.default_rng(100 + seed)
    n = 5000
    cats = _cats(rng, n)
    scores = (_signal(rng, cats, "continuous") * 10.0 ** rng.integers(-2, 3)).astype(np.float32)
    auc = _feed(StreamingAUC(bits=bits, exact_limit=100), scores, cats, rng, max_chunk=1500)
    assert auc.count == n
    for target in TARGETS:
        res = auc.result(target)
        ref = _sk(target, scores, cats)
        assert abs(res.value - ref) <= res.error_bound + 1e-12, (target, res, ref)
        if bits == 12:
            assert res.error_bound > 0  # 5000 continuous values in 4096 bins: some bins hold several values


def test_histogram_bound_is_tight_for_adversarial_ties():
    """All scores distinct but inside one bin: the histogram sees a single tie, the bound covers the whole gap."""
    n = 400
    scores = (1.0 + np.arange(n) * 2.0**-23).astype(np.float32)  # consecutive floats, one 12-bit bin
    cats = np.where(np.arange(n) >= n // 2, 2, 0).astype(np.uint8)  # perfectly separated
    auc = StreamingAUC(bits=12, exact_limit=100)
    auc.add(torch.from_numpy(scores), torch.from_numpy(cats))
    res = auc.result("forget")
    assert res.value == 0.5 and res.error_bound == 0.5
    assert abs(res.value - _sk("forget", scores, cats)) <= res.error_bound + 1e-12
    # the same data in exact mode is exact
    exact = StreamingAUC(bits=12)
    exact.add(torch.from_numpy(scores), torch.from_numpy(cats))
    assert exact.result("forget").value == 1.0 and exact.result("forget").exact


@pytest.mark.parametrize(
    "bits, make",
    [
        (12, lambda rng, n: rng.integers(-15, 16, n) / 8.0),  # multiples of 2**-3, <= 4 significant bits
        (16, lambda rng, n: rng.integers(-127, 128, n) / 128.0),  # multiples of 2**-7 in (-1, 1)
        (16, lambda rng, n: torch.randn(n, generator=torch.Generator().manual_seed(3)).bfloat16().float().numpy()),
        (20, lambda rng, n: (torch.randn(n, generator=torch.Generator().manual_seed(4)) * 1e-3).bfloat16().float()),
    ],
    ids=["eighths-12", "1/128-16", "bf16-16", "bf16-20"],
)
def test_histogram_mode_exact_when_bins_hold_one_value(bits, make):
    rng = np.random.default_rng(bits)
    n = 6000
    cats = _cats(rng, n)
    scores = np.asarray(make(rng, n), dtype=np.float32)
    scores = np.where(cats == 2, scores + np.float32(0.25), scores).astype(np.float32)
    scores = np.asarray(torch.from_numpy(scores).bfloat16().float()) if bits != 12 else scores
    scores[rng.random(n) < 0.05] = -0.0  # signed zeros share a bin with +0.0
    scores[rng.random(n) < 0.05] = 0.0
    auc = _feed(StreamingAUC(bits=bits, exact_limit=100), scores, cats, rng, max_chunk=2500)
    for target in TARGETS:
        res = auc.result(target)
        assert res.error_bound == 0.0 and res.exact, (target, res)
        assert abs(res.value - _sk(target, scores, cats)) <= 1e-12


def test_exact_limit_is_inclusive():
    rng = np.random.default_rng(5)
    scores = rng.normal(size=101).astype(np.float32)
    cats = _cats(rng, 101)
    auc = StreamingAUC(bits=8, exact_limit=100)
    auc.add(torch.from_numpy(scores[:100]), torch.from_numpy(cats[:100]))
    assert auc.result("unified").exact
    assert abs(auc.result("unified").value - _sk("unified", scores[:100], cats[:100])) <= 1e-12
    auc.add(torch.from_numpy(scores[100:]), torch.from_numpy(cats[100:]))
    res = auc.result("unified")
    assert auc.count == 101
    assert res.error_bound > 0  # 101 continuous values in 256 bins: now a histogram with shared bins
    assert abs(res.value - _sk("unified", scores, cats)) <= res.error_bound + 1e-12


@pytest.mark.parametrize("exact_limit", [1 << 22, 100], ids=["exact", "histogram"])
def test_planted_aucs(exact_limit):
    rng = np.random.default_rng(6)
    n = 2000
    cats = np.repeat(np.array([0, 1, 2], dtype=np.uint8), [n // 2, n // 4, n // 4])
    # ascending with the category, several values per category; multiples of 1/4 below 12 are bin-exact at 16 bits
    ranks = (cats * 4 + rng.integers(0, 12, cats.size) / 4).astype(np.float32)

    def run(scores, cats, target):
        return _feed(StreamingAUC(bits=16, exact_limit=exact_limit), scores, cats, rng, 5000).result(target)

    # perfect separation: cats ascend with the score
    assert run(ranks, cats, "forget").value == 1.0
    assert run(ranks, cats, "unified").value == 1.0
    assert run(ranks, cats, "forget_vs_retain").value == 1.0
    # inverted
    assert run(-ranks, cats, "forget").value == 0.0
    assert run(-ranks, cats, "forget_vs_retain").value == 0.0
    # all scores equal: every pair a tie
    res = run(np.full(cats.size, 3.5, dtype=np.float32), cats, "forget")
    assert res.value == 0.5 and res.error_bound == 0.0
    # random labels
    big = 40000
    shuffled = _cats(rng, big)
    res = run(rng.integers(0, 1 << 12, big).astype(np.float32), shuffled, "unified")
    assert abs(res.value - 0.5) < 0.02
    # a target with no positives / no negatives
    no_forget = np.where(cats == 2, 1, cats).astype(np.uint8)
    res = run(ranks, no_forget, "forget")
    assert res.value is None and res.n_pos == 0 and res.n_neg == cats.size
    assert run(ranks, no_forget, "forget_vs_retain").value is None
    no_outside = np.where(cats == 0, 1, cats).astype(np.uint8)
    res = run(ranks, no_outside, "unified")
    assert res.value is None and res.n_neg == 0
    assert run(ranks, no_outside, "forget").value == 1.0


def test_empty_stream_has_no_auc():
    auc = StreamingAUC()
    assert auc.count == 0
    for target in TARGETS:
        assert auc.result(target).value is None
        assert auc.roc_curve(target) == {"fpr": [], "tpr": []}
    assert auc.precision_at("forget", (0.1,)) == {"10%": None}


def _pairwise_auc(scores, labels):
    """Mann-Whitney by brute force over all pairs (ties one half); safe for +/-inf."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    p, n = scores[labels][:, None], scores[~labels][None, :]
    return float(((p > n) + 0.5 * (p == n)).mean())


def test_roc_auc_ties_at_infinity():
    """Equal infinite scores are ties like any other (inf - inf is NaN, not a rank boundary)."""
    assert roc_auc([np.inf, np.inf], [0, 1]) == 0.5
    assert roc_auc([-np.inf, -np.inf, 0.0], [0, 1, 1]) == 0.75
    scores = [-np.inf, -1.0, 0.0, 1.0, np.inf, np.inf, 2.0, -np.inf]
    labels = [0, 1, 1, 0, 1, 0, 1, 0]
    assert roc_auc(scores, labels) == pytest.approx(_pairwise_auc(scores, labels), abs=1e-12)


def test_streaming_inf_scores_are_ordered():
    scores = np.array([-np.inf, -1.0, 0.0, 1.0, np.inf, np.inf, 2.0, -np.inf], dtype=np.float32)
    cats = np.array([0, 0, 2, 1, 2, 0, 2, 1], dtype=np.uint8)
    for limit in (1 << 22, 2):
        auc = StreamingAUC(exact_limit=limit)
        auc.add(torch.from_numpy(scores[:3]), torch.from_numpy(cats[:3]))
        auc.add(torch.from_numpy(scores[3:]), torch.from_numpy(cats[3:]))
        for target in TARGETS:
            pos_cats, neg_cats = TARGETS[target]
            keep = np.isin(cats, pos_cats + neg_cats)
            expected = _pairwise_auc(scores[keep], np.isin(cats[keep], pos_cats))
            assert auc.result(target).value == pytest.approx(expected, abs=1e-12)
    # forget: positives 0, inf, 2 vs negatives -inf, -1, 1, inf, -inf -> (3 + 4.5 + 4) / 15
    assert auc.result("forget").value == pytest.approx(11.5 / 15, abs=1e-12)


@pytest.mark.parametrize("exact_limit", [1 << 22, 10], ids=["exact", "histogram"])
def test_streaming_rejects_bad_input(exact_limit):
    auc = StreamingAUC(exact_limit=exact_limit)
    auc.add(torch.randn(20), torch.zeros(20, dtype=torch.uint8))
    with pytest.raises(ValueError, match="NaN"):
        auc.add(torch.tensor([0.1, float("nan"), 0.3]), torch.tensor([0, 1, 2], dtype=torch.uint8))
    with pytest.raises(ValueError):
        auc.add(torch.randn(5), torch.zeros(4, dtype=torch.uint8))
    assert auc.count == 20  # rejected chunks leave no trace
    with pytest.raises(ValueError):
        StreamingAUC(bits=4)
    with pytest.raises(ValueError):
        StreamingAUC(bits=30)


@pytest.mark.parametrize("exact_limit", [1 << 22, 50], ids=["exact", "histogram"])
def test_add_counts_is_add_of_the_repeated_scores(exact_limit):
    """A weighted add (distinct values with their counts) gives the same AUC, bound, precision and ROC as adding
    every repeat; sklearn on the repeats is the reference."""
    rng = np.random.default_rng(3)
    values = torch.from_numpy(np.round(rng.normal(size=60), 1).astype(np.float32))
    cats = torch.from_numpy(rng.integers(0, 3, 60).astype(np.uint8))
    weights = torch.from_numpy(rng.integers(0, 5, 60).astype(np.int64))
    weighted, repeated = StreamingAUC(bits=8, exact_limit=exact_limit), StreamingAUC(bits=8, exact_limit=exact_limit)
    weighted.add(values[:5], cats[:5])  # mixed with ordinary adds
    repeated.add(values[:5], cats[:5])
    weighted.add_counts(values, cats, weights)
    repeated.add(torch.repeat_interleave(values, weights), torch.repeat_interleave(cats, weights))
    assert weighted.count == repeated.count == 5 + int(weights.sum())
    for target in TARGETS:
        assert weighted.result(target) == repeated.result(target), target
        assert weighted.precision_at(target, (0.1, 0.5)) == repeated.precision_at(target, (0.1, 0.5))
        assert weighted.roc_curve(target) == repeated.roc_curve(target)
    all_scores = torch.cat([values[:5], torch.repeat_interleave(values, weights)]).numpy()
    all_cats = torch.cat([cats[:5], torch.repeat_interleave(cats, weights)]).numpy()
    result = weighted.result("forget")
    expected = roc_auc_score(all_cats == FORGET, all_scores)
    assert abs(result.value - expected) <= result.error_bound + 1e-12


@pytest.mark.parametrize("exact_limit", [1 << 22, 10], ids=["exact", "histogram"])
def test_add_counts_rejects_bad_input(exact_limit):
    auc = StreamingAUC(exact_limit=exact_limit)
    auc.add(torch.randn(20), torch.zeros(20, dtype=torch.uint8))
    ones = torch.ones(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="NaN"):
        auc.add_counts(torch.tensor([0.1, float("nan"), 0.3]), torch.tensor([0, 1, 2], dtype=torch.uint8), ones)
    with pytest.raises(ValueError, match="weights must be >= 0"):
        auc.add_counts(torch.ones(3), torch.zeros(3, dtype=torch.uint8), -ones)
    with pytest.raises(ValueError, match="3 scores, 3 categories and 2 weights"):
        auc.add_counts(torch.ones(3), torch.zeros(3, dtype=torch.uint8), ones[:2])
    with pytest.raises(ValueError, match="category"):
        auc.add_counts(torch.ones(3), torch.tensor([0, 3, 1], dtype=torch.uint8), ones)
    assert auc.count == 20  # rejected chunks leave no trace


def _reference_precision(scores, labels, fraction):
    n = scores.size
    k = math.ceil(fraction * n)
    if k == 0:
        return None
    desc = np.sort(scores)[::-1]
    t = desc[k - 1]
    above = scores > t
    tie = scores == t
    return (labels[above].sum() + (k - above.sum()) * labels[tie].sum() / tie.sum()) / k


FRACTIONS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0)


@pytest.mark.parametrize("kind", ["continuous", "rounded", "integer", "all-equal"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_precision_at_matches_brute_force(target, kind):
    rng = np.random.default_rng(7)
    n = 2500
    cats = _cats(rng, n)
    scores = _signal(rng, cats, kind)
    auc = _feed(StreamingAUC(), scores, cats, rng)
    pos_cats, neg_cats = TARGETS[target]
    keep = np.isin(cats, pos_cats + neg_cats)
    labels = np.isin(cats[keep], pos_cats).astype(np.float64)
    got = auc.precision_at(target, FRACTIONS)
    assert list(got) == [f"{f * 100:g}%" for f in FRACTIONS]
    for f in FRACTIONS:
        expected = _reference_precision(scores[keep].astype(np.float64), labels, f)
        assert got[f"{f * 100:g}%"] == pytest.approx(expected, abs=1e-12), (f, kind)
    assert got["100%"] == pytest.approx(labels.mean(), abs=1e-12)


@pytest.mark.parametrize("bits", [12, 16])
def test_precision_at_histogram_mode_with_bin_exact_values(bits):
    rng = np.random.default_rng(8)
    n = 5000
    cats = _cats(rng, n)
    if bits == 12:  # eighths with at most 4 significant bits
        scores = (rng.integers(-15, 12, n) / 8.0 + 0.25 * (cats == 2)).astype(np.float32)
    else:  # bf16 values
        scores = (rng.integers(-127, 128, n) / 128.0 + 0.25 * (cats == 2)).astype(np.float32)
        scores = torch.from_numpy(scores).bfloat16().float().numpy()
    exact = _feed(StreamingAUC(), scores, cats, rng)
    hist = _feed(StreamingAUC(bits=bits, exact_limit=100), scores, cats, rng, max_chunk=2500)
    for target in TARGETS:
        pos_cats, neg_cats = TARGETS[target]
        keep = np.isin(cats, pos_cats + neg_cats)
        labels = np.isin(cats[keep], pos_cats).astype(np.float64)
        got_h = hist.precision_at(target, FRACTIONS)
        got_e = exact.precision_at(target, FRACTIONS)
        for f in FRACTIONS:
            expected = _reference_precision(scores[keep].astype(np.float64), labels, f)
            label = f"{f * 100:g}%"
            assert got_h[label] == pytest.approx(expected, abs=1e-12)
            assert got_e[label] == pytest.approx(expected, abs=1e-12)


def test_precision_at_small_fraction_is_none_when_k_is_zero():
    auc = StreamingAUC()
    auc.add(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([2, 0, 2], dtype=torch.uint8))
    assert auc.precision_at("forget", (0.0,)) == {"0%": None}
    assert auc.precision_at("forget", (0.01,)) == {"1%": 1.0}  # k = ceil(0.03) = 1: the top score, 0.3


def _trapezoid(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


@pytest.mark.parametrize("exact_limit", [1 << 22, 100], ids=["exact", "histogram"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_roc_curve(target, exact_limit):
    rng = np.random.default_rng(9)
    n = 4000
    cats = _cats(rng, n)
    scores = torch.from_numpy(_signal(rng, cats, "rounded")).bfloat16().float().numpy()
    auc = _feed(StreamingAUC(bits=16, exact_limit=exact_limit), scores, cats, rng, max_chunk=2000)
    res = auc.result(target)
    full = auc.roc_curve(target, max_points=10**9)
    for curve in (full, auc.roc_curve(target), auc.roc_curve(target, max_points=16)):
        fpr, tpr = np.array(curve["fpr"]), np.array(curve["tpr"])
        assert fpr.size == tpr.size >= 2
        assert (fpr[0], tpr[0]) == (0.0, 0.0)
        assert (fpr[-1], tpr[-1]) == (1.0, 1.0)
        assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    assert len(auc.roc_curve(target, max_points=16)["fpr"]) <= 16 + 2
    assert len(auc.roc_curve(target)["fpr"]) <= 256 + 2
    # un-thinned: one point per distinct score, and the trapezoidal area is the AUC (points rounded to 1e-6)
    distinct = np.unique(scores[np.isin(cats, TARGETS[target][0] + TARGETS[target][1])]).size
    assert len(full["fpr"]) == distinct + 1
    assert _trapezoid(full["fpr"], full["tpr"]) == pytest.approx(res.value, abs=2e-6)
    assert _trapezoid(full["fpr"], full["tpr"]) == pytest.approx(_sk(target, scores, cats), abs=2e-6)


def test_binned_auc_hand_computed():
    # bins in ascending score order b0 < b1 < b2; positives at b1, b2; negatives at b0, b1
    # pairs (pos, neg): (b1, b0) = 1, (b1, b1) = 1/2 (tie), (b2, b0) = 1, (b2, b1) = 1  ->  3.5 / 4
    pos, neg = np.array([0, 1, 1]), np.array([1, 1, 0])
    res = binned_auc(pos, neg)
    assert res.value == 0.875 and res.error_bound == 0.0 and res.exact
    assert (res.n_pos, res.n_neg) == (2, 2)
    assert res.value == roc_auc([0, 1, 1, 2], [0, 0, 1, 1])
    # bound: 1/2 * (uncertain pairs) / (P * N); only b1 holds a (pos, neg) pair: 1/2 * 1 / 4
    assert binned_auc(pos, neg, np.array([0, 1, 0])).error_bound == 0.125
    assert binned_auc(pos, neg, np.zeros(3)).error_bound == 0.0
    assert binned_auc(pos, neg, np.zeros(3)).exact

    # P = N = 6; wins = 2*(0 + 1/2) + 1*(1 + 2/2) + 0 + 3*(5 + 1/2) = 19.5
    pos, neg = np.array([2, 1, 0, 3]), np.array([1, 2, 2, 1])
    res = binned_auc(pos, neg)
    assert res.value == pytest.approx(19.5 / 36, abs=1e-15)
    expanded = np.repeat(np.arange(4), pos + neg)
    labels = np.concatenate([[1] * p + [0] * q for p, q in zip(pos, neg, strict=True)])
    assert res.value == pytest.approx(roc_auc_score(labels, expanded), abs=1e-15)
    # the "mixed bins" bound 1/2 * sum_mixed pos_b * neg_b / (P * N): every within-bin pair of a mixed bin is uncertain
    for mixed in (np.ones(4, dtype=bool), np.array([True, False, False, True]), np.array([False, True, True, False])):
        expected = 0.5 * sum(int(p) * int(q) for p, q, m in zip(pos, neg, mixed, strict=True) if m) / 36
        assert binned_auc(pos, neg, pos * neg * mixed).error_bound == pytest.approx(expected, abs=1e-15)
    assert binned_auc(pos, neg, pos * neg).error_bound == pytest.approx(0.5 * (2 + 2 + 0 + 3) / 36, abs=1e-15)
    assert binned_auc(pos, neg, np.array([1, 0, 0, 2])).error_bound == pytest.approx(0.5 * 3 / 36, abs=1e-15)
    # one class empty
    assert binned_auc(np.array([0, 0]), np.array([1, 2])).value is None
    assert binned_auc(np.array([3]), np.array([0])).value is None


def test_histogram_bound_counts_only_pairs_off_the_bin_edge():
    """Keys on a bin's lower edge are all equal: their pairs are exact ties, only off-edge pairs are uncertain."""
    edge, off = 1.0, float(np.nextafter(np.float32(1.0), np.float32(2.0)))  # same 12-bit bin, low bits 0 / 1
    scores = np.array([edge] * 3 + [off] + [edge] * 2 + [off] * 2 + [2.0, 0.5], dtype=np.float32)
    cats = np.array([2] * 4 + [0] * 4 + [2, 0], dtype=np.uint8)
    auc = StreamingAUC(bits=12, exact_limit=1)
    auc.add(torch.from_numpy(scores), torch.from_numpy(cats))
    res = auc.result("forget")
    # the shared bin: 4 positives (3 on the edge) x 4 negatives (2 on the edge): 16 - 3*2 = 10 uncertain pairs
    assert (res.n_pos, res.n_neg) == (5, 5)
    assert res.error_bound == pytest.approx(0.5 * 10 / 25, abs=1e-15)
    assert abs(res.value - _sk("forget", scores, cats)) <= res.error_bound + 1e-12
    # only edge values in the shared bin: exact again
    auc = StreamingAUC(bits=12, exact_limit=1)
    auc.add(torch.from_numpy(np.where(scores == off, edge, scores)), torch.from_numpy(cats))
    assert auc.result("forget").exact


@pytest.mark.parametrize("seed", range(3))
def test_histogram_bound_is_rigorous_for_clustered_values(seed):
    """Values crowded near bin edges (both signs), labels tied to the position inside the bin: never out of bound."""
    rng = np.random.default_rng(1000 + seed)
    n = 3000
    cats = _cats(rng, n)
    centers = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=np.float32)
    base = centers[rng.integers(0, centers.size, n)]
    steps = (rng.integers(0, 6, n) + 3 * (cats == 2) - 2 * (cats == 0)).clip(0)  # inside-bin order follows the label
    toward = np.where(rng.random(n) < 0.5, np.float32(np.inf), np.float32(-np.inf))
    scores = base.copy()
    for _ in range(int(steps.max())):
        move = steps > 0
        scores[move] = np.nextafter(scores[move], toward[move])
        steps = steps - 1
    scores = scores.astype(np.float32)
    for bits in (8, 12, 16):
        auc = _feed(StreamingAUC(bits=bits, exact_limit=50), scores, cats, rng, max_chunk=2000)
        for target in TARGETS:
            res = auc.result(target)
            assert abs(res.value - _sk(target, scores, cats)) <= res.error_bound + 1e-12, (bits, target, res)


def test_binned_precision_and_roc_hand_computed():
    pos, neg = np.array([0, 1, 1]), np.array([1, 1, 0])  # descending: [1+ 0-], [1+ 1-], [0+ 1-]
    got = binned_precision(pos, neg, (0.25, 0.5, 0.75, 1.0))
    # k=1: the top bin (1 positive); k=2: 1 + half of the tied bin b1 (1 of 2 positive) = 1.5 / 2;
    # k=3: 1 + 1 = 2 of 3; k=4: 2 of 4
    assert got == {"25%": 1.0, "50%": 0.75, "75%": pytest.approx(2 / 3), "100%": 0.5}
    curve = binned_roc(pos, neg)
    assert curve == {"fpr": [0.0, 0.0, 0.5, 1.0], "tpr": [0.0, 0.5, 1.0, 1.0]}
    assert _trapezoid(curve["fpr"], curve["tpr"]) == 0.875
    assert binned_roc(np.array([0, 0]), np.array([1, 1])) == {"fpr": [], "tpr": []}
