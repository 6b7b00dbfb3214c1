"""Compiled (numba) inner loops of the scorer: one pass per block instead of one torch pass per operation.

Why: the localization walk touches every scalar of the universe several times (categories, group
statistics, one histogram update per score, a within-tensor sort for ``qtile``). Written as torch/numpy
array operations each step is a separate pass over memory with int64 temporaries; fused here they cost a
few nanoseconds per scalar. Every kernel has a plain-numpy definition it must match (``tests/metrics/test_kernels.py``),
and releases the GIL so block reading (another thread) overlaps with it.

Keys: a float32 score maps to the int32 ``key`` that orders like the float (−0 and +0 equal), exactly as
:func:`lacuna_metrics.localization.auc.signed_keys`; histogram bin = ``(key >> shift) + 2**(bits − 1)``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: Let LLVM reorder float sums (vectorised reductions) without assuming finite inputs (``fastmath=True`` would).
_REORDER = {"reassoc", "nsz", "contract"}

__all__ = [
    "categorize",
    "clear_bins",
    "count_nonfinite",
    "TABLE_KEYS",
    "diff_square_sums",
    "fold_table",
    "bf16_value_counts",
    "histogram_add",
    "histogram_add_counts",
    "merge_bins",
    "occupied_bins",
    "pair_pass",
    "qtile_histogram_add",
    "qtile_ties_histogram_add",
    "qtile_ties_values",
    "rank_categories",
    "rank_categories_ties",
    "stable_order",
    "stable_sorted",
    "stable_sorted_ties",
]


@njit(nogil=True, cache=True)
def histogram_add(scores, cats, shift, half, counts, off_edge, low_min, low_max, table):  # pragma: no cover
    """Add float32 ``scores`` with uint8 ``cats`` to the histogram.

    Returns −1, or the index ``i`` of the first NaN, or ``−2 − i`` for the first category code above 2.

    ``counts[bin * 3 + cat]`` counts scalars; for keys off their bin's lower edge (nonzero low-order
    bits) ``off_edge`` counts them and ``low_min``/``low_max`` keep their smallest/largest low bits per bin.
    A block with a NaN is not added at all.

    Non-negative scores whose low 16 bits are zero (every ``|θ|`` of a bf16 checkpoint, most ``|δ|`` of a bf16
    pair) are counted in ``table[(key >> 16) * 3 + cat]`` instead (``int64[TABLE_KEYS * 3]``): one exact key per
    entry, small enough to stay in cache, so about twice as fast. :func:`fold_table` moves it into the histogram.
    """
    bits = scores.view(np.int32)
    low_mask = np.int32((1 << shift) - 1)
    rejected = _first_bad(bits, cats)
    if rejected != -1:
        return rejected
    for i in range(bits.size):
        k = bits[i]
        if k >= 0 and (k & 0xFFFF) == 0:
            table[(k >> 16) * 3 + cats[i]] += 1
            continue
        if k == -2147483648:  # -0.0 counts as +0.0
            k = 0
        k = k ^ ((k >> 31) & 0x7FFFFFFF)
        b = (k >> shift) + half
        idx = b * 3 + cats[i]
        counts[idx] += 1
        low = k & low_mask
        if low != 0:
            off_edge[idx] += 1
            if low < low_min[b]:
                low_min[b] = low
            if low > low_max[b]:
                low_max[b] = low
    return -1


@njit(nogil=True, cache=True)
def _first_bad(bits, cats):  # pragma: no cover - compiled
    """−1, or the index ``i`` of the first NaN among float32 ``bits``, or ``−2 − i`` for the first category above 2.

    Checked before a histogram update, so that a rejected block leaves no trace; counting loops vectorise (an
    early exit would not, and cost as much as the update itself), the index is searched only when there is
    something to find."""
    nan = 0
    for i in range(bits.size):
        nan += (bits[i] & 0x7FFFFFFF) > 0x7F800000
    if nan:
        for i in range(bits.size):
            if (bits[i] & 0x7FFFFFFF) > 0x7F800000:
                return i
    bad = 0
    for i in range(cats.size):
        bad += cats[i] > 2
    if bad:
        for i in range(cats.size):
            if cats[i] > 2:
                return -2 - i
    return -1


@njit(nogil=True, cache=True)
def histogram_add_counts(scores, cats, weights, shift, half, counts, off_edge, low_min, low_max):  # pragma: no cover
    """:func:`histogram_add` of each score ``weights[i]`` times (``int64``; zero weights add nothing), without
    the side table; same return codes. For the few distinct values of a function of a bf16 pair's ``|δ|``
    (:func:`bf16_value_counts`), so each value is one run of :func:`_flush_run`."""
    bits = scores.view(np.int32)
    low_mask = np.int64((1 << shift) - 1)
    rejected = _first_bad(bits, cats)
    if rejected != -1:
        return rejected
    for i in range(bits.size):
        w = weights[i]
        if w == 0:
            continue
        k = np.int64(bits[i])
        if k == -2147483648:  # -0.0 counts as +0.0
            k = 0
        k = k ^ ((k >> 31) & 0x7FFFFFFF)
        low = k & low_mask
        c = cats[i]
        n0, n1, n2 = w * (c == 0), w * (c == 1), w * (c == 2)
        if low != 0:
            _flush_run((k >> shift) + half, n0, n1, n2, n0, n1, n2, low, low, counts, off_edge, low_min, low_max)
        else:
            _flush_run((k >> shift) + half, n0, n1, n2, 0, 0, 0, 0, -1, counts, off_edge, low_min, low_max)
    return -1


@njit(nogil=True, cache=True)
def bf16_value_counts(scores, cats, table, rest):  # pragma: no cover - compiled
    """Count the non-negative float32 ``scores`` whose low 16 bits are zero into ``table[(key >> 16) * 3 + cat]``
    (``int64[TABLE_KEYS * 3]``, one exact value per entry); write the indices of the others into ``rest`` and
    return how many they are.

    Why: a bf16 pair's ``|δ|`` takes few distinct values (~99% of them are such keys), so a score that is a
    function of δ alone (``layernorm``, ``compnorm``) is histogrammed once per distinct value with its count
    (:func:`histogram_add_counts`) instead of once per scalar."""
    bits = scores.view(np.int32)
    m = 0
    for i in range(bits.size):
        k = bits[i]
        if k >= 0 and (k & 0xFFFF) == 0:
            table[(k >> 16) * 3 + cats[i]] += 1
        else:
            rest[m] = i
            m += 1
    return m


#: Entries of :func:`histogram_add`'s side table: the top 16 bits of a non-negative key.
TABLE_KEYS = 1 << 15


@njit(nogil=True, cache=True)
def fold_table(table, shift, half, counts, off_edge, low_min, low_max):  # pragma: no cover - compiled
    """Move :func:`histogram_add`'s side table into the histogram (each entry is the exact key ``t << 16``) and
    clear it."""
    low_mask = (1 << shift) - 1
    for t in range(table.size // 3):
        if table[3 * t] | table[3 * t + 1] | table[3 * t + 2]:
            k = t << 16
            b = (k >> shift) + half
            low = k & low_mask
            for c in range(3):
                counts[3 * b + c] += table[3 * t + c]
                if low != 0:
                    off_edge[3 * b + c] += table[3 * t + c]
                table[3 * t + c] = 0
            if low != 0:
                low_min[b] = min(low_min[b], low)
                low_max[b] = max(low_max[b], low)


@njit(nogil=True, cache=True)
def occupied_bins(counts):  # pragma: no cover - compiled
    """Ascending indices of the bins of a ``[bins * 3]`` count array holding at least one scalar."""
    n_bins = counts.size // 3
    occupied = 0
    for b in range(n_bins):
        occupied += (counts[3 * b] | counts[3 * b + 1] | counts[3 * b + 2]) != 0
    out = np.empty(occupied, dtype=np.int64)
    j = 0
    for b in range(n_bins):
        if (counts[3 * b] | counts[3 * b + 1] | counts[3 * b + 2]) != 0:
            out[j] = b
            j += 1
    return out


@njit(nogil=True, cache=True)
def merge_bins(
    occupied, counts, off_edge, low_min, low_max, into_counts, into_off_edge, into_low_min, into_low_max
):  # pragma: no cover
    """Add the histogram (counts, off-edge counts, low-bit extremes) of the ``occupied`` bins into another."""
    for b in occupied:
        for c in range(3):
            into_counts[3 * b + c] += counts[3 * b + c]
            into_off_edge[3 * b + c] += off_edge[3 * b + c]
        into_low_min[b] = min(into_low_min[b], low_min[b])
        into_low_max[b] = max(into_low_max[b], low_max[b])


@njit(nogil=True, cache=True)
def clear_bins(occupied, counts, off_edge, low_min, low_max, low_empty):  # pragma: no cover - compiled
    """Reset the ``occupied`` bins to empty (the rest already are): reuse a histogram without reallocating it."""
    for b in occupied:
        for c in range(3):
            counts[3 * b + c] = 0
            off_edge[3 * b + c] = 0
        low_min[b] = low_empty
        low_max[b] = -1


#: :func:`qtile_histogram_add`: a bin whose run of ranks is estimated shorter than this is done rank by rank ...
_SHORT_RUN = 12
#: ... for this many ranks (the buffer of :func:`_qtile_direct`), before the run length is estimated again.
_DIRECT_BLOCK = 4096


@njit(nogil=True, cache=True)
def qtile_histogram_add(start, sorted_cats, n, shift, half, counts, off_edge, low_min, low_max):  # pragma: no cover
    """Add ``qtile = float32(r / (n − 1))`` for ranks ``r = start + i`` (``start >= 0``) with categories
    ``sorted_cats[i]``: the same arrays as :func:`histogram_add` of those values (and as the former per-rank loop).

    How: keys never decrease with ``r`` (every rounding is monotone), so a bin is a run of consecutive ranks. Its
    end is estimated as ``(next bin's lower edge) · (n − 1)`` and corrected by a galloping search that evaluates
    the exact per-rank formula at a few ranks (usually two); its categories are counted by a vectorised loop. Its
    on-edge ranks (key == the bin's lower edge) can only be a prefix of the run, found by a second such search;
    the first off-edge rank has the bin's smallest low bits, the last rank the largest. Bins of fewer than
    ``_SHORT_RUN`` ranks (``r`` below about ``2**(26 − shift)``) are done rank by rank (:func:`_qtile_direct`).
    Chunks may split a run anywhere: each call adds its part. Why: a division and a branchy update per rank cost
    ~2.5 ns; this is a few divisions per bin plus ~0.07 ns per rank (~0.12 ns/rank for bits = 20).
    """
    m = sorted_cats.size
    if m == 0:
        return
    denom = np.float64(max(1, n - 1))
    buf = np.empty(_DIRECT_BLOCK, dtype=np.float32)
    if start < 0:  # negative "ranks": keys are not monotone, no runs
        for a in range(0, m, _DIRECT_BLOCK):
            _qtile_direct(start, sorted_cats, a, min(m, a + _DIRECT_BLOCK), denom, shift, half, buf,
                          counts, off_edge, low_min, low_max)  # fmt: skip
        return
    low_mask = np.int64((1 << shift) - 1)
    stop = start + m
    r = start
    k0 = np.int64(-1)  # the key of rank r, when known (-1: not yet)
    while r < stop:
        if k0 < 0:
            k0 = _qtile_key(r, denom, buf)
        edge = (k0 >> shift) << shift
        nxt = edge + (np.int64(1) << shift)  # lower edge of the next bin
        x = _key_value(nxt, buf) * denom  # about its first rank
        if _key_value(nxt + (np.int64(1) << shift), buf) * denom - x < _SHORT_RUN:  # the next bin holds few ranks
            e = min(stop, r + _DIRECT_BLOCK)
            _qtile_direct(start, sorted_cats, r - start, e - start, denom, shift, half, buf,
                          counts, off_edge, low_min, low_max)  # fmt: skip
            r, k0 = e, np.int64(-1)
            continue
        # the run is [r, r1) (in this call); k1 is the key of r1 (or -1), k_last that of r1 - 1
        r1, k1, k_last = _qtile_first_at_least(nxt, r, k0, stop, _rank_guess(x, r, stop), denom, buf)
        re, k_re = r, k0  # the first off-edge rank of the run and its key
        if k0 == edge:  # on-edge ranks: the run's first ranks with key == edge
            guess = _rank_guess(_key_value(k0 + 1, buf) * denom, r, r1)
            re, k_re, _ = _qtile_first_at_least(k0 + 1, r, k0, r1, guess, denom, buf)
        e0, e1, e2 = _count_categories(sorted_cats, r - start, re - start)
        f0, f1, f2 = _count_categories(sorted_cats, re - start, r1 - start)
        b = (k0 >> shift) + half
        counts[3 * b] += e0 + f0
        counts[3 * b + 1] += e1 + f1
        counts[3 * b + 2] += e2 + f2
        off_edge[3 * b] += f0
        off_edge[3 * b + 1] += f1
        off_edge[3 * b + 2] += f2
        if re < r1:  # keys ascend in the run: its first off-edge rank has the smallest low bits, its last the largest
            low_min[b] = min(low_min[b], k_re & low_mask)
            low_max[b] = max(low_max[b], k_last & low_mask)
        r, k0 = r1, k1


@njit(nogil=True, cache=True, inline="always")
def _qtile_key(r, denom, buf):  # pragma: no cover - compiled
    """The key of rank ``r``'s qtile, exactly as the per-rank formula (the float's bits: qtile >= 0)."""
    buf[0] = np.float32(np.float64(r) / denom)
    return np.int64(buf.view(np.int32)[0])


@njit(nogil=True, cache=True, inline="always")
def _key_value(key, buf):  # pragma: no cover - compiled
    """The float (as float64) whose bits are the non-negative ``key``."""
    buf.view(np.int32)[0] = np.int32(key)
    return np.float64(buf[0])


@njit(nogil=True, cache=True, inline="always")
def _rank_guess(x, lo, hi):  # pragma: no cover - compiled
    """``ceil(x)`` as a rank in ``[lo + 1, hi]``."""
    if x >= hi:
        return hi
    return max(lo + 1, np.int64(math.ceil(x)))


@njit(nogil=True, cache=True)
def _qtile_first_at_least(key, lo, k_lo, hi, guess, denom, buf):  # pragma: no cover - compiled
    """``(p, key of p, key of p − 1)`` for the first rank ``p`` in ``(lo, hi)`` whose qtile's key is ``>= key``,
    else ``p = hi`` (its key −1: not evaluated); ``k_lo < key`` is the key of ``lo``.

    Galloping from ``guess`` (two evaluations when it is right or one too high), then bisection."""
    k_hi = np.int64(-1)
    if hi - lo > 1:
        p = min(max(guess, lo + 1), hi - 1)
        k = _qtile_key(p, denom, buf)
        step = 1
        if k >= key:
            hi, k_hi = p, k
            while hi - step > lo:
                p = hi - step
                k = _qtile_key(p, denom, buf)
                if k < key:
                    lo, k_lo = p, k
                    break
                hi, k_hi = p, k
                step *= 2
        else:
            lo, k_lo = p, k
            while lo + step < hi:
                p = lo + step
                k = _qtile_key(p, denom, buf)
                if k >= key:
                    hi, k_hi = p, k
                    break
                lo, k_lo = p, k
                step *= 2
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            k = _qtile_key(mid, denom, buf)
            if k >= key:
                hi, k_hi = mid, k
            else:
                lo, k_lo = mid, k
    return hi, k_hi, k_lo


@njit(nogil=True, cache=True, inline="always")
def _count_categories(cats, a, b):  # pragma: no cover - compiled
    """How many of ``cats[a:b]`` are 0, 1 and 2: vectorised (int32 lanes over a slice, which a loop over
    ``range(a, b)`` would not be: negative-index wrap-around per element)."""
    n0 = n1 = n2 = 0
    for j in range(a, b, 1 << 30):
        block = cats[j : min(b, j + (1 << 30))]
        m0 = m1 = m2 = np.int32(0)
        for i in range(block.size):
            c = block[i]
            m0 = np.int32(m0 + (c == 0))
            m1 = np.int32(m1 + (c == 1))
            m2 = np.int32(m2 + (c == 2))
        n0 += m0
        n1 += m1
        n2 += m2
    return n0, n1, n2


@njit(nogil=True, cache=True)
def _qtile_direct(
    start, sorted_cats, a, e, denom, shift, half, buf, counts, off_edge, low_min, low_max
):  # pragma: no cover
    """:func:`qtile_histogram_add` of ``sorted_cats[a:e]`` (``e − a <= buf.size``) rank by rank, one division each:
    for bins of few ranks. A bin's counts and low-bit extremes stay in registers and are written once."""
    low_mask = np.int64((1 << shift) - 1)
    keys = buf.view(np.int32)  # qtile >= 0: the float's bits are its key
    cats = sorted_cats[a:e]
    first = start + a
    for i in range(cats.size):
        buf[i] = np.float32(np.float64(first + i) / denom)
    current = -1
    n0 = n1 = n2 = 0
    f0 = f1 = f2 = 0
    lo_min = np.int64(1) << shift
    lo_max = np.int64(-1)
    for i in range(cats.size):
        k = np.int64(keys[i])
        b = (k >> shift) + half
        if b != current:
            if current >= 0:
                _flush_run(current, n0, n1, n2, f0, f1, f2, lo_min, lo_max, counts, off_edge, low_min, low_max)
            current = b
            n0 = n1 = n2 = 0
            f0 = f1 = f2 = 0
            lo_min = np.int64(1) << shift
            lo_max = np.int64(-1)
        c = cats[i]
        n0 += c == 0
        n1 += c == 1
        n2 += c == 2
        low = k & low_mask
        if low != 0:
            f0 += c == 0
            f1 += c == 1
            f2 += c == 2
            lo_min = min(lo_min, low)
            lo_max = max(lo_max, low)
    if current >= 0:
        _flush_run(current, n0, n1, n2, f0, f1, f2, lo_min, lo_max, counts, off_edge, low_min, low_max)


@njit(nogil=True, cache=True)
def _flush_run(b, n0, n1, n2, f0, f1, f2, lo_min, lo_max, counts, off_edge, low_min, low_max):  # pragma: no cover
    counts[3 * b] += n0
    counts[3 * b + 1] += n1
    counts[3 * b + 2] += n2
    off_edge[3 * b] += f0
    off_edge[3 * b + 1] += f1
    off_edge[3 * b + 2] += f2
    if lo_max >= 0:
        low_min[b] = min(low_min[b], lo_min)
        low_max[b] = max(low_max[b], lo_max)


@njit(nogil=True, cache=True)
def count_nonfinite(values):  # pragma: no cover - compiled
    """Number of NaN/±inf entries of a float32 array (exponent bits all set), vectorised."""
    bits = values.view(np.int32)
    bad = 0
    for i in range(bits.size):
        bad += (bits[i] & 0x7F800000) == 0x7F800000
    return bad


@njit(nogil=True, cache=True)
def categorize(packed, forget_bits, retain_bits, out):  # pragma: no cover - compiled
    """uint8 category per scalar: 2 (FORGET) if any forget bit, else 1 (RETAIN) if any retain bit, else 0."""
    for i in range(packed.size):
        m = packed[i]
        is_forget = np.uint8((m & forget_bits) != 0)
        is_retain = np.uint8((m & retain_bits) != 0)
        out[i] = is_forget + is_forget + (is_retain & (np.uint8(1) - is_forget))


@njit(nogil=True, cache=True, fastmath=_REORDER)
def pair_pass(before, after, packed, forget_bits, retain_bits, delta, before_abs, cats, sums):  # pragma: no cover
    """Everything the localization walk needs from one float32 block of a before/after pair, in one pass.

    Writes ``delta = |after − before|``, ``before_abs = |before|`` and ``cats`` (as :func:`categorize`), and
    adds to ``sums`` (float64[10]): Σ|δ|, Σδ² and ΣΔ² per category (3) with δ = after − before rounded to
    float32 and summed in float64, the count per category (3), then the NaN/±inf counts of before and after. One flat loop: LLVM vectorises it (a chunked loop, or bit views of the
    inputs, made it 6x slower).
    """
    big = np.float32(3.4028234663852886e38)  # largest finite float32: NaN and ±inf fail |x| <= big
    s_abs = 0.0
    s_sq = 0.0
    e_outside = 0.0
    e_retain = 0.0
    e_forget = 0.0
    n_retain = 0
    n_forget = 0
    bad_before = 0
    bad_after = 0
    for i in range(before.size):
        o = before[i]
        u = after[i]
        d = u - o
        delta[i] = abs(d)
        before_abs[i] = abs(o)
        m = packed[i]
        is_forget = np.uint8((m & forget_bits) != 0)
        is_retain = np.uint8((m & retain_bits) != 0)
        c = is_forget + is_forget + (is_retain & (np.uint8(1) - is_forget))
        cats[i] = c
        dd = np.float64(d)
        sq = dd * dd
        s_abs += abs(dd)
        s_sq += sq
        e_retain += sq if c == 1 else 0.0
        e_forget += sq if c == 2 else 0.0
        e_outside += sq if c == 0 else 0.0
        n_retain += c == 1
        n_forget += c == 2
        bad_before += not (abs(o) <= big)
        bad_after += not (abs(u) <= big)
    sums[0] += s_abs
    sums[1] += s_sq
    sums[2] += e_outside
    sums[3] += e_retain
    sums[4] += e_forget
    sums[5] += before.size - n_retain - n_forget
    sums[6] += n_retain
    sums[7] += n_forget
    sums[8] += bad_before
    sums[9] += bad_after


@njit(nogil=True, cache=True, fastmath=_REORDER)
def diff_square_sums(before, after):  # pragma: no cover - compiled
    """(Σ (after − before)², Σ before²) in float64, the difference taken exactly in float64."""
    d_sq = 0.0
    w_sq = 0.0
    for i in range(before.size):
        w = np.float64(before[i])
        d = np.float64(after[i]) - w
        d_sq += d * d
        w_sq += w * w
    return d_sq, w_sq


@njit(nogil=True, cache=True)
def stable_order(scores):  # pragma: no cover - compiled
    """Stable argsort of float32 ``scores`` (ties keep index order) as uint32 indices; see :func:`stable_sorted`."""
    return stable_sorted(scores, np.arange(scores.size, dtype=np.uint32))


@njit(nogil=True, cache=True)
def rank_categories(scores, cats):  # pragma: no cover - compiled
    """``cats`` in the stable ascending order of ``scores``: the categories of ranks 0, 1, … (for ``qtile``)."""
    return stable_sorted(scores, cats)


@njit(inline="always")  # inlined in numba IR: called, its error-status checks slow the loops down
def _sort_key(bits):  # pragma: no cover - compiled
    """uint32-range sort key of float32 raw ``bits`` (int32): ``2**31 + bits`` if ≥ 0, else ``−bits``.

    Strictly increasing in the float (NaNs by their raw bits), −0 and +0 both ``2**31``: it is
    :func:`lacuna_metrics.localization.auc.signed_keys` ``+ 2**31``, plus 1 for negatives, so that its low 16 bits are
    zero exactly when the float's are, for either sign.
    """
    k = np.int64(bits)
    return k + 2147483648 if k >= 0 else -k


@njit(nogil=True, cache=True)
def stable_sorted(scores, payload):  # pragma: no cover - compiled
    """``payload`` permuted into the stable ascending order of float32 ``scores`` (−0 and +0 tie).

    A radix sort by :func:`_sort_key` that skips the low-half pass for keys whose low 16 bits are zero:
    every zero and bf16 value and ~99% of the differences of bf16 weights, so most ``qtile`` scores. Such
    a key is the smallest of its high-half bucket, so one counting pass and one scatter by the high half
    (in index order) put it in place; the keys with low bits then get the two LSD passes (by the low half
    into a buffer, by the high half into the rest of their bucket). Exactly the stable order by key, on any
    input, in 2 passes over the data plus 2 over the keys with low bits (5 before): about 3 ns per scalar
    on a bf16 pair's ``|δ|`` (was 6), 15 on random float32 (was 19), uint8 payload. NaN has no rank here
    (its raw bits decide); the scorer never passes one, since checkpoint reads reject non-finite weights.
    """
    n = scores.size
    bits = scores.view(np.int32)
    out = np.empty(n, dtype=payload.dtype)
    tables = np.zeros(2 * 65536 + 1, dtype=np.int64)  # one block: two would be page-faulted in on every call
    counts = tables[:65537]  # by the high half, all keys: bucket starts
    lows = tables[65537:]  # by the low half, all keys (a branch would mispredict on mixed data)
    for i in range(n):
        key = _sort_key(bits[i])
        counts[(key >> 16) + 1] += 1
        lows[key & 0xFFFF] += 1
    for b in range(65536):
        counts[b + 1] += counts[b]
    lows[0] = 0  # keys with a zero low half skip the low pass
    m = 0
    for b in range(65536):
        c = lows[b]
        lows[b] = m
        m += c
    high = np.empty(m, dtype=np.uint16)  # the m keys with low bits, by their low half: high half, payload
    first = np.empty(m, dtype=payload.dtype)
    for i in range(n):
        key = _sort_key(bits[i])
        low = key & 0xFFFF
        if low == 0:  # first in its bucket, in index order
            b = key >> 16
            j = counts[b]
            counts[b] = j + 1
            out[j] = payload[i]
        else:
            j = lows[low]
            lows[low] = j + 1
            high[j] = key >> 16
            first[j] = payload[i]
    for i in range(m):  # by the high half, after the bucket's zero-low keys (stable: ties keep low order)
        b = np.int64(high[i])
        j = counts[b]
        counts[b] = j + 1
        out[j] = first[i]
    return out


# --------------------------------------------------------------------------------------------------
# average ranks (mid-ranks) for qtile: tied scores share one rank


@njit(nogil=True, cache=True)
def stable_sorted_ties(scores, payload):  # pragma: no cover - compiled
    """:func:`stable_sorted` of ``payload`` and the tie flags of the sorted order: ``(out, ties)`` with
    ``ties[j] = 1`` (uint8) iff the score of rank ``j`` equals that of rank ``j − 1`` (−0 and +0 tie), else 0.

    A run of equal scores is thus rank ``s`` (flag 0) followed by ranks flagged 1; :func:`qtile_ties_values` and
    :func:`qtile_ties_histogram_add` give each member the run's average rank. The flags come out of the same
    passes as the order: a key with a zero low half is the first of its high-half bucket, so those keys of one
    bucket are one run (flagged by a sequential fill after the scatter); the keys with low bits reach their
    bucket in the order of their low half, the equal ones one after another, so a key ties with the previous
    key of its bucket iff their low halves are equal (one 65536-entry table of the last low half per bucket).
    Costs 5-15% more than :func:`stable_sorted` (the flags' writes), one byte per scalar more memory.
    """
    n = scores.size
    bits = scores.view(np.int32)
    out = np.empty(n, dtype=payload.dtype)
    ties = np.empty(n, dtype=np.uint8)
    tables = np.zeros(3 * 65536 + 1, dtype=np.int64)
    counts = tables[:65537]  # by the high half, all keys: bucket starts
    lows = tables[65537 : 2 * 65536 + 1]  # by the low half, all keys
    starts = tables[2 * 65536 + 1 :]  # bucket starts, kept
    for i in range(n):
        key = _sort_key(bits[i])
        counts[(key >> 16) + 1] += 1
        lows[key & 0xFFFF] += 1
    for b in range(65536):
        counts[b + 1] += counts[b]
        starts[b] = counts[b]
    lows[0] = 0  # keys with a zero low half skip the low pass
    m = 0
    for b in range(65536):
        c = lows[b]
        lows[b] = m
        m += c
    high = np.empty(m, dtype=np.uint16)
    first = np.empty(m, dtype=payload.dtype)
    for i in range(n):
        key = _sort_key(bits[i])
        low = key & 0xFFFF
        if low == 0:
            b = key >> 16
            j = counts[b]
            counts[b] = j + 1
            out[j] = payload[i]
        else:
            j = lows[low]
            lows[low] = j + 1
            high[j] = key >> 16
            first[j] = payload[i]
    for b in range(65536):  # the zero-low keys of a bucket: one run at its start
        s, e = starts[b], counts[b]
        if e > s:
            ties[s] = 0
            ties[s + 1 : e] = 1
    last = np.zeros(65536, dtype=np.uint16)  # per bucket, the low half of its last key placed (0: none yet)
    for low in range(1, 65536):  # lows[low] is now the end of the low half's segment, lows[0] = 0
        for i in range(lows[low - 1], lows[low]):
            b = np.int64(high[i])
            j = counts[b]
            counts[b] = j + 1
            out[j] = first[i]
            ties[j] = np.uint8(last[b] == low)
            last[b] = low
    return out, ties


@njit(nogil=True, cache=True)
def rank_categories_ties(scores, cats):  # pragma: no cover - compiled
    """``cats`` in the stable ascending order of ``scores`` and the tie flags (:func:`stable_sorted_ties`)."""
    return stable_sorted_ties(scores, cats)


#: Tie-flag scans look at this many flags one by one, then go by blocks of :data:`_SCAN_BLOCK` (vectorised).
_SCAN_SHORT = 16
_SCAN_BLOCK = 256


@njit(nogil=True, cache=True, inline="always")
def _next_tie(ties, p, stop):  # pragma: no cover - compiled
    """The first ``i`` in ``[p, stop)`` with ``ties[i] != 0``, else ``stop``."""
    e = min(stop, p + _SCAN_SHORT)
    while p < e:
        if ties[p]:
            return p
        p += 1
    while p < stop:
        e = min(stop, p + _SCAN_BLOCK)
        block = ties[p:e]
        acc = np.uint8(0)
        for i in range(block.size):
            acc |= block[i]
        if acc:
            while not ties[p]:
                p += 1
            return p
        p = e
    return stop


@njit(nogil=True, cache=True, inline="always")
def _run_end(ties, p, stop):  # pragma: no cover - compiled
    """The first ``i`` in ``[p, stop)`` with ``ties[i] == 0`` (the next run's start), else ``stop``."""
    e = min(stop, p + _SCAN_SHORT)
    while p < e:
        if not ties[p]:
            return p
        p += 1
    while p < stop:
        e = min(stop, p + _SCAN_BLOCK)
        block = ties[p:e]
        acc = np.uint8(1)
        for i in range(block.size):
            acc &= block[i]
        if not acc:
            while ties[p]:
                p += 1
            return p
        p = e
    return stop


@njit(nogil=True, cache=True, inline="always")
def _run_start(ties, p):  # pragma: no cover - compiled
    """The start of the run holding rank ``p``: the last ``i <= p`` with ``ties[i] == 0`` (0 if none)."""
    while p > 0 and ties[p]:
        if p >= _SCAN_BLOCK:
            block = ties[p - _SCAN_BLOCK + 1 : p + 1]
            acc = np.uint8(1)
            for i in range(block.size):
                acc &= block[i]
            if acc:
                p -= _SCAN_BLOCK
                continue
        p -= 1
    return p


@njit(nogil=True, cache=True)
def qtile_ties_values(ties, lo, hi):  # pragma: no cover - compiled
    """``qtile`` with average ranks of ranks ``[lo, hi)`` of a tensor of ``n = ties.size`` scalars (float32).

    Every member of a run of equal scores ``[s, e)`` (from the flags of :func:`stable_sorted_ties`) gets its
    average rank ``(s + e − 1) / 2`` over ``n − 1``: ``float32(float64(s + e − 1) / (2 · max(1, n − 1)))``, which
    for a run of one is exactly the ordinal ``float32(r / (n − 1))`` (the same rational, rounded once)."""
    n = ties.size
    denom = 2.0 * np.float64(max(1, n - 1))
    out = np.empty(max(0, hi - lo), dtype=np.float32)
    p = lo
    s = _run_start(ties, p) if p < hi else p
    while p < hi:
        e = _run_end(ties, p + 1, n)
        v = np.float32(np.float64(s + e - 1) / denom)
        stop = min(e, hi)
        out[p - lo : stop - lo] = v
        p = s = stop
    return out


#: :func:`qtile_ties_histogram_add`: a run of equal scores at least this long is added as one value, and so many
#: distinct scores in a row go to :func:`qtile_histogram_add`; the rest are done in blocks of ``_TIES_BLOCK`` ranks.
_LONG_RUN = 64
_TIES_BLOCK = 1024


@njit(nogil=True, cache=True)
def qtile_ties_histogram_add(
    lo, hi, sorted_cats, ties, shift, half, counts, off_edge, low_min, low_max
):  # pragma: no cover - compiled
    """Add ``qtile`` with average ranks (:func:`qtile_ties_values`) of ranks ``[lo, hi)`` with categories
    ``sorted_cats[lo:hi]`` (whole-tensor arrays, ``n = sorted_cats.size``): the same arrays as
    :func:`histogram_add` of those values.

    How: values ascend with the rank, so a bin is a run of ranks, as in :func:`qtile_histogram_add`. A run of at
    least ``_LONG_RUN`` equal scores is one value, added once with its category counts (a vectorised count): a
    bf16 pair's ``|δ|`` (few distinct values, long runs) costs about one pass over its categories. As many
    distinct scores in a row have the ordinal qtile and go to :func:`qtile_histogram_add` (~0.1 ns per rank).
    The rest (short runs and distinct scores mixed, as in float32 ``|δ|``) is done in blocks of whole runs,
    branch-free per rank: each rank's run end (a backward pass) and start (a forward pass), its value (one
    division), and a bin's counts kept in registers until the values leave it. A run split by ``lo`` or ``hi``
    is found in the flags outside ``[lo, hi)`` and each call adds its part (correct for any split, but a long
    run is scanned by every call that holds part of it: add a tensor in one call).
    """
    n = sorted_cats.size
    if hi <= lo:
        return
    denom = 2.0 * np.float64(max(1, n - 1))
    low_mask = np.int64((1 << shift) - 1)
    low_empty = np.int64(1) << shift
    ends = np.empty(_TIES_BLOCK, dtype=np.int64)  # per rank of a block: its run's end, then start + end − 1
    values = np.empty(_TIES_BLOCK, dtype=np.float32)
    keys = values.view(np.int32)  # qtile >= 0: the float's bits are its key
    p = lo
    s = _run_start(ties, p)  # the start of the run holding p
    while p < hi:
        if s < p or (p + _LONG_RUN < n and _all_set(ties, p + 1, p + _LONG_RUN + 1)):  # one value
            e = _run_end(ties, p + 1, n)
            stop = min(e, hi)
            values[0] = np.float32(np.float64(s + e - 1) / denom)
            c0, c1, c2 = _count_categories(sorted_cats, p, stop)
            _add_value(np.int64(keys[0]), c0, c1, c2, shift, half, low_mask, counts, off_edge, low_min, low_max)
            p = s = stop
            continue
        if p + _LONG_RUN < hi and not _any_set(ties, p + 1, p + _LONG_RUN + 1):  # many distinct scores
            limit = min(n, hi + 1)
            t = _next_tie(ties, p + _LONG_RUN + 1, limit)  # t − 1 starts a run of several, if t < limit
            stop = t - 1 if t < limit else hi
            qtile_histogram_add(p, sorted_cats[p:stop], n, shift, half, counts, off_edge, low_min, low_max)
            p = s = stop
            continue
        # a block [p, q) of whole runs (the last one may be cut by hi); p starts a run shorter than _LONG_RUN
        q = min(hi, p + _TIES_BLOCK)
        if q < n and ties[q]:  # the run holding q − 1 goes on: end the block before it, unless it starts at p
            r = _run_start(ties, q - 1)
            q = r if r > p else min(hi, _run_end(ties, q, n), p + _TIES_BLOCK)
        m = q - p
        flags = ties[p:q]
        end = _run_end(ties, q, n) if q < n else n
        for i in range(m - 1, -1, -1):
            ends[i] = end
            end = end if flags[i] else p + i
        for i in range(m):
            s = s if flags[i] else p + i
            ends[i] += s - 1
        for i in range(m):  # vectorised divisions
            values[i] = np.float32(np.float64(ends[i]) / denom)
        cats = sorted_cats[p:q]
        cur = np.int64(-1)
        n0 = n1 = n2 = f0 = f1 = f2 = np.int64(0)
        lo_min, lo_max = low_empty, np.int64(-1)
        for i in range(m):
            k = np.int64(keys[i])
            b = (k >> shift) + half
            if b != cur:
                if cur >= 0:
                    _flush_run(cur, n0, n1, n2, f0, f1, f2, lo_min, lo_max, counts, off_edge, low_min, low_max)
                cur = b
                n0 = n1 = n2 = f0 = f1 = f2 = np.int64(0)
                lo_min, lo_max = low_empty, np.int64(-1)
            c = cats[i]
            low = k & low_mask
            off = np.int64(low != 0)
            z0, z1, z2 = np.int64(c == 0), np.int64(c == 1), np.int64(c == 2)
            n0 += z0
            n1 += z1
            n2 += z2
            f0 += off * z0
            f1 += off * z1
            f2 += off * z2
            lo_min = min(lo_min, low if off else low_empty)
            lo_max = max(lo_max, low if off else np.int64(-1))
        if cur >= 0:
            _flush_run(cur, n0, n1, n2, f0, f1, f2, lo_min, lo_max, counts, off_edge, low_min, low_max)
        p = q
        if p < n and not ties[p]:
            s = p


@njit(nogil=True, cache=True, inline="always")
def _all_set(ties, a, b):  # pragma: no cover - compiled
    """Whether every flag of ``ties[a:b]`` is set (vectorised)."""
    block = ties[a:b]
    acc = np.uint8(1)
    for i in range(block.size):
        acc &= block[i]
    return acc != 0


@njit(nogil=True, cache=True, inline="always")
def _any_set(ties, a, b):  # pragma: no cover - compiled
    """Whether any flag of ``ties[a:b]`` is set (vectorised)."""
    block = ties[a:b]
    acc = np.uint8(0)
    for i in range(block.size):
        acc |= block[i]
    return acc != 0


@njit(nogil=True, cache=True, inline="always")
def _add_value(k, n0, n1, n2, shift, half, low_mask, counts, off_edge, low_min, low_max):  # pragma: no cover
    """Add the non-negative key ``k`` with ``n0, n1, n2`` scalars of categories 0, 1, 2 (as :func:`histogram_add`)."""
    b = (k >> shift) + half
    low = k & low_mask
    if low != 0:
        _flush_run(b, n0, n1, n2, n0, n1, n2, low, low, counts, off_edge, low_min, low_max)
    else:
        _flush_run(b, n0, n1, n2, 0, 0, 0, 0, -1, counts, off_edge, low_min, low_max)
