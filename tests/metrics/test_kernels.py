"""Compiled kernels of the scorer (``lacuna_metrics.kernels``) against plain-numpy definitions written here.

Covers ``histogram_add`` (bins, off-edge counts, low-bit extremes, NaN and bad-category rejection),
``stable_sorted``/``stable_order``/``rank_categories`` (bf16 keys with and without low bits, big buckets;
and ``within_tensor_quantile``), ``categorize`` (and ``categories``), ``pair_pass``,
``diff_square_sums``, ``count_nonfinite``, the histogram bookkeeping kernels ``occupied_bins``/``clear_bins``/
``merge_bins`` directly and through ``StreamingAUC.merge_into``/``reset``, and ``qtile_histogram_add`` through
``StreamingAUC.add_ranked``; the average-rank (mid-rank) qtile kernels ``stable_sorted_ties``/
``rank_categories_ties``, ``qtile_ties_values`` (against ``scipy.stats.rankdata(method="average")``) and
``qtile_ties_histogram_add`` (directly and through ``StreamingAUC.add_ranked_ties``), and
``within_tensor_qtile``. Inputs are small and include signed zeros, ±inf, denormals and heavy ties.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from lacuna_metrics.kernels import (
    TABLE_KEYS,
    bf16_value_counts,
    categorize,
    clear_bins,
    count_nonfinite,
    diff_square_sums,
    fold_table,
    histogram_add,
    histogram_add_counts,
    merge_bins,
    occupied_bins,
    pair_pass,
    qtile_histogram_add,
    qtile_ties_histogram_add,
    qtile_ties_values,
    rank_categories,
    rank_categories_ties,
    stable_order,
    stable_sorted,
    stable_sorted_ties,
)
from lacuna_metrics.localization.auc import TARGETS, StreamingAUC, float_keys
from lacuna_metrics.localization.precision import categories, qtile_values, within_tensor_qtile, within_tensor_quantile
from lacuna_metrics.masks import group_bits

TINY = np.finfo(np.float32).smallest_subnormal
BIG = np.finfo(np.float32).max
FRACTIONS = (0.001, 0.01, 0.1, 0.5, 1.0)


def _bits_as_f32(*patterns):
    """float32 values with the given raw bit patterns (NaN payloads, signalling NaNs, ...)."""
    return np.array(patterns, dtype=np.uint32).view(np.float32)


def _special_scores():
    """Signed zeros, denormals, ±inf, ±max, values one ulp apart and plain numbers."""
    return np.array(
        [0.0, -0.0, TINY, -TINY, 2 * TINY, -2 * TINY, 1e-40, -1e-40, np.finfo(np.float32).tiny, -1e-45]
        + [np.inf, -np.inf, BIG, -BIG, 1.0, -1.0, 1.0000001, -1.0000001, 0.5, -0.5, 3e38, -3e38, 1e-30, -1e-30],
        dtype=np.float32,
    )


def _scores(rng, n, kind):
    """float32 test scores of ``n`` scalars; ``kind`` controls the ties and the range."""
    if kind == "special":
        out = rng.choice(_special_scores(), n)
    elif kind == "ties":
        out = rng.integers(-3, 4, n).astype(np.float32) / 2
        out[rng.random(n) < 0.3] = -0.0
    elif kind == "wide":
        out = rng.normal(size=n) * 10.0 ** rng.integers(-40, 38, n)
    elif kind == "continuous":
        out = rng.normal(size=n)
    elif kind == "bf16":  # |θ| and most |δ| of bf16 checkpoints: low 16 bits zero, the side table's keys
        values = np.abs(rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
        out = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)
        out[rng.random(n) < 0.2] = 0.0
        out[rng.random(n) < 0.1] *= np.float32(1.0 + 2.0**-20)  # some keys with low bits: the histogram's path
        out[rng.random(n) < 0.1] *= -1
    else:
        raise AssertionError(kind)
    return np.asarray(out, dtype=np.float32)


def _keys(scores):
    """Reference uint32-range int64 keys (via ``float_keys``, itself tested in test_auc.py)."""
    return float_keys(torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32).copy())).numpy()


# --------------------------------------------------------------------------------------------------
# histogram_add


def _empty_histogram(bits):
    shift = 32 - bits
    return (
        np.zeros((1 << bits) * 3, dtype=np.int64),
        np.zeros((1 << bits) * 3, dtype=np.int64),
        np.full(1 << bits, 1 << shift, dtype=np.int64),
        np.full(1 << bits, -1, dtype=np.int64),
    )


def _reference_histogram_add(scores, cats, bits, counts, off_edge, low_min, low_max):
    """numpy definition: bin = key >> shift, index bin * 3 + cat; low bits = key & (2**shift − 1)."""
    shift = 32 - bits
    keys = _keys(scores)
    b = keys >> shift
    idx = b * 3 + cats.astype(np.int64)
    low = keys & ((1 << shift) - 1)
    off = low != 0
    np.add.at(counts, idx, 1)
    np.add.at(off_edge, idx[off], 1)
    np.minimum.at(low_min, b[off], low[off])
    np.maximum.at(low_max, b[off], low[off])


def _kernel_histogram_add(scores, cats, bits, arrays):
    """histogram_add with a fresh side table, folded in afterwards: the pair must equal the numpy definition."""
    table = np.zeros(TABLE_KEYS * 3, dtype=np.int64)
    shift, half = 32 - bits, 1 << (bits - 1)
    result = histogram_add(scores, cats, shift, half, *arrays, table)
    if result == -1:
        fold_table(table, shift, half, *arrays)
        assert not table.any()  # folded means emptied
    else:
        assert not table.any()  # a rejected block leaves no trace in the table either
    return result


def _assert_same_arrays(got, expected):
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("bits", [8, 12, 16, 20])
@pytest.mark.parametrize("kind", ["special", "ties", "wide", "continuous", "bf16"])
def test_histogram_add_matches_numpy(bits, kind):
    rng = np.random.default_rng([bits, len(kind)])
    got, expected = _empty_histogram(bits), _empty_histogram(bits)
    for n in (0, 1, 7, 500, 3000):  # several blocks into the same histogram: counts accumulate
        scores = _scores(rng, n, kind)
        cats = rng.integers(0, 3, n).astype(np.uint8)
        before = scores.copy()
        assert _kernel_histogram_add(scores, cats, bits, got) == -1
        _reference_histogram_add(scores, cats, bits, *expected)
        _assert_same_arrays(got, expected)
        np.testing.assert_array_equal(scores.view(np.uint32), before.view(np.uint32))  # input untouched
    counts, off_edge, low_min, low_max = got
    assert counts.sum() == 3508
    assert (off_edge <= counts).all()
    empty = low_max == -1
    assert (low_min[empty] == 1 << (32 - bits)).all()
    assert (low_min[~empty] <= low_max[~empty]).all() and (low_min[~empty] > 0).all()


@pytest.mark.parametrize("bits", [8, 20])
@pytest.mark.parametrize("kind", ["special", "ties", "wide", "bf16"])
def test_histogram_add_counts_is_histogram_add_of_the_repeats(bits, kind):
    """Each score added ``weights[i]`` times (zero weights: not at all, no low-bit trace) = the repeated scores."""
    rng = np.random.default_rng([bits, len(kind), 7])
    got, expected = _empty_histogram(bits), _empty_histogram(bits)
    shift, half = 32 - bits, 1 << (bits - 1)
    for n in (0, 1, 300):
        scores = _scores(rng, n, kind)
        cats = rng.integers(0, 3, n).astype(np.uint8)
        weights = rng.integers(0, 4, n).astype(np.int64)
        weights[: n // 3] = 0
        assert histogram_add_counts(scores, cats, weights, shift, half, *got) == -1
        _reference_histogram_add(np.repeat(scores, weights), np.repeat(cats, weights), bits, *expected)
        _assert_same_arrays(got, expected)


def test_histogram_add_counts_rejects_nan_and_bad_categories_without_trace():
    arrays = _empty_histogram(12)
    scores = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    cats, weights = np.zeros(3, dtype=np.uint8), np.ones(3, dtype=np.int64)
    assert histogram_add_counts(scores, cats, weights, 20, 1 << 11, *arrays) == 1
    assert (
        histogram_add_counts(np.ones(3, np.float32), np.array([0, 3, 1], np.uint8), weights, 20, 1 << 11, *arrays) == -3
    )
    _assert_same_arrays(arrays, _empty_histogram(12))


@pytest.mark.parametrize("kind", ["special", "ties", "bf16"])
def test_bf16_value_counts_counts_bf16_keys_and_lists_the_rest(kind):
    rng = np.random.default_rng(len(kind))
    scores = _scores(rng, 2000, kind)
    cats = rng.integers(0, 3, scores.size).astype(np.uint8)
    table, rest = np.zeros(TABLE_KEYS * 3, dtype=np.int64), np.full(scores.size, -1, dtype=np.int64)
    m = bf16_value_counts(scores, cats, table, rest)
    bits = scores.view(np.int32)
    is_bf16 = (bits >= 0) & ((bits & 0xFFFF) == 0)  # non-negative (−0.0 is not), low 16 bits zero
    np.testing.assert_array_equal(rest[:m], np.flatnonzero(~is_bf16))
    expected = np.zeros_like(table)
    np.add.at(expected, (bits[is_bf16] >> 16).astype(np.int64) * 3 + cats[is_bf16], 1)
    np.testing.assert_array_equal(table, expected)
    assert m < scores.size or kind == "special"


@pytest.mark.parametrize("bits", [8, 20])
def test_histogram_add_signed_zeros_share_a_bin_on_its_edge(bits):
    arrays = _empty_histogram(bits)
    scores = np.array([0.0, -0.0, -0.0, 0.0, -0.0], dtype=np.float32)
    cats = np.array([0, 1, 2, 2, 2], dtype=np.uint8)
    assert _kernel_histogram_add(scores, cats, bits, arrays) == -1
    counts, off_edge, low_min, low_max = arrays
    zero_bin = 1 << (bits - 1)  # key 2**31: the middle bin, low bits 0
    np.testing.assert_array_equal(np.flatnonzero(counts), [3 * zero_bin, 3 * zero_bin + 1, 3 * zero_bin + 2])
    np.testing.assert_array_equal(counts[3 * zero_bin : 3 * zero_bin + 3], [1, 1, 3])
    assert not off_edge.any() and (low_max == -1).all() and (low_min == 1 << (32 - bits)).all()


def test_histogram_add_low_bit_extremes_per_bin():
    """Consecutive floats above 1.0 fall in one 12-bit bin; their low bits are 0, 1, 2, ... (hand-computed)."""
    bits = 12
    arrays = _empty_histogram(bits)
    scores = (1.0 + np.array([3, 0, 7, 5, 7]) * 2.0**-23).astype(np.float32)
    cats = np.array([0, 2, 2, 1, 0], dtype=np.uint8)
    assert _kernel_histogram_add(scores, cats, bits, arrays) == -1
    counts, off_edge, low_min, low_max = arrays
    b = (0x3F800000 + (1 << 31)) >> 20
    np.testing.assert_array_equal(counts[3 * b : 3 * b + 3], [2, 1, 2])
    np.testing.assert_array_equal(off_edge[3 * b : 3 * b + 3], [2, 1, 1])  # 1.0 itself is on the edge
    assert (low_min[b], low_max[b]) == (3, 7)
    assert counts.sum() == 5 and off_edge.sum() == 4
    assert (np.delete(low_max, b) == -1).all()


NAN_PATTERNS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF]


@pytest.mark.parametrize("bits", [8, 20])
@pytest.mark.parametrize("pattern", NAN_PATTERNS, ids=[hex(p) for p in NAN_PATTERNS])
def test_histogram_add_rejects_nan_without_trace(bits, pattern):
    rng = np.random.default_rng(bits)
    arrays = _empty_histogram(bits)
    scores = _scores(rng, 400, "special")
    cats = rng.integers(0, 3, 400).astype(np.uint8)
    assert _kernel_histogram_add(scores, cats, bits, arrays) == -1
    state = tuple(a.copy() for a in arrays)
    for at in (0, 5, 399):
        bad = _scores(rng, 400, "special")
        bad[at] = _bits_as_f32(pattern)[0]
        bad[-1] = np.nan  # a second NaN does not matter: the first one is reported
        assert _kernel_histogram_add(bad, cats, bits, arrays) == at
        _assert_same_arrays(arrays, state)
    # a NaN is reported even when a bad category comes first
    bad = _scores(rng, 400, "continuous")
    bad[10] = np.nan
    bad_cats = cats.copy()
    bad_cats[3] = 3
    assert _kernel_histogram_add(bad, bad_cats, bits, arrays) == 10
    _assert_same_arrays(arrays, state)


@pytest.mark.parametrize("bits", [8, 20])
@pytest.mark.parametrize("code", [3, 4, 255])
def test_histogram_add_rejects_bad_category_without_trace(bits, code):
    rng = np.random.default_rng(code)
    arrays = _empty_histogram(bits)
    scores = _scores(rng, 300, "wide")
    cats = rng.integers(0, 3, 300).astype(np.uint8)
    assert _kernel_histogram_add(scores, cats, bits, arrays) == -1
    state = tuple(a.copy() for a in arrays)
    for at in (0, 17, 299):
        bad = cats.copy()
        bad[at] = code
        bad[-1] = 3  # only the first bad code is reported
        assert _kernel_histogram_add(scores, bad, bits, arrays) == -2 - at
        _assert_same_arrays(arrays, state)


# --------------------------------------------------------------------------------------------------
# stable_order and within_tensor_quantile


def _reference_order(scores):
    """Stable argsort with −0.0 == +0.0: sort the order-preserving keys."""
    return np.argsort(_keys(scores), kind="stable")


@pytest.mark.parametrize("kind", ["special", "ties", "wide", "continuous"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 100, 4097, 65537, 100_000])
def test_stable_order_matches_stable_argsort(kind, n):
    rng = np.random.default_rng([n, len(kind)])
    scores = _scores(rng, n, kind)
    before = scores.copy()
    order = stable_order(scores)
    assert order.dtype == np.uint32 and order.shape == (n,)
    expected = _reference_order(scores)
    np.testing.assert_array_equal(order, expected)
    # the same as numpy's own stable sort once −0.0 is turned into +0.0
    np.testing.assert_array_equal(order, np.argsort(scores + np.float32(0.0), kind="stable"))
    np.testing.assert_array_equal(scores.view(np.uint32), before.view(np.uint32))  # input untouched


def test_stable_order_hand_cases():
    assert stable_order(np.zeros(0, dtype=np.float32)).tolist() == []
    assert stable_order(np.array([-0.0], dtype=np.float32)).tolist() == [0]
    # signed zeros are one tie, kept in index order between the negatives and the positives
    x = np.array([0.0, -0.0, np.inf, -TINY, -0.0, TINY, -np.inf, 0.0], dtype=np.float32)
    assert stable_order(x).tolist() == [6, 3, 0, 1, 4, 7, 5, 2]
    # all equal: the identity
    assert stable_order(np.full(70_000, 2.5, dtype=np.float32)).tolist() == list(range(70_000))
    # keys that differ only in their low 16 bits, or only in their high 16 bits
    low = (1.0 + np.array([5, 1, 3, 1, 0]) * 2.0**-23).astype(np.float32)
    assert stable_order(low).tolist() == [4, 1, 3, 2, 0]
    high = np.array([4.0, -2.0, 1.0, -2.0, 0.5], dtype=np.float32)
    assert stable_order(high).tolist() == [1, 3, 4, 2, 0]


def test_stable_order_heavy_ties_keep_index_order():
    rng = np.random.default_rng(11)
    scores = rng.choice(np.array([-1.0, -0.0, 0.0, 1.0, np.inf], dtype=np.float32), 50_000)
    order = stable_order(scores).astype(np.int64)
    keys = _keys(scores)[order]
    assert (np.diff(keys) >= 0).all()
    same = np.diff(keys) == 0
    assert (np.diff(order)[same] > 0).all()  # within a tie, ascending indices


def _bf16(values):
    """float32 values truncated to bf16: the low 16 bits of the pattern zero, one exact key per high half."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)


def _with_low_bits(rng, values, fraction):
    """A copy of float32 ``values`` with random nonzero low 16 bits on about ``fraction`` of them (same high half)."""
    out = np.array(values, dtype=np.float32)
    pick = np.flatnonzero(rng.random(out.size) < fraction)
    patterns = out.view(np.uint32)
    patterns[pick] = (patterns[pick] & 0xFFFF0000) | rng.integers(1, 1 << 16, pick.size).astype(np.uint32)
    return out


def _sort_scores(rng, n, kind):
    """float32 inputs for both paths of ``stable_sorted``: keys whose low half is zero, and the others."""
    if kind == "bf16":  # every low half zero: only the high-half pass; both signs, signed zeros, wide range
        out = _bf16(rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n))
        out[rng.random(n) < 0.3] = 0.0
        out[rng.random(n) < 0.1] = -0.0
    elif kind == "bf16 few":  # bf16 keys, 2% others in their buckets, 1% in buckets of their own
        out = _with_low_bits(rng, rng.choice(np.float32([-3, -1, -0.5, -0.0, 0, 0.25, 1, 2]), n), 0.02)
        alone = rng.random(n) < 0.01  # ±5 and the denormals next to zero's bucket: no bf16 key there
        out[alone] = _with_low_bits(rng, rng.choice(np.float32([-5, 5, -0.0, 0]), alone.sum()), 1.0)
    elif kind == "delta":  # |after − before| of a bf16 checkpoint pair, as the qtile score sees it
        before = _bf16(rng.normal(size=n) * 0.02)
        moved = rng.random(n) < 0.4
        out = np.abs(_bf16(before + rng.normal(size=n) * 5e-4 * moved) - before)
    elif kind == "big buckets":  # ±[1, 2): 256 buckets of many varied low halves, some bf16 keys, some ties
        out = (1.0 + rng.random(n)).astype(np.float32) * rng.choice(np.float32([-1, 1]), n)
        flat = rng.random(n) < 0.2
        out[flat] = _bf16(out[flat])
        out[rng.random(n) < 0.1] = out[:1]
    elif kind == "ties":  # a handful of values, each repeated, with and without low bits, and signed zeros
        pool = np.float32([-1.5, -1.0, -0.0, 0.0, 1.0, 1.5, 7.0])
        out = rng.choice(np.concatenate([pool, _with_low_bits(rng, pool[[0, 1, 4, 6]], 1.0)]), n)
    else:
        raise AssertionError(kind)
    return np.asarray(out, dtype=np.float32)


def _assert_stable_sorted(scores, rng):
    """``stable_order``, ``rank_categories`` and ``stable_sorted`` against numpy's stable argsort (−0.0 → +0.0)."""
    before = scores.copy()
    expected = np.argsort(scores + np.float32(0.0), kind="stable")
    order = stable_order(scores)
    assert order.dtype == np.uint32 and order.shape == scores.shape
    np.testing.assert_array_equal(order, expected)
    cats = rng.integers(0, 3, scores.size).astype(np.uint8)
    ranked = rank_categories(scores, cats)
    assert ranked.dtype == np.uint8
    np.testing.assert_array_equal(ranked, cats[expected])
    payload = rng.integers(-(2**62), 2**62, scores.size)  # any payload dtype
    np.testing.assert_array_equal(stable_sorted(scores, payload), payload[expected])
    np.testing.assert_array_equal(scores.view(np.uint32), before.view(np.uint32))  # input untouched


@pytest.mark.parametrize("kind", ["bf16", "bf16 few", "delta", "big buckets", "ties"])
@pytest.mark.parametrize("n", [0, 1, 2, 17, 1000, 70_000])
def test_stable_sorted_matches_stable_argsort(kind, n):
    rng = np.random.default_rng([n, len(kind), 7])
    scores = _sort_scores(rng, n, kind)
    low = (scores.view(np.uint32) & 0xFFFF) != 0
    if kind == "bf16":
        assert not low.any()
    elif n >= 1000 and kind != "delta":  # both paths, and buckets holding both kinds of keys
        high = scores.view(np.uint32) >> 16
        assert low.any() and not low.all()
        assert np.intersect1d(high[low], high[~low]).size > 0
        if kind == "bf16 few":
            assert np.setdiff1d(high[low], high[~low]).size > 0  # and buckets with only keys with low bits
    _assert_stable_sorted(scores, rng)


@pytest.mark.parametrize("sign", [1, -1])
def test_stable_sorted_one_huge_bucket(sign):
    # 300 000 keys in one high-half bucket: 1 + k ulps (k < 2**16) with heavy ties, k = 0 the bucket's bf16 key
    rng = np.random.default_rng(5)
    k = rng.integers(0, 1 << 16, 300_000)
    k[rng.random(k.size) < 0.3] = 0
    k[rng.random(k.size) < 0.1] = 12345
    scores = ((0x3F800000 + k).astype(np.uint32).view(np.float32) * np.float32(sign)).astype(np.float32)
    assert np.unique(scores.view(np.uint32) >> 16).size == 1
    _assert_stable_sorted(scores, rng)


def test_stable_sorted_bucket_hand_cases():
    rng = np.random.default_rng(3)
    # one bucket (and its neighbours): the bf16 key first in index order, then the others by their low half
    pos = _bits_as_f32(0x3F800002, 0x3F800000, 0x3F80FFFF, 0x3F800001, 0x3F800000, 0x3F810000, 0x3F7FFFFF, 0x3F800002)
    assert stable_order(pos).tolist() == [6, 1, 4, 3, 0, 7, 2, 5]
    # the same magnitudes negated: the bucket's bf16 key (the smallest magnitude) is now its largest value
    neg = _bits_as_f32(*(int(p) | 0x80000000 for p in pos.view(np.uint32)))
    assert stable_order(neg).tolist() == [5, 2, 0, 7, 3, 1, 4, 6]
    # signed zeros between the denormals of the same high halves (±0x0000xxxx and ±0x0001xxxx)
    zeros = _bits_as_f32(1, 0x80000000, 0x80000001, 0, 0xFFFF, 0x10000, 0x8000FFFF, 0x80010000, 0x80000000)
    assert stable_order(zeros).tolist() == [7, 6, 2, 1, 3, 8, 0, 4, 5]
    # extremes: ±inf, ±max and the smallest denormals
    ends = np.array([BIG, -np.inf, TINY, -BIG, np.inf, -TINY, 0.0, -0.0], dtype=np.float32)
    assert stable_order(ends).tolist() == [1, 3, 5, 6, 7, 2, 0, 4]
    for scores in (pos, neg, zeros, ends, np.concatenate([pos, neg, zeros, ends])):
        _assert_stable_sorted(scores, rng)


@pytest.mark.parametrize("shape", [(0,), (1,), (37, 29), (4, 8, 300)])
def test_within_tensor_quantile_is_the_stable_order(shape):
    rng = np.random.default_rng(len(shape))
    n = math.prod(shape)
    values = _scores(rng, n, "ties").reshape(shape)
    t = torch.from_numpy(values.copy())
    order = within_tensor_quantile(t)
    assert order.dtype == torch.int64 and order.shape == (n,)
    np.testing.assert_array_equal(order.numpy(), _reference_order(values.reshape(-1)))
    if len(shape) == 2:  # a non-contiguous view and a float64 tensor are flattened in row-major order first
        tt = t.t()
        np.testing.assert_array_equal(within_tensor_quantile(tt).numpy(), _reference_order(tt.reshape(-1).numpy()))
        np.testing.assert_array_equal(within_tensor_quantile(t.double()).numpy(), order.numpy())


# --------------------------------------------------------------------------------------------------
# categorize


def _reference_categories(packed, forget_bits, retain_bits):
    forget = (packed & np.int32(forget_bits)) != 0
    retain = (packed & np.int32(retain_bits)) != 0
    return np.where(forget, 2, np.where(retain, 1, 0)).astype(np.uint8)


SIGN = -(1 << 31)  # bit 31 as a signed int32
BIT_CASES = [
    (0b0101, 0b1010),
    (SIGN, 0b1),
    (0b1, SIGN),
    (SIGN | 0b100, 0x7FFFFFFF & ~0b100),
    (0b11, 0b110),  # bit 1 in both: forget wins
    (0, 0b1111),
    (0b1111, 0),
    (0, 0),
    (-1, 0),  # every bit forget
]


@pytest.mark.parametrize("forget_bits, retain_bits", BIT_CASES)
def test_categorize_matches_numpy(forget_bits, retain_bits):
    rng = np.random.default_rng(abs(forget_bits) % 1000 + retain_bits % 1000)
    full = rng.integers(-(1 << 31), 1 << 31, 2000, dtype=np.int64).astype(np.int32)
    sparse = np.where(rng.random(2000) < 0.6, 0, 1 << rng.integers(0, 32, 2000)).astype(np.int64)
    sparse = ((sparse + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)  # bit 31 -> negative int32
    edge = np.array([0, -1, SIGN, 1, 0x7FFFFFFF, SIGN | 1, 0b1010, 0b0101], dtype=np.int32)
    packed = np.concatenate([edge, full, sparse])
    out = np.full(packed.size, 99, dtype=np.uint8)
    categorize(packed, np.int32(forget_bits), np.int32(retain_bits), out)
    np.testing.assert_array_equal(out, _reference_categories(packed, forget_bits, retain_bits))
    # the torch wrapper, with any shape
    wrapped = categories(torch.from_numpy(packed.reshape(2, -1).copy()), forget_bits, retain_bits)
    assert wrapped.dtype == torch.uint8
    np.testing.assert_array_equal(wrapped.numpy(), out)


def test_categorize_hand_cases_with_group_31():
    forget, retain = group_bits([0, 31]), group_bits([1, 30])
    assert forget < 0  # group 31 is the sign bit
    packed = torch.tensor([0, 1, 2, -(1 << 31), 1 << 30, 3, (1 << 30) | 1, -(1 << 31) | 2, 4], dtype=torch.int32)
    assert categories(packed, forget, retain).tolist() == [0, 2, 1, 2, 1, 2, 2, 2, 0]
    out = np.zeros(0, dtype=np.uint8)
    categorize(np.zeros(0, dtype=np.int32), np.int32(forget), np.int32(retain), out)  # empty is fine


# --------------------------------------------------------------------------------------------------
# pair_pass and diff_square_sums


def _reference_pair_statistics(before, after, cats):
    d = (after - before).astype(np.float64)  # the difference rounded to float32 first
    sq = d * d  # exact in float64 (two 24-bit significands)
    return np.array(
        [
            math.fsum(np.abs(d)),
            math.fsum(sq),
            math.fsum(sq[cats == 0]),
            math.fsum(sq[cats == 1]),
            math.fsum(sq[cats == 2]),
            float((cats == 0).sum()),
            float((cats == 1).sum()),
            float((cats == 2).sum()),
        ]
    )


def _pairs(rng, n):
    before = (rng.normal(size=n) * 10.0 ** rng.integers(-6, 4, n)).astype(np.float32)
    after = (before + rng.normal(size=n) * 10.0 ** rng.integers(-8, 2, n)).astype(np.float32)
    after[rng.random(n) < 0.05] = 0.0
    tie = rng.random(n) < 0.2
    after[tie] = before[tie]  # unchanged scalars: δ = 0
    after[: min(n, 3)] = -0.0
    return before, after


def _pair_pass(before, after, packed, forget_bits=0b010101, retain_bits=0b101010, sums=None):
    n = before.size
    delta, before_abs = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
    cats = np.full(n, 9, np.uint8)
    sums = np.zeros(10) if sums is None else sums
    pair_pass(before, after, packed, np.int32(forget_bits), np.int32(retain_bits), delta, before_abs, cats, sums)
    return delta, before_abs, cats, sums


@pytest.mark.parametrize("n", [0, 1, 5, 1000, 20_000])
@pytest.mark.parametrize("mask_dtype", [np.uint8, np.int32])
def test_pair_pass_matches_numpy_and_accumulates(n, mask_dtype):
    rng = np.random.default_rng(n)
    before, after = _pairs(rng, n)
    packed = rng.integers(0, 64, n).astype(mask_dtype)
    cats_ref = _reference_categories(packed, 0b010101, 0b101010)
    expected = _reference_pair_statistics(before, after, cats_ref)
    start = np.array([1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 0.0, 0.0])
    delta, before_abs, cats, out = _pair_pass(before, after, packed, sums=start.copy())
    np.testing.assert_array_equal(cats, cats_ref)
    np.testing.assert_array_equal(delta, np.abs(after - before))
    np.testing.assert_array_equal(before_abs, np.abs(before))
    np.testing.assert_allclose(out[:8], start[:8] + expected, rtol=1e-12, atol=0)
    assert out[8] == out[9] == 0
    _pair_pass(before, after, packed, sums=out)  # a second block adds again
    np.testing.assert_allclose(out[:8], start[:8] + 2 * expected, rtol=1e-12, atol=0)
    assert out[5] + out[6] + out[7] == start[5:8].sum() + 2 * n


def test_pair_pass_difference_is_rounded_to_float32():
    before = np.array([2.0**24, 0.0, 1.0], dtype=np.float32)
    after = np.array([-1.0, 0.0, 1.0 + 2.0**-23], dtype=np.float32)
    packed = np.array([1, 2, 0], dtype=np.uint8)  # forget, retain, outside
    delta, _, cats, out = _pair_pass(before, after, packed)
    # −1 − 2**24 = −16777217 is not a float32: it rounds to −2**24
    assert delta.tolist() == [2.0**24, 0.0, 2.0**-23] and cats.tolist() == [2, 1, 0]
    assert out[0] == 2.0**24 + 2.0**-23
    assert out[1] == 2.0**48 + 2.0**-46
    np.testing.assert_array_equal(out[2:], [2.0**-46, 0.0, 2.0**48, 1.0, 1.0, 1.0, 0.0, 0.0])


def test_pair_pass_counts_nonfinite_per_side():
    before = _bits_as_f32(0x7FC00000, 0x7F800000, 0x3F800000, 0x00000001, 0xFF800000, 0x7F7FFFFF)
    after = _bits_as_f32(0x3F800000, 0x3F800000, 0xFFC00001, 0x3F800000, 0x3F800000, 0xFF7FFFFF)
    *_, out = _pair_pass(before, after, np.zeros(6, np.uint8))
    assert (out[8], out[9]) == (3, 1)  # NaN, +inf, −inf before; a NaN after; denormals and ±max are finite


def _reference_diff_square_sums(before, after):
    b, a = before.astype(np.float64), after.astype(np.float64)
    return math.fsum((a - b) ** 2), math.fsum(b**2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1000, 20_000])
def test_diff_square_sums_matches_numpy(dtype, n):
    rng = np.random.default_rng(n + 1)
    before, after = _pairs(rng, n)
    before, after = before.astype(dtype), after.astype(dtype)
    if dtype is np.float64:
        after = after + rng.normal(size=n) * 1e-12
    d_sq, w_sq = diff_square_sums(before, after)
    ref_d, ref_w = _reference_diff_square_sums(before, after)
    assert d_sq == pytest.approx(ref_d, rel=1e-12, abs=0)
    assert w_sq == pytest.approx(ref_w, rel=1e-12, abs=0)
    if n == 0:
        assert (d_sq, w_sq) == (0.0, 0.0)


def test_diff_square_sums_difference_is_exact_in_float64():
    before = np.array([2.0**24, 3.0], dtype=np.float32)
    after = np.array([-1.0, 3.0], dtype=np.float32)
    d_sq, w_sq = diff_square_sums(before, after)
    assert d_sq == 16777217.0**2  # not (2**24)**2 as a float32 difference would give
    assert w_sq == 2.0**48 + 9.0


# --------------------------------------------------------------------------------------------------
# count_nonfinite


def test_count_nonfinite_hand_cases():
    assert count_nonfinite(np.zeros(0, dtype=np.float32)) == 0
    assert count_nonfinite(_special_scores()[np.isfinite(_special_scores())]) == 0
    finite = np.array([BIG, -BIG, TINY, -TINY, 0.0, -0.0, np.finfo(np.float32).tiny, 1.0], dtype=np.float32)
    assert count_nonfinite(finite) == 0
    assert count_nonfinite(np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)) == 3
    assert count_nonfinite(_bits_as_f32(*NAN_PATTERNS, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001)) == 8


@pytest.mark.parametrize("n", [1, 999, 50_000])
def test_count_nonfinite_matches_numpy(n):
    rng = np.random.default_rng(n)
    values = _scores(rng, n, "wide")
    planted = rng.random(n) < 0.01
    values[planted] = rng.choice(_bits_as_f32(*NAN_PATTERNS, 0x7F800000, 0xFF800000), int(planted.sum()))
    assert count_nonfinite(values) == int((~np.isfinite(values)).sum())


# --------------------------------------------------------------------------------------------------
# occupied_bins, clear_bins, merge_bins (directly)


def _random_histogram(rng, bits, n):
    arrays = _empty_histogram(bits)
    scores = _scores(rng, n, "wide")
    assert _kernel_histogram_add(scores, rng.integers(0, 3, n).astype(np.uint8), bits, arrays) == -1
    return arrays


@pytest.mark.parametrize("bits", [8, 16])
def test_occupied_clear_and_merge_bins_match_numpy(bits):
    rng = np.random.default_rng(bits)
    empty = _empty_histogram(bits)
    assert occupied_bins(empty[0]).tolist() == []
    a, b = _random_histogram(rng, bits, 3000), _random_histogram(rng, bits, 500)
    occupied = occupied_bins(a[0])
    assert occupied.dtype == np.int64
    np.testing.assert_array_equal(occupied, np.flatnonzero(a[0].reshape(-1, 3).sum(axis=1)))
    # merge a into b: counts add, low-bit extremes combine
    expected = (a[0] + b[0], a[1] + b[1], np.minimum(a[2], b[2]), np.maximum(a[3], b[3]))
    merged = tuple(x.copy() for x in b)
    merge_bins(occupied, *a, *merged)
    _assert_same_arrays(merged, expected)
    # clearing the occupied bins gives back an empty histogram
    clear_bins(occupied_bins(merged[0]), *merged, 1 << (32 - bits))
    _assert_same_arrays(merged, empty)


# --------------------------------------------------------------------------------------------------
# through StreamingAUC: merge_into, reset, add_ranked


def _chunks(rng, n, kind="mixed"):
    """Scores (ties, continuous values and special values) and categories of ``n`` scalars."""
    if kind == "mixed":
        scores = np.concatenate(
            [
                _scores(rng, n - n // 2 - n // 4, "ties"),
                _scores(rng, n // 2, "continuous"),
                _scores(rng, n // 4, "special"),
            ]
        )
    else:
        scores = _scores(rng, n, kind)
    cats = rng.integers(0, 3, n).astype(np.uint8)
    scores = (scores + 0.4 * (cats == 2)).astype(np.float32)
    perm = rng.permutation(n)
    return scores[perm], cats[perm]


def _feed(acc, scores, cats, rng, max_chunk=700):
    i = 0
    while i < scores.size:
        size = int(rng.integers(0, max_chunk))
        acc.add(torch.from_numpy(scores[i : i + size].copy()), torch.from_numpy(cats[i : i + size].copy()))
        i += size
    return acc


def _sk_scores(scores):
    """Scores for sklearn, which rejects ±inf: their order-preserving keys (same ranks, ties and all)."""
    return _keys(scores).astype(np.float64)


def _snapshot(acc):
    """Everything an accumulator reports, per target."""
    out = {}
    for target in TARGETS:
        r = acc.result(target)
        out[target] = (
            (r.value, r.error_bound, r.n_pos, r.n_neg),
            acc.precision_at(target, FRACTIONS),
            acc.roc_curve(target),
            acc.roc_curve(target, max_points=16),
        )
    return out


def _histogram_state(acc):
    """White-box: the histogram arrays of a spilled accumulator, side table folded in (None while exact)."""
    if acc._counts is None:
        return None
    return tuple(a.copy() for a in acc._arrays())


MERGE_CASES = [
    # (bits, exact_limit, size of A, size of B): which accumulators have spilled differs per case
    (8, 0, 2000, 1500),  # both histograms
    (20, 0, 2000, 1500),
    (12, 300, 2000, 1500),  # both spilled past a small limit
    (12, 1 << 22, 2000, 1500),  # both exact
    (12, 5000, 2000, 1500),  # both exact and exact together
    (12, 3000, 2000, 1500),  # both exact, together past the limit: Y spills while merging
    (8, 1000, 2000, 500),  # X spilled, Y still buffering
    (20, 1000, 2000, 500),
    (12, 1000, 500, 2000),  # X buffering, Y spilled
    (12, 1000, 0, 2000),  # X empty
    (12, 1000, 2000, 0),  # Y empty
]


@pytest.mark.parametrize("bits, exact_limit, n_a, n_b", MERGE_CASES)
def test_merge_into_equals_one_accumulator(bits, exact_limit, n_a, n_b):
    rng = np.random.default_rng([bits, n_a, n_b, exact_limit % 997])
    a_scores, a_cats = _chunks(rng, n_a)
    b_scores, b_cats = _chunks(rng, n_b)
    x = _feed(StreamingAUC(bits, exact_limit), a_scores, a_cats, rng)
    y = _feed(StreamingAUC(bits, exact_limit), b_scores, b_cats, rng)
    one = _feed(StreamingAUC(bits, exact_limit), a_scores, a_cats, rng)
    _feed(one, b_scores, b_cats, rng)
    x_before = _snapshot(x)
    y.result("forget")  # a cached result must not survive the merge
    x.merge_into(y)
    assert y.count == one.count == n_a + n_b
    assert _snapshot(y) == _snapshot(one)
    assert _snapshot(x) == x_before  # the merged-from accumulator is unchanged
    state, ref = _histogram_state(y), _histogram_state(one)
    assert (state is None) == (ref is None)
    if state is not None:
        _assert_same_arrays(state, ref)
    if n_a + n_b > exact_limit:
        assert state is not None
    if n_a and n_b and exact_limit > n_a + n_b:  # exact: the sklearn value
        scores, cats = np.concatenate([a_scores, b_scores]), np.concatenate([a_cats, b_cats])
        res = y.result("forget")
        assert res.exact
        assert abs(res.value - roc_auc_score(cats == 2, _sk_scores(scores))) <= 1e-12


@pytest.mark.parametrize("mode", ["both spilled", "X spilled"])
def test_merge_combines_low_bit_extremes(mode):
    """Each accumulator alone sees one value per bin (exact); merged, one bin holds two values."""
    bits = 12
    a = np.full(50, 1.0 + 2.0**-23, dtype=np.float32)  # low bits 1 of the bin of 1.0
    b = np.full(60, 1.0 + 2.0**-22, dtype=np.float32)  # low bits 2, same bin
    a_cats, b_cats = np.full(50, 2, dtype=np.uint8), np.zeros(60, dtype=np.uint8)
    limit = 0 if mode == "both spilled" else 55
    x, y, one = StreamingAUC(bits, limit), StreamingAUC(bits, limit), StreamingAUC(bits, limit)
    x.add(torch.from_numpy(a), torch.from_numpy(a_cats))
    x.add(torch.from_numpy(a[:10]), torch.from_numpy(a_cats[:10]))
    y.add(torch.from_numpy(b), torch.from_numpy(b_cats))
    for s, c in ((a, a_cats), (a[:10], a_cats[:10]), (b, b_cats)):
        one.add(torch.from_numpy(s), torch.from_numpy(c))
    assert x.result("unified").value is None and y.result("forget").value is None
    x.merge_into(y)
    res = y.result("forget")
    assert res.value == 0.5 and res.error_bound == 0.5  # a tie in the histogram; the truth is 1.0
    assert _snapshot(y) == _snapshot(one)


def test_merge_into_rejects_other_settings():
    x = StreamingAUC(bits=12, exact_limit=0)
    x.add(torch.randn(10), torch.zeros(10, dtype=torch.uint8))
    with pytest.raises(ValueError, match="bits"):
        x.merge_into(StreamingAUC(bits=16, exact_limit=0))
    with pytest.raises(ValueError):
        x.merge_into(StreamingAUC(bits=12, exact_limit=100))
    with pytest.raises(ValueError, match="bits"):
        StreamingAUC(bits=12).merge_into(StreamingAUC(bits=20))  # even when exact and empty


RESET_CASES = [
    # (bits, exact_limit, size before the reset, size after)
    (8, 0, 2000, 1500),
    (20, 0, 3000, 800),
    (12, 1000, 3000, 2500),  # spilled, reset, spilled again (reuses the cleared arrays)
    (12, 1000, 3000, 600),  # spilled, reset, back to exact
    (20, 1000, 3000, 600),
    (12, 1000, 600, 3000),  # exact, reset, spilled
    (12, 1000, 600, 400),  # exact throughout
    (12, 1000, 0, 400),  # reset of a fresh accumulator
]


@pytest.mark.parametrize("bits, exact_limit, n_d, n_c", RESET_CASES)
def test_reset_equals_fresh_accumulator(bits, exact_limit, n_d, n_c):
    rng = np.random.default_rng([bits, n_d, n_c, exact_limit])
    d_scores, d_cats = _chunks(rng, n_d, "wide")
    c_scores, c_cats = _chunks(rng, n_c)
    acc = _feed(StreamingAUC(bits, exact_limit), d_scores, d_cats, rng)
    acc.result("forget")
    acc.reset()
    assert acc.count == 0
    for target in TARGETS:
        assert acc.result(target).value is None
    _feed(acc, c_scores, c_cats, rng)
    fresh = _feed(StreamingAUC(bits, exact_limit), c_scores, c_cats, rng)
    assert acc.count == fresh.count == n_c
    assert _snapshot(acc) == _snapshot(fresh)
    state, ref = _histogram_state(acc), _histogram_state(fresh)
    assert (state is None) == (ref is None) == (n_c <= exact_limit)
    if state is not None:  # every bin the first stream touched is clean again
        _assert_same_arrays(state, ref)
    if n_c <= exact_limit:
        res = acc.result("forget")
        assert res.error_bound == 0.0
        assert abs(res.value - roc_auc_score(c_cats == 2, _sk_scores(c_scores))) <= 1e-12
    # and once more: reset twice in a row, then the first stream again
    acc.reset()
    acc.reset()
    _feed(acc, d_scores, d_cats, rng)
    assert _snapshot(acc) == _snapshot(_feed(StreamingAUC(bits, exact_limit), d_scores, d_cats, rng))


def _ranked_chunks(n, sizes):
    """Split ``[0, n)`` into consecutive chunks of the given sizes (the last one takes the rest)."""
    bounds, start = [], 0
    for size in sizes:
        stop = min(n, start + size)
        bounds.append((start, stop))
        start = stop
    bounds.append((start, n))
    return bounds


ADD_RANKED_CASES = [
    # (bits, exact_limit, n, chunk sizes)
    (12, 1 << 22, 10_000, (3000, 0, 1, 4999)),  # exact throughout
    (8, 0, 10_000, (3000, 0, 1, 4999)),  # histogram from the first chunk on
    (20, 0, 10_000, (5000, 4097, 1)),  # chunks longer than the kernel's 4096-scalar buffer
    (16, 4000, 10_000, (3000, 3000, 1000)),  # spills part way
    (20, 0, 1, ()),  # n = 1: qtile 0
    (20, 0, 2, (1,)),
    (12, 0, 3, (0, 3)),
]


@pytest.mark.parametrize("bits, exact_limit, n, sizes", ADD_RANKED_CASES)
def test_add_ranked_equals_add_of_qtile_values(bits, exact_limit, n, sizes):
    rng = np.random.default_rng([bits, n, exact_limit % 997])
    cats = torch.from_numpy(rng.integers(0, 3, n).astype(np.uint8))
    cats[: n // 3] = torch.from_numpy(np.sort(cats[: n // 3].numpy()))  # runs of equal categories too
    ranked, added = StreamingAUC(bits, exact_limit), StreamingAUC(bits, exact_limit)
    for start, stop in _ranked_chunks(n, sizes):
        ranked.add_ranked(start, cats[start:stop], n)
        added.add(qtile_values(start, stop, n), cats[start:stop])
        assert ranked.count == added.count == stop
    assert _snapshot(ranked) == _snapshot(added)
    state, ref = _histogram_state(ranked), _histogram_state(added)
    assert (state is None) == (ref is None) == (n <= exact_limit)
    if state is not None:
        _assert_same_arrays(state, ref)
    # reference AUC: rank order is score order, so the value is the AUC of the ranks themselves
    if exact_limit >= n and 0 < int((cats == 2).sum()) < n:
        ranks = np.arange(n, dtype=np.float64)
        assert abs(ranked.result("forget").value - roc_auc_score(cats.numpy() == 2, ranks)) <= 1e-12


# --------------------------------------------------------------------------------------------------
# qtile_histogram_add directly, against the per-rank definition


def _qtile_histogram_add_reference(start, sorted_cats, n, shift, half, counts, off_edge, low_min, low_max):
    """numpy definition (the kernel's former per-rank loop): key of ``float32(float64(r) / max(1, n − 1))``."""
    ranks = np.arange(start, start + sorted_cats.size, dtype=np.int64)
    keys = (ranks.astype(np.float64) / np.float64(max(1, n - 1))).astype(np.float32).view(np.int32).astype(np.int64)
    b = (keys >> shift) + half
    idx = 3 * b + sorted_cats.astype(np.int64)
    low = keys & ((1 << shift) - 1)
    off = low != 0
    counts += np.bincount(idx, minlength=counts.size)
    off_edge += np.bincount(idx[off], minlength=counts.size)
    np.minimum.at(low_min, b[off], low[off])
    np.maximum.at(low_max, b[off], low[off])


def _qtile_windows(n, width):
    """Rank ranges of a tensor of ``n`` scalars: all of it, or windows near qtile 0, 0.5 and 1."""
    if n <= 3 * width:
        return [(0, n)]
    mid = (n - 1) // 2 - width // 2
    return [(0, width), (mid, mid + width), (n - width, n)]


def _qtile_keys(lo, hi, n):
    return (np.arange(lo, hi, dtype=np.float64) / np.float64(max(1, n - 1))).astype(np.float32).view(np.int32)


def _qtile_arrays(rng, lo, hi, n, shift, filled, max_bins=1 << 18):
    """A window of ranks ``[lo', hi)`` (``lo' >= lo``, > 0: not qtile 0) whose bins span at most ``max_bins``,
    and histogram arrays just covering them (the ``half`` that puts them at 2, a margin either side), empty or
    filled with arbitrary earlier contents."""
    lo = max(lo, 1)
    bins = _qtile_keys(lo, hi, n).astype(np.int64) >> shift
    lo += int(np.searchsorted(bins, bins[-1] - max_bins)) if bins.size else 0
    first, last = (int(bins[lo - hi]), int(bins[-1])) if lo < hi else (0, 0)
    half, size = 2 - first, last - first + 5
    if filled:
        arrays = (
            rng.integers(0, 1000, 3 * size),
            rng.integers(0, 1000, 3 * size),
            rng.integers(0, (1 << shift) + 1, size),
            rng.integers(-1, 1 << shift, size),
        )
    else:
        arrays = (np.zeros(3 * size), np.zeros(3 * size), np.full(size, 1 << shift), np.full(size, -1))
    return lo, half, tuple(np.asarray(a, dtype=np.int64) for a in arrays)


def _qtile_cats(rng, size):
    """Categories: ~70% 0, 15% 1, 15% 2, with a stretch of sorted (long equal) runs."""
    cats = rng.choice(np.array([0, 1, 2], dtype=np.uint8), size, p=[0.7, 0.15, 0.15])
    cats[: size // 4] = np.sort(cats[: size // 4])
    return cats


QTILE_NS = [1, 2, 3, 17, 1000, 2**12 + 1, 100_003, 2**20, 11_534_336, 2**25 + 3, 2**30, 10**9 + 7]
QTILE_BITS = [8, 12, 16, 20, 26]


@pytest.mark.parametrize("bits", QTILE_BITS)
@pytest.mark.parametrize("n", QTILE_NS)
@pytest.mark.parametrize("filled", [False, True])
def test_qtile_histogram_add_matches_reference(n, bits, filled):
    """Whole windows and the same windows in chunks split at random places (empty chunks too), into empty or
    filled arrays: the same arrays as the per-rank definition."""
    shift = 32 - bits
    rng = np.random.default_rng([n % 2**32, bits, filled])
    for lo, hi in _qtile_windows(n, 3 * 2**16):
        lo, half, arrays = _qtile_arrays(rng, lo, hi, n, shift, filled)
        cats = _qtile_cats(rng, hi - lo)
        expected = tuple(a.copy() for a in arrays)
        _qtile_histogram_add_reference(lo, cats, n, shift, half, *expected)
        whole = tuple(a.copy() for a in arrays)
        qtile_histogram_add(lo, cats, n, shift, half, *whole)
        _assert_same_arrays(whole, expected)
        cuts = np.sort(rng.integers(0, hi - lo + 1, 6))
        cuts = np.concatenate([[0], cuts, cuts[:1], [hi - lo]])  # a repeated cut: an empty chunk
        split = tuple(a.copy() for a in arrays)
        for a, b in zip(np.sort(cuts)[:-1], np.sort(cuts)[1:], strict=True):
            qtile_histogram_add(lo + int(a), cats[a:b], n, shift, half, *split)
        _assert_same_arrays(split, expected)


@pytest.mark.parametrize("bits", QTILE_BITS)
def test_qtile_histogram_add_single_ranks_and_edges(bits):
    """Chunks of one rank, and chunks starting and ending on the ranks around every bin edge of a window where
    several ranks share one float32 (n > 2**24 near 1) or each rank has its own bin (near 0)."""
    shift = 32 - bits
    rng = np.random.default_rng(bits)
    for n, lo, hi in [(2**30 + 5, 2**30 - 5000, 2**30 + 5), (2**25 + 3, 2**24 - 3000, 2**24 + 3000), (2**30, 0, 3000)]:
        lo, half, arrays = _qtile_arrays(rng, lo, hi, n, shift, True)
        cats = _qtile_cats(rng, hi - lo)
        expected = tuple(a.copy() for a in arrays)
        _qtile_histogram_add_reference(lo, cats, n, shift, half, *expected)
        keys = _qtile_keys(lo, hi, n)
        on_edge = np.flatnonzero((keys & ((1 << shift) - 1)) == 0)
        changes = np.flatnonzero(np.diff(keys >> shift)) + 1  # first index of each new bin
        cuts = np.unique(np.concatenate([on_edge, on_edge + 1, changes - 1, changes, changes + 1, [0, hi - lo]]))
        cuts = cuts[(cuts >= 0) & (cuts <= hi - lo)]
        got = tuple(a.copy() for a in arrays)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            qtile_histogram_add(lo + int(a), cats[a:b], n, shift, half, *got)
        _assert_same_arrays(got, expected)
        got = tuple(a.copy() for a in arrays)
        for i in range(0, min(hi - lo, 400)):
            qtile_histogram_add(lo + i, cats[i : i + 1], n, shift, half, *got)
        qtile_histogram_add(lo + 400, cats[400:], n, shift, half, *got)
        _assert_same_arrays(got, expected)


def test_qtile_histogram_add_empty_input_changes_nothing():
    rng = np.random.default_rng(0)
    _, half, arrays = _qtile_arrays(rng, 0, 10, 10, 12, True)
    got = tuple(a.copy() for a in arrays)
    for start in (0, 5, 10**9):
        qtile_histogram_add(start, np.zeros(0, dtype=np.uint8), 10, 12, half, *got)
    _assert_same_arrays(got, arrays)


@pytest.mark.parametrize("bits", [8, 12, 20])
@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 2**12 + 1, 2**20, 2**30])
def test_qtile_histogram_add_from_rank_0(n, bits):
    """From rank 0 (qtile 0, key 0) on, into the full histogram (empty, then filled by a first pass), in chunks."""
    shift, half = 32 - bits, 1 << (bits - 1)
    rng = np.random.default_rng([n % 2**32, bits])
    m = min(n, 3 * 2**16)
    cats = _qtile_cats(rng, m)
    expected, got = _empty_histogram(bits), _empty_histogram(bits)
    for _ in range(2):
        _qtile_histogram_add_reference(0, cats, n, shift, half, *expected)
        cuts = np.sort(np.concatenate([[0, 0, 1, m], rng.integers(0, m + 1, 5)]))
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            qtile_histogram_add(int(a), cats[a:b], n, shift, half, *got)
        _assert_same_arrays(got, expected)


def test_qtile_histogram_add_random_windows():
    """Random tensor sizes (up to 2**34), windows and bits, in a few chunks, into filled arrays."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(2 ** rng.uniform(0, 34)) + 1
        bits = int(rng.integers(8, 27))
        shift = 32 - bits
        size = int(rng.integers(1, 20_000))
        lo = int(rng.integers(0, max(1, n - size + 1)))
        hi = min(n, lo + size)
        lo, half, arrays = _qtile_arrays(rng, lo, hi, n, shift, True)
        cats = _qtile_cats(rng, hi - lo)
        expected = tuple(a.copy() for a in arrays)
        _qtile_histogram_add_reference(lo, cats, n, shift, half, *expected)
        cuts = np.sort(np.concatenate([[0, hi - lo], rng.integers(0, hi - lo + 1, 3)]))
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            qtile_histogram_add(lo + int(a), cats[a:b], n, shift, half, *arrays)
        _assert_same_arrays(arrays, expected)


# --------------------------------------------------------------------------------------------------
# average ranks: stable_sorted_ties, qtile_ties_values, qtile_ties_histogram_add, add_ranked_ties


def _average_qtile(scores):
    """Reference qtile with average ranks, per scalar in index order: scipy's mid-ranks (1-based) − 1 over n − 1,
    on the order-preserving keys (−0.0 and +0.0 one value; ±inf ranked like any value)."""
    n = scores.size
    ranks = rankdata(_keys(scores), method="average") - 1.0
    return (ranks / max(1, n - 1)).astype(np.float32)


def _run_scores(rng, n, kind):
    """Scores whose sorted order has runs of chosen lengths around the kernels' thresholds (64, 1024)."""
    if kind == "all equal":
        return np.full(n, 0.25, dtype=np.float32)
    if kind == "all distinct":
        return rng.permutation(np.arange(n, dtype=np.float32) + 1)
    if kind == "signed zeros":
        out = rng.choice(np.float32([-0.0, 0.0]), n)
        some = rng.random(n) < 0.1
        out[some] = rng.choice(np.float32([-1.0, 1.0, 0.5]), int(some.sum()))
        return out
    if kind == "bf16":  # |after − before| of a bf16 pair: few distinct values, a big run at 0
        before = _bf16(rng.normal(size=n) * 0.02)
        return np.abs(_bf16(before + rng.normal(size=n) * 5e-4 * (rng.random(n) < 0.6)) - before)
    if kind == "run lengths":  # runs of 1, 2, 63, 64, 65, 1023, 1024, 1025 ... in random order, distinct stretches
        lengths = rng.choice([1, 1, 1, 2, 3, 63, 64, 65, 200, 1023, 1024, 1025, 3000], 4 * n)
        lengths[rng.random(lengths.size) < 0.3] = 1
        values = np.repeat(np.arange(lengths.size, dtype=np.float32), lengths)[:n]
        return rng.permutation(values)
    raise AssertionError(kind)


TIE_KINDS = ["all equal", "all distinct", "signed zeros", "bf16", "run lengths"]


def _assert_ties(scores, payload, out, ties):
    keys = _keys(scores)
    order = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(out, payload[order])
    expected = np.zeros(scores.size, dtype=np.uint8)
    expected[1:] = keys[order][1:] == keys[order][:-1]
    assert ties.dtype == np.uint8
    np.testing.assert_array_equal(ties, expected)


@pytest.mark.parametrize("kind", ["special", "ties", "wide", "continuous", "bf16"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 100, 70_000])
def test_stable_sorted_ties_is_the_stable_order_and_its_tie_flags(kind, n):
    rng = np.random.default_rng([n, len(kind), 13])
    scores = _scores(rng, n, kind)
    before = scores.copy()
    out, ties = stable_sorted_ties(scores, np.arange(n, dtype=np.uint32))
    _assert_ties(scores, np.arange(n, dtype=np.uint32), out, ties)
    cats = rng.integers(0, 3, n).astype(np.uint8)
    ranked, ties2 = rank_categories_ties(scores, cats)
    _assert_ties(scores, cats, ranked, ties2)
    np.testing.assert_array_equal(ranked, rank_categories(scores, cats))  # the same order as the ordinal ranks
    np.testing.assert_array_equal(scores.view(np.uint32), before.view(np.uint32))


@pytest.mark.parametrize("kind", ["bf16", "bf16 few", "delta", "big buckets", "ties"])
@pytest.mark.parametrize("n", [1, 17, 1000, 70_000])
def test_stable_sorted_ties_on_both_radix_paths(kind, n):
    """Keys with and without low bits in one bucket: runs of the bucket's bf16 key, and equal low halves."""
    rng = np.random.default_rng([n, len(kind), 17])
    scores = _sort_scores(rng, n, kind)
    payload = rng.integers(-(2**62), 2**62, n)
    _assert_ties(scores, payload, *stable_sorted_ties(scores, payload))


def test_stable_sorted_ties_one_huge_bucket():
    rng = np.random.default_rng(5)
    k = rng.integers(0, 1 << 16, 300_000)
    k[rng.random(k.size) < 0.3] = 0
    k[rng.random(k.size) < 0.1] = 12345
    scores = (0x3F800000 + k).astype(np.uint32).view(np.float32)
    _assert_ties(scores, np.arange(k.size), *stable_sorted_ties(scores, np.arange(k.size)))


@pytest.mark.parametrize("kind", TIE_KINDS + ["special", "ties", "wide"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 1000, 20_000])
def test_qtile_ties_values_are_scipy_average_ranks(kind, n):
    """Every scalar's qtile = (its average 0-based rank) / (n − 1), bit for bit, whole and in split chunks."""
    rng = np.random.default_rng([n, len(kind), 3])
    scores = _run_scores(rng, n, kind) if kind in TIE_KINDS else _scores(rng, n, kind)
    order, ties = stable_sorted_ties(scores, np.arange(n, dtype=np.uint32))
    values = qtile_ties_values(ties, 0, n)
    assert values.dtype == np.float32 and values.shape == (n,)
    got = np.empty(n, dtype=np.float32)
    got[order] = values
    expected = _average_qtile(scores)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    np.testing.assert_array_equal(within_tensor_qtile(torch.from_numpy(scores)).numpy(), expected)
    if n:
        if kind == "all equal":
            assert (expected == np.float32(0.5 if n > 1 else 0.0)).all()  # one run: the middle rank
        if kind == "all distinct":  # no ties: the ordinal qtile
            np.testing.assert_array_equal(values, qtile_values(0, n, n).numpy())
    cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, 6)]))
    parts = [qtile_ties_values(ties, int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    np.testing.assert_array_equal(np.concatenate(parts) if parts else values[:0], values)
    assert qtile_ties_values(ties, n, n).size == 0


def test_within_tensor_qtile_ordinal_and_shapes():
    rng = np.random.default_rng(4)
    values = _scores(rng, 37 * 29, "ties").reshape(37, 29)
    t = torch.from_numpy(values.copy())
    ordinal = within_tensor_qtile(t, "ordinal").numpy()
    expected = np.empty(values.size, dtype=np.float32)
    expected[_reference_order(values.reshape(-1))] = qtile_values(0, values.size, values.size).numpy()
    np.testing.assert_array_equal(ordinal, expected)
    average = within_tensor_qtile(t.t()).numpy()  # a non-contiguous view: flattened in row-major order first
    np.testing.assert_array_equal(average, _average_qtile(np.ascontiguousarray(values.T).reshape(-1)))
    with pytest.raises(ValueError, match="ties"):
        within_tensor_qtile(t, "dense")


def _reference_ties_histogram(scores, cats, bits, arrays):
    """What ``qtile_ties_histogram_add`` must do: ``histogram_add`` of the reference values, rank by rank."""
    order = np.argsort(_keys(scores), kind="stable")
    _reference_histogram_add(_average_qtile(scores)[order], cats[order], bits, *arrays)


@pytest.mark.parametrize("bits", [8, 12, 20])
@pytest.mark.parametrize("kind", TIE_KINDS + ["continuous", "ties"])
@pytest.mark.parametrize("n", [1, 2, 3, 70, 3000, 50_000])
def test_qtile_ties_histogram_add_matches_histogram_of_the_values(bits, kind, n):
    """Whole, and in chunks split at random places and inside runs (empty chunks too), into empty or filled
    arrays: the same arrays as the numpy histogram of the scipy average-rank qtiles."""
    rng = np.random.default_rng([n, bits, len(kind)])
    scores = _run_scores(rng, n, kind) if kind in TIE_KINDS else _scores(rng, n, kind)
    cats = rng.integers(0, 3, n).astype(np.uint8)
    ranked, ties = rank_categories_ties(scores, cats)
    shift, half = 32 - bits, 1 << (bits - 1)
    for filled in (False, True):
        arrays = _empty_histogram(bits)
        if filled:
            _reference_histogram_add(_scores(rng, 500, "continuous") ** 2, rng.integers(0, 3, 500), bits, *arrays)
        expected = tuple(a.copy() for a in arrays)
        _reference_ties_histogram(scores, cats, bits, expected)
        whole = tuple(a.copy() for a in arrays)
        qtile_ties_histogram_add(0, n, ranked, ties, shift, half, *whole)
        _assert_same_arrays(whole, expected)
        run_starts = np.flatnonzero(ties == 0)
        inside = np.flatnonzero(ties)[:3]  # cuts inside runs, next to their starts
        cuts = np.concatenate([[0, 0, n], rng.integers(0, n + 1, 5), inside, run_starts[-2:], run_starts[-2:] + 1])
        cuts = np.unique(np.clip(cuts, 0, n))
        split = tuple(a.copy() for a in arrays)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            qtile_ties_histogram_add(int(a), int(b), ranked, ties, shift, half, *split)
        qtile_ties_histogram_add(n, n, ranked, ties, shift, half, *split)  # empty: nothing
        _assert_same_arrays(split, expected)


@pytest.mark.parametrize(
    "bits, exact_limit, n", [(12, 1 << 22, 20_000), (8, 0, 20_000), (16, 9000, 20_000), (20, 0, 1)]
)
@pytest.mark.parametrize("kind", ["bf16", "run lengths", "all equal", "signed zeros"])
def test_add_ranked_ties_auc_is_the_auc_of_the_scores(bits, exact_limit, n, kind):
    """Average ranks keep ties tied and the order otherwise, so the AUC of the qtile is exactly the AUC of the
    scores themselves (ties count one half); exact mode, histogram mode and a spill part way agree with
    ``add`` of the reference values."""
    rng = np.random.default_rng([n, bits, len(kind)])
    scores = _run_scores(rng, n, kind)
    cats = rng.integers(0, 3, n).astype(np.uint8)
    cats[(scores > np.median(scores)) & (rng.random(n) < 0.3)] = 2  # forget skewed towards high scores
    ranked, ties = rank_categories_ties(scores, cats)
    acc, ref = StreamingAUC(bits, exact_limit), StreamingAUC(bits, exact_limit)
    half_way = n // 2
    acc.add(torch.zeros(half_way), torch.zeros(half_way, dtype=torch.uint8))  # something before the tensor
    ref.add(torch.zeros(half_way), torch.zeros(half_way, dtype=torch.uint8))
    acc.add_ranked_ties(torch.from_numpy(ranked), ties)
    order = np.argsort(_keys(scores), kind="stable")
    ref.add(torch.from_numpy(_average_qtile(scores)[order]), torch.from_numpy(cats[order]))
    assert acc.count == ref.count == n + half_way
    assert _snapshot(acc) == _snapshot(ref)
    state, expected = _histogram_state(acc), _histogram_state(ref)
    assert (state is None) == (expected is None)
    if state is not None:
        _assert_same_arrays(state, expected)
    alone = StreamingAUC(bits, exact_limit)
    alone.add_ranked_ties(ranked, ties)
    y = cats == 2
    if 0 < y.sum() < n and alone.result("forget").exact:
        assert alone.result("forget").value == pytest.approx(roc_auc_score(y, _sk_scores(scores)), abs=1e-12)


def test_add_ranked_ties_rejects_bad_input():
    acc = StreamingAUC(12, 0)
    cats, ties = np.array([0, 1, 3], dtype=np.uint8), np.zeros(3, dtype=np.uint8)
    with pytest.raises(ValueError, match="category"):
        acc.add_ranked_ties(cats, ties)
    with pytest.raises(ValueError, match="one size"):
        acc.add_ranked_ties(cats[:2], ties)
    with pytest.raises(ValueError, match="outside"):
        acc.add_ranked_ties(cats[:2], ties[:2], 1, 3)
    assert acc.count == 0
