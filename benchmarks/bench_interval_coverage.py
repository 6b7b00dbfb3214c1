"""Coverage and width of the intervals over persons: the old percentile bootstrap against the exact intervals that
replaced it (issue 35 item 3).

    python benchmarks/bench_interval_coverage.py [--draws 2000] [--ns 2,5,20,100] [--ps 0,0.05,0.1,0.3,0.5]
                                                 [--seed 35] [--json PATH]

For each number of persons n and true rate p, draws ``--draws`` seeded sets of n persons and reports how often each
interval holds p (coverage; 95% is the promise) and its mean width. Two kinds of per-person value:

- ``0/1``: each person leaks (or is answered) with probability p, as for the forget leak, J_W, J_P, J_ICR, the
  QA accuracies and Success@N. Intervals: the percentile bootstrap over persons (2,000 resamples, as
  ``bootstrap_interval`` computed it before issue 35) and Clopper-Pearson (``rate_interval``).
- ``share of 3``: each person's share of 3 questions answered, persons differing (their chance is Beta(2p, 2(1-p))),
  as for cross-field retention. Intervals: the percentile bootstrap, a t-interval clipped to [0, 1] (the usual
  choice for a mean) and Clopper-Pearson on the fractional count (``rate_interval``).

Prints one markdown table per kind (rows: method x n; cells: coverage, mean width in brackets) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats

from lacuna_metrics import rate_interval

#: Resamples of the old percentile bootstrap (its DEFAULT_RESAMPLES).
RESAMPLES = 2000


def percentile_bootstrap(values: np.ndarray, *, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap over persons that lacuna run reported before issue 35: resample persons with
    replacement, take the 2.5% and 97.5% quantiles of the resampled means; ``[v, v]`` when every value is equal."""
    if np.all(values == values[0]):
        return float(values[0]), float(values[0])
    rng = np.random.Generator(np.random.PCG64(seed))
    means = values[rng.integers(0, values.size, size=(RESAMPLES, values.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def t_interval(values: np.ndarray, *, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean, clipped to [0, 1] (a point when every value is equal)."""
    n = values.size
    half = stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / np.sqrt(n)
    mean = float(values.mean())
    return max(0.0, mean - half), min(1.0, mean + half)


def exact(values: np.ndarray) -> tuple[float, float]:
    """The interval results.json records now (Clopper-Pearson, fractional k for shares)."""
    got = rate_interval(values.tolist(), metric="bench")
    return got["low"], got["high"]


def _binary(rng: np.random.Generator, n: int, p: float, draws: int) -> np.ndarray:
    return (rng.random((draws, n)) < p).astype(np.float64)


def _share_of_3(rng: np.random.Generator, n: int, p: float, draws: int) -> np.ndarray:
    if p == 0.0:
        return np.zeros((draws, n))
    return rng.binomial(3, rng.beta(2 * p, 2 * (1 - p), size=(draws, n))) / 3


KINDS: dict[str, tuple[Callable[..., np.ndarray], dict[str, Callable[[np.ndarray], tuple[float, float]]]]] = {
    "0/1": (_binary, {"percentile bootstrap (old)": percentile_bootstrap, "clopper_pearson": exact}),
    "share of 3": (
        _share_of_3,
        {
            "percentile bootstrap (old)": percentile_bootstrap,
            "t-interval": t_interval,
            "clopper_pearson_fractional": exact,
        },
    ),
}


def coverage(kind: str, method: str, n: int, p: float, draws: int, seed: int) -> tuple[float, float]:
    """(coverage, mean width) of one method at n persons and true rate p over ``draws`` seeded draws."""
    sample, methods = KINDS[kind]
    values = sample(np.random.default_rng([seed, n, int(round(p * 1000))]), n, p, draws)
    interval = methods[method]
    cache: dict[bytes, tuple[float, float]] = {}  # an interval depends on the multiset of values only
    hits, width = 0, 0.0
    for row in values:
        key = np.sort(row).tobytes()
        if key not in cache:
            cache[key] = interval(np.sort(row))
        low, high = cache[key]
        hits += low - 1e-12 <= p <= high + 1e-12
        width += high - low
    return hits / draws, width / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=2000, help="seeded draws per (method, n, p) cell")
    parser.add_argument("--ns", default="2,5,20,100", help="numbers of persons")
    parser.add_argument("--ps", default="0,0.05,0.1,0.3,0.5", help="true rates")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    ps = [float(x) for x in args.ps.split(",")]
    start = time.perf_counter()
    rows = []
    for kind, (_, methods) in KINDS.items():
        print(f"\nPer-person values: {kind}; {args.draws} draws per cell; coverage (mean width), 95% promised\n")
        print("| method | n | " + " | ".join(f"p = {p:g}" for p in ps) + " |")
        print("|---|---|" + "---|" * len(ps))
        for method in methods:
            for n in ns:
                cells = []
                for p in ps:
                    cov, width = coverage(kind, method, n, p, args.draws, args.seed)
                    rows.append({"kind": kind, "method": method, "n": n, "p": p, "coverage": cov, "width": width})
                    cells.append(f"{cov:.3f} ({width:.2f})")
                print(f"| {method} | {n} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
