"""Tests for the localization scorer (docs/definitions.md#localization-precision): every score, baseline, AUC,
precision@k, per-layer row and the composite against a brute-force numpy / scikit-learn reference written here (never
the library's score_block).

The checkpoints are tiny Llama-like state dicts saved with safetensors (float32 and bf16), with masks saved as
our safetensors masks and as a released-style flat ``mask.pt``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import rankdata
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from lacuna_metrics.localization.precision import (
    BASELINES,
    COMPOSITE_FEATURES,
    SCORES,
    Localization,
    LocalizationConfig,
    out_of_fold_proba,
)
from lacuna_metrics.masks import MaskError, MaskReader, MaskSet, component, save_masks
from lacuna_metrics.score import score_pair
from lacuna_metrics.weights.checkpoints import Checkpoint, CheckpointError

EPS = 1e-10
FORGET_BITS = (1 << 0) | (1 << 2) | (1 << 4)
RETAIN_BITS = (1 << 1) | (1 << 3) | (1 << 5)
OUTSIDE, RETAIN, FORGET = 0, 1, 2
TARGET_CLASSES = {
    "forget": ((FORGET,), (OUTSIDE, RETAIN)),
    "unified": ((FORGET, RETAIN), (OUTSIDE,)),
    "forget_vs_retain": ((FORGET,), (RETAIN,)),
}
CONTROL_SCORES = ("compnorm", "contrast", "contrastnorm", "contrastln", "eratio")
BASE_SCORES = ("signrev", "reversal", "dirreversal")
FRACTIONS = {"0.1%": 0.001, "1%": 0.01, "5%": 0.05, "10%": 0.1}
CROSSFIELD_RUNS = ("cf0", "cf1", "cf2")

# -- tiny checkpoints and masks -------------------------------------------------------------------------------


def llama_shapes(layers: int = 3, hidden: int = 16, inter: int = 24, vocab: int = 40) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (hidden, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (hidden // 2, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (hidden // 2, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, hidden)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def random_packed(rng: np.random.Generator, shape: tuple[int, ...], p_masked: float = 0.7) -> np.ndarray:
    """One group bit per scalar (or none); a few forget+retain overlaps (-> FORGET) and stray bit-7 scalars."""
    n = math.prod(shape)
    groups = rng.integers(0, 6, n)
    packed = np.where(rng.random(n) < p_masked, 1 << groups, 0).astype(np.int32)
    packed[rng.random(n) < 0.02] = (1 << 2) | (1 << 3)  # forget and retain bit: counts as FORGET
    packed[rng.random(n) < 0.02] = 1 << 7  # a bit outside every group: OUTSIDE
    return packed.reshape(shape)


def make_masks(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Masks for all projections except layer 0's o_proj (unmasked), with tensors that must stay out of the universe:
    the last layer's k_proj has only retain bits, its v_proj only forget bits; the embedding and a norm are masked."""
    last = max(int(m.group(1)) for n in shapes if (m := re.search(r"layers\.(\d+)\.", n)))
    packed: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if component(name) is None or name == "model.layers.0.self_attn.o_proj.weight":
            continue
        packed[name] = random_packed(rng, shape)
    n_k = math.prod(shapes[f"model.layers.{last}.self_attn.k_proj.weight"])
    retain_only = np.where(rng.random(n_k) < 0.5, 1 << rng.choice([1, 3, 5], n_k), 0).astype(np.int32)
    packed[f"model.layers.{last}.self_attn.k_proj.weight"] = retain_only.reshape(
        shapes[f"model.layers.{last}.self_attn.k_proj.weight"]
    )
    v_shape = shapes[f"model.layers.{last}.self_attn.v_proj.weight"]
    packed[f"model.layers.{last}.self_attn.v_proj.weight"] = (1 << rng.choice([0, 2, 4], v_shape)).astype(np.int32)
    packed["model.embed_tokens.weight"] = random_packed(rng, shapes["model.embed_tokens.weight"])
    packed["model.layers.0.input_layernorm.weight"] = random_packed(
        rng, shapes["model.layers.0.input_layernorm.weight"]
    )
    return packed


def ref_categories(packed: np.ndarray) -> np.ndarray:
    cat = np.zeros(packed.size, dtype=np.uint8)
    flat = packed.reshape(-1)
    cat[(flat & RETAIN_BITS) != 0] = RETAIN
    cat[(flat & FORGET_BITS) != 0] = FORGET
    return cat


def default_delta(rng: np.random.Generator, cat: np.ndarray, inj: np.ndarray) -> np.ndarray:
    """Update of a plausible method: bigger on forget scalars, partly undoing the injection; 40 % unchanged (ties)."""
    scale = np.where(cat == FORGET, 0.03, np.where(cat == RETAIN, 0.015, 0.01))
    d = rng.standard_normal(cat.size) * scale - 0.3 * (cat == FORGET) * inj
    d[rng.random(cat.size) < 0.4] = 0.0
    return d


def rounded(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dtype).to(torch.float32).numpy()


def save_checkpoint(path: Path, values: dict[str, np.ndarray], dtype: torch.dtype) -> None:
    path.mkdir(parents=True)
    tensors = {n: torch.from_numpy(np.ascontiguousarray(v)).to(dtype).contiguous() for n, v in values.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@dataclass
class Bench:
    root: Path
    shapes: dict[str, tuple[int, ...]]
    packed: dict[str, np.ndarray]
    masks: Path
    paths: dict[str, Path]
    values: dict[str, dict[str, np.ndarray]]  # label -> name -> float32 values exactly as stored (after rounding)

    def run(
        self,
        config: LocalizationConfig | None = None,
        *,
        base: bool = True,
        control: bool = True,
        crossfield: tuple[str, ...] = CROSSFIELD_RUNS,
        masks: Path | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Localization result; ``labels`` maps a role (after, control_after, ...) to another checkpoint label."""
        labels = {"before": "before", "after": "after", "control_before": "control_before", **(labels or {})}
        labels.setdefault("control_after", "control_after")
        ck = {label: Checkpoint(path) for label, path in self.paths.items()}
        loc = Localization(
            ck[labels["before"]],
            ck[labels["after"]],
            MaskReader(masks or self.masks),
            base=ck["base"] if base else None,
            control=(ck[labels["control_before"]], ck[labels["control_after"]]) if control else None,
            crossfield=[ck[c] for c in crossfield],
            config=config,
        )
        return loc.run()


def make_bench(
    root: Path,
    seed: int,
    *,
    dtype: torch.dtype = torch.float32,
    shapes: dict[str, tuple[int, ...]] | None = None,
    delta=default_delta,
    quantized: bool = False,
) -> Bench:
    """``quantized``: weights on a 1/64 grid, so before + k/8 is exact and planted magnitudes stay exact ties."""
    rng = np.random.default_rng(seed)
    shapes = shapes or llama_shapes()
    packed = make_masks(rng, shapes)
    cats = {
        n: ref_categories(packed[n]) if n in packed else np.zeros(math.prod(s), np.uint8) for n, s in shapes.items()
    }
    raw: dict[str, dict[str, np.ndarray]] = {k: {} for k in ("before", "after", "base", "control_before")}
    raw["control_after"] = {}
    for c in CROSSFIELD_RUNS:
        raw[c] = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        cat = cats[name]
        o = rng.standard_normal(n)
        o = rounded(np.round(o * 64) / 64 if quantized else o, dtype)
        masked = packed[name].reshape(-1) != 0 if name in packed else np.zeros(n, bool)
        inj = np.where(masked, rng.standard_normal(n) * 0.05, 0.0)
        inj[rng.random(n) < 0.1] = 0.0
        raw["before"][name] = o
        raw["base"][name] = rounded(o - inj, dtype)
        inj_read = o - raw["base"][name]
        raw["after"][name] = rounded(o + delta(rng, cat, inj_read), dtype)
        co = rounded(o + rng.standard_normal(n) * 0.01, dtype)
        dc = rng.standard_normal(n) * 0.012
        dc[rng.random(n) < 0.3] = 0.0
        raw["control_before"][name], raw["control_after"][name] = co, rounded(co + dc, dtype)
        for c in CROSSFIELD_RUNS:
            df = rng.standard_normal(n) * np.where(cat == FORGET, 0.02, 0.01)
            df[rng.random(n) < 0.3] = 0.0
            raw[c][name] = rounded(o + df, dtype)
    values = {label: {n: v.reshape(shapes[n]) for n, v in vals.items()} for label, vals in raw.items()}
    paths = {}
    for label, vals in values.items():
        paths[label] = root / label
        save_checkpoint(paths[label], vals, dtype)
    masks = save_masks(
        MaskSet({n: torch.from_numpy(p) for n, p in packed.items()}, num_groups=6), root / "masks.safetensors"
    )
    return Bench(root, shapes, packed, masks, paths, values)


# -- brute-force reference ------------------------------------------------------------------------------------


def file_order(path: Path) -> list[str]:
    """Tensor names in the order of the safetensors header (what a streaming reader walks)."""
    raw = (path / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    return [n for n in header if n != "__metadata__"]


def group_key(name: str) -> tuple[int, str]:
    m = re.search(r"layers\.(\d+)\.", name)
    return (int(m.group(1)) if m else 0, str(component(name)))


def qtile(delta: np.ndarray, ties: str = "average") -> np.ndarray:
    """The qtile (docs/definitions.md#localization-precision) of |δ| within its tensor: average ranks of tied values
    (the default), or ``"ordinal"`` ranks (the release code's stable argsort: ties in index order) over n − 1."""
    n = delta.size
    if ties == "average":
        return ((rankdata(delta + np.float32(0.0), method="average") - 1.0) / max(1, n - 1)).astype(np.float32)
    order = np.argsort(delta, kind="stable")
    q = np.empty(n, dtype=np.float32)
    q[order] = (np.arange(n, dtype=np.float64) / max(1, n - 1)).astype(np.float32)
    return q


@dataclass
class Ref:
    names: list[str]
    groups: dict[tuple[int, str], list[str]]
    group_rows: dict[tuple[int, str], slice]
    cats: np.ndarray
    scores: dict[str, np.ndarray]
    energy: dict[tuple[int, str], np.ndarray]
    features: list[str]


def reference(
    bench: Bench,
    *,
    base: bool = True,
    control: bool = True,
    crossfield: tuple[str, ...] = CROSSFIELD_RUNS,
    labels: dict[str, str] | None = None,
    ties: str = "average",
    sigma_over: str = "group",
) -> Ref:
    """``sigma_over="group"``: σ of δ and of the contrast over every attention/MLP tensor of the (layer, component)
    group, masked or not, in the universe or not (docs/definitions.md#localization-precision, the release);
    ``"universe"``: over the group's universe tensors only (what the scorer did before)."""
    labels = {"before": "before", "after": "after", "control_before": "control_before", **(labels or {})}
    labels.setdefault("control_after", "control_after")
    v = bench.values
    candidates = [n for n in file_order(bench.paths["before"]) if n in bench.packed and component(n) is not None]
    keys: list[tuple[int, str]] = []
    for n in candidates:
        if group_key(n) not in keys:
            keys.append(group_key(n))
    cats = {n: ref_categories(bench.packed[n]) for n in candidates}
    groups = {}
    for k in keys:
        members = [n for n in candidates if group_key(n) == k and 0 < int((cats[n] == FORGET).sum()) < cats[n].size]
        if members:
            groups[k] = members
    names = [n for members in groups.values() for n in members]
    every = [n for n in file_order(bench.paths["before"]) if component(n) is not None]
    scores: dict[str, list[np.ndarray]] = {s: [] for s in (*SCORES, *BASELINES)}
    energy, group_rows, all_cats = {}, {}, []
    row = 0
    for k, members in groups.items():
        o = {n: v[labels["before"]][n].reshape(-1) for n in members}
        d = {n: v[labels["after"]][n].reshape(-1) - o[n] for n in members}
        delta = {n: np.abs(d[n]) for n in members}
        dc = {
            n: np.abs(v[labels["control_after"]][n].reshape(-1) - v[labels["control_before"]][n].reshape(-1))
            for n in members
        }
        pool = members if sigma_over == "universe" else [n for n in every if group_key(n) == k]
        pool_delta = [np.abs(v[labels["after"]][n].reshape(-1) - v[labels["before"]][n].reshape(-1)) for n in pool]
        pool_dc = [
            np.abs(v[labels["control_after"]][n].reshape(-1) - v[labels["control_before"]][n].reshape(-1)) for n in pool
        ]
        sigma = float(np.concatenate(pool_delta).astype(np.float64).std())
        contrast64 = np.concatenate(
            [a.astype(np.float64) - b.astype(np.float64) for a, b in zip(pool_delta, pool_dc, strict=True)]
        )
        sigma_c = float(contrast64.std())
        e = np.zeros(3)
        for n in members:
            dn, de, cat = d[n], delta[n], cats[n]
            all_cats.append(cat)
            d64 = dn.astype(np.float64)
            for c in (OUTSIDE, RETAIN, FORGET):
                e[c] += float((d64[cat == c] ** 2).sum())
            s = scores
            s["raw"].append(de)
            s["qtile"].append(qtile(de, ties))
            s["layernorm"].append(de / sigma if sigma > 0 else np.zeros_like(de))
            s["before_magnitude"].append(np.abs(o[n]))
            if control:
                contrast = de - dc[n]
                mean_dc = float(dc[n].astype(np.float64).mean())
                s["compnorm"].append(de / mean_dc if mean_dc > 0 else de)
                s["contrast"].append(contrast)
                denom = de + dc[n]
                cn = np.zeros_like(de)
                np.divide(contrast, denom, out=cn, where=denom > 1e-12)
                s["contrastnorm"].append(cn)
                s["contrastln"].append(contrast / sigma_c if sigma_c > 0 else np.zeros_like(de))
                s["eratio"].append(de / (dc[n] + EPS))
            if base:
                inj = o[n] - v["base"][n].reshape(-1)
                s["signrev"].append(-(inj * dn))
                s["reversal"].append((np.abs(inj) - np.abs(dn + inj)) / (np.abs(inj) + EPS))
                s["dirreversal"].append(-dn * np.sign(inj) / (np.abs(inj) + EPS))
                s["injection_magnitude"].append(np.abs(inj))
            if len(crossfield) >= 2:
                q = [qtile(np.abs(v[c][n].reshape(-1) - o[n]), ties) for c in crossfield]
                s["crossfield"].append(np.minimum.reduce(q))
        energy[k] = e
        size = sum(cats[n].size for n in members)
        group_rows[k] = slice(row, row + size)
        row += size
    out = {s: np.concatenate(parts) for s, parts in scores.items() if parts}
    for s in out.values():
        assert s.dtype == np.float32
    features = [f for f in COMPOSITE_FEATURES if f in out]
    return Ref(names, groups, group_rows, np.concatenate(all_cats), out, energy, features)


def ref_auc(scores: np.ndarray, cats: np.ndarray, target: str) -> float | None:
    pos, neg = TARGET_CLASSES[target]
    keep = np.isin(cats, pos + neg)
    y = np.isin(cats[keep], pos)
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, scores[keep].astype(np.float64)))


def ref_precision(scores: np.ndarray, cats: np.ndarray, target: str, fraction: float) -> float:
    """Share of positives among the top ceil(f*n) scalars; the tie group straddling the cut counts pro rata."""
    pos, neg = TARGET_CLASSES[target]
    keep = np.isin(cats, pos + neg)
    s, y = scores[keep].astype(np.float64), np.isin(cats[keep], pos)
    k = math.ceil(fraction * s.size)
    cut = np.sort(s)[::-1][k - 1]
    above, at = s > cut, s == cut
    return float((y[above].sum() + (k - above.sum()) * y[at].sum() / at.sum()) / k)


def ref_composite(ref: Ref, target: str, rows: np.ndarray | None = None) -> float | None:
    x = np.stack([ref.scores[f].astype(np.float64) for f in ref.features], axis=1)
    cats = ref.cats
    if rows is not None:
        x, cats = x[rows], cats[rows]
    pos, neg = TARGET_CLASSES[target]
    keep = np.isin(cats, pos + neg)
    y = np.isin(cats[keep], pos)
    if min(int(y.sum()), int((~y).sum())) < 5:
        return None
    model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000))
    proba = cross_val_predict(model, x[keep], y, cv=StratifiedKFold(n_splits=5), method="predict_proba")[:, 1]
    return float(roc_auc_score(y, proba))


def jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


# -- shared runs ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def full_run(request, tmp_path_factory):
    """One bench per dtype scored with every input (base, control, three crossfield runs), many row blocks."""
    dtype = getattr(torch, request.param)
    bench = make_bench(tmp_path_factory.mktemp(f"loc_{request.param}"), seed=11, dtype=dtype)
    result = bench.run(LocalizationConfig(block_elems=50))
    return bench, reference(bench), result


# -- 1. every score against the brute-force reference ---------------------------------------------------------


def test_every_score_and_baseline_matches_brute_force(full_run):
    bench, ref, result = full_run
    assert result["universe"]["names"] == ref.names
    assert result["not_applicable"] == {}
    assert (ref.scores["raw"] == 0).mean() > 0.3  # many unchanged weights: heavy ties at delta = 0
    for target in TARGET_CLASSES:
        for s in SCORES:
            expected = ref_auc(ref.scores[s], ref.cats, target)
            assert result["auc"][target][s] == pytest.approx(expected, abs=1e-9), (target, s)
            assert result["auc_error_bound"][target][s] == 0.0, (target, s)
        for b in BASELINES:
            expected = ref_auc(ref.scores[b], ref.cats, target)
            assert result["baselines"][target][b] == pytest.approx(expected, abs=1e-9), (target, b)
        scored = {s: a for s, a in result["auc"][target].items() if s != "best" and a is not None}
        assert set(scored) == {*SCORES, "composite"}
        best = result["auc"][target]["best"]
        assert best["value"] == max(scored.values()) and scored[best["score"]] == best["value"]


def test_sigma_is_over_every_tensor_of_the_group(full_run):
    """layernorm / contrastln divide by σ over every attention/MLP tensor of the (layer, component) group, as the
    release's first pass does, not over the universe tensors only: layer 0's attention group holds an
    unmasked o_proj, the last layer's a k_proj with retain bits only and a v_proj with forget bits only, none of
    them scored, so the two σs differ there (and the AUCs with them)."""
    bench, ref, result = full_run
    last = max(k[0] for k in ref.groups)
    outside = {f"model.layers.{last}.self_attn.{p}_proj.weight" for p in ("k", "v")}
    outside.add("model.layers.0.self_attn.o_proj.weight")
    assert not outside & set(result["universe"]["names"])
    assert "model.layers.0.self_attn.o_proj.weight" not in bench.packed  # unmasked, yet in its group's σ
    universe_only = reference(bench, sigma_over="universe")
    differs = 0
    for target in TARGET_CLASSES:
        for s in ("layernorm", "contrastln"):
            expected = ref_auc(ref.scores[s], ref.cats, target)
            assert result["auc"][target][s] == pytest.approx(expected, abs=1e-9), (target, s)
            differs += abs(ref_auc(universe_only.scores[s], universe_only.cats, target) - expected) > 1e-6
    assert differs >= 4, "the bench must tell σ over the group from σ over the universe tensors"
    reread = bench.run(LocalizationConfig(block_elems=50, composite=False, group_buffer_scalars=0))
    for target in TARGET_CLASSES:  # the re-read path (groups too large to buffer) takes the same σ
        for s in ("layernorm", "contrastln"):
            assert reread["auc"][target][s] == result["auc"][target][s], (target, s)


def test_ordinal_qtile_ties_are_the_release_ranks(full_run):
    """``qtile_ties="ordinal"``: qtile, crossfield and the per-layer AUCs rank tied |δ| in index order, as the
    release code's stable argsort; the default (average ranks) differs where |δ| ties (40% unchanged here)."""
    bench, ref, result = full_run
    ordinal_ref = reference(bench, ties="ordinal")
    res = bench.run(LocalizationConfig(block_elems=50, composite=False, qtile_ties="ordinal"))
    assert res["settings"]["qtile_ties"] == "ordinal" and result["settings"]["qtile_ties"] == "average"
    for target in TARGET_CLASSES:
        for s in ("qtile", "crossfield"):
            expected = ref_auc(ordinal_ref.scores[s], ref.cats, target)
            assert res["auc"][target][s] == pytest.approx(expected, abs=1e-9), (target, s)
            assert res["auc"][target][s] != pytest.approx(result["auc"][target][s], abs=1e-6), (target, s)
        for s in ("raw", "layernorm", "reversal"):  # the other scores do not rank
            assert res["auc"][target][s] == result["auc"][target][s]
    for r in res["per_layer"]:
        sl = ref.group_rows[(r["layer"], r["component"])]
        for target in TARGET_CLASSES:
            expected = ref_auc(ordinal_ref.scores["qtile"][sl], ref.cats[sl], target)
            assert r["auc"][target] == pytest.approx(expected, abs=1e-9)
    with pytest.raises(ValueError, match="qtile_ties"):
        LocalizationConfig(qtile_ties="dense")


def test_universe_counts_and_exclusions(full_run):
    bench, ref, result = full_run
    u = result["universe"]
    last = "model.layers.2."
    for excluded in (
        last + "self_attn.k_proj.weight",  # retain bits only: no forget positive
        last + "self_attn.v_proj.weight",  # forget bits only: no negative
        "model.embed_tokens.weight",  # masked but not an attention/MLP projection
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.o_proj.weight",  # not masked at all
    ):
        assert excluded in bench.packed or excluded.endswith("o_proj.weight")
        assert excluded not in u["names"]
    assert u["tensors"] == len(ref.names)
    assert u["scalars"] == ref.cats.size
    assert (u["forget"], u["retain"], u["outside"]) == tuple(int((ref.cats == c).sum()) for c in (2, 1, 0))


# -- 2. histogram mode ----------------------------------------------------------------------------------------


def test_histogram_mode_within_reported_error_bound(tmp_path):
    bench = make_bench(tmp_path, seed=5)
    ref = reference(bench)
    cfg = LocalizationConfig(exact_limit=300, bins_bits=8, composite=False)
    result = bench.run(cfg)
    bounds = []
    for target in TARGET_CLASSES:
        for s in SCORES:
            expected = ref_auc(ref.scores[s], ref.cats, target)
            bound = result["auc_error_bound"][target][s]
            bounds.append(bound)
            assert abs(result["auc"][target][s] - expected) <= bound + 1e-12, (target, s, bound)
        # baselines are histogrammed too but report no bound; 8-bit bins keep them within a coarse tolerance
        for b in BASELINES:
            assert result["baselines"][target][b] == pytest.approx(ref_auc(ref.scores[b], ref.cats, target), abs=0.02)
    assert max(bounds) > 0  # the histogram really was used
    assert "composite" not in result["auc"]["forget"] and result["composite"] is None


# -- 3. planted deltas ----------------------------------------------------------------------------------------


def _planted(kind: str):
    def delta(rng: np.random.Generator, cat: np.ndarray, inj: np.ndarray) -> np.ndarray:
        noise = 0.01 + np.abs(rng.standard_normal(cat.size)) * 0.05  # never zero, exact in float32
        if kind == "perfect":
            return np.where(cat == FORGET, noise, 0.0)
        if kind == "inverted":
            return np.where(cat == FORGET, 0.0, noise)
        if kind == "outside_only":
            return np.where(cat == OUTSIDE, noise, 0.0)
        if kind == "random":
            return rng.standard_normal(cat.size) * 0.05
        if kind == "ties":  # three distinct magnitudes, skewed towards forget
            level = rng.integers(0, 3, cat.size) + (cat == FORGET) * (rng.random(cat.size) < 0.3)
            return np.minimum(level, 2) * 0.125 * rng.choice([-1.0, 1.0], cat.size)
        if kind == "zero":
            return np.zeros(cat.size)
        raise AssertionError(kind)

    return delta


BIG = llama_shapes(layers=3, hidden=64, inter=128)


@pytest.fixture(scope="module")
def planted_root(tmp_path_factory):
    return tmp_path_factory.mktemp("planted")


def _planted_run(root: Path, kind: str, **kwargs):
    bench = make_bench(root / kind, seed=3, shapes=BIG, delta=_planted(kind), quantized=kind == "ties")
    cfg = LocalizationConfig(composite=False, **kwargs)
    return bench, reference(bench), bench.run(cfg)


def test_planted_perfect_and_inverted(planted_root):
    _, ref, res = _planted_run(planted_root, "perfect", scores=("raw", "layernorm", "qtile"))
    n = {c: int((ref.cats == c).sum()) for c in (0, 1, 2)}
    assert res["universe"]["scalars"] > 90_000
    for s in ("raw", "layernorm"):
        assert res["auc"]["forget"][s] == 1.0
        assert res["auc"]["forget_vs_retain"][s] == 1.0
        # forget beats outside; retain ties with outside (both unchanged) and counts one half
        assert res["auc"]["unified"][s] == pytest.approx((n[2] + 0.5 * n[1]) / (n[2] + n[1]), abs=1e-12)
    assert res["auc"]["forget"]["qtile"] > 0.95
    assert res["auc"]["forget"]["best"]["value"] == 1.0

    _, ref, res = _planted_run(planted_root, "inverted", scores=("raw", "layernorm"))
    assert res["auc"]["forget"]["raw"] == 0.0 and res["auc"]["forget_vs_retain"]["raw"] == 0.0
    assert res["auc"]["forget"]["layernorm"] == 0.0

    _, ref, res = _planted_run(planted_root, "outside_only", scores=("raw",))
    n = {c: int((ref.cats == c).sum()) for c in (0, 1, 2)}
    assert res["auc"]["unified"]["raw"] == 0.0
    assert res["auc"]["forget"]["raw"] == pytest.approx(0.5 * n[1] / (n[1] + n[0]), abs=1e-12)
    assert res["auc"]["forget_vs_retain"]["raw"] == 0.5


def test_planted_random_is_chance(planted_root):
    _, ref, res = _planted_run(planted_root, "random")
    assert res["universe"]["scalars"] > 90_000
    for target in TARGET_CLASSES:
        # (not crossfield: the bench's per-field runs are biased towards forget scalars)
        for s in ("raw", "qtile", "layernorm", "compnorm", "contrast", "contrastnorm", "eratio"):
            assert abs(res["auc"][target][s] - 0.5) < 0.02, (target, s)


def test_planted_heavy_ties(planted_root):
    _, ref, res = _planted_run(planted_root, "ties")
    assert len(np.unique(ref.scores["raw"])) == 3
    for target in TARGET_CLASSES:
        for s in SCORES:
            assert res["auc"][target][s] == pytest.approx(ref_auc(ref.scores[s], ref.cats, target), abs=1e-9)
        for label, f in FRACTIONS.items():
            expected = ref_precision(ref.scores["raw"], ref.cats, target, f)
            assert res["precision_at_k"][target]["raw"][label] == pytest.approx(expected, abs=1e-12)


def test_planted_zero_delta_gives_one_half(planted_root):
    """after == before, control after == control before, every per-field run == before: nothing moved.

    Every delta-based score is constant (0, or ±0 for signrev/dirreversal) so its AUC is exactly 0.5; qtile and
    crossfield too, since tied |δ| share their average rank (the default). With ``qtile_ties="ordinal"`` (the
    release code's stable argsort) they rank the ties in index order instead, and equal that reference
    (tests/metrics/localization/test_ties.py shows what structured masks make of it)."""
    bench = make_bench(planted_root / "zero", seed=4, shapes=BIG, delta=_planted("zero"))
    labels = {"control_after": "control_before"}
    res = bench.run(LocalizationConfig(composite=False), labels=labels, crossfield=("before", "before", "before"))
    ref = reference(bench, labels=labels, crossfield=("before", "before", "before"))
    assert not ref.scores["raw"].any()
    for target in TARGET_CLASSES:
        for s in SCORES:
            assert res["auc"][target][s] == 0.5, (target, s)
    for row in res["per_layer"]:
        assert row["update_mass"] == {"forget": None, "retain": None, "outside": None}
        assert row["auc"] == {t: 0.5 for t in TARGET_CLASSES}
    ordinal = bench.run(
        LocalizationConfig(composite=False, scores=("qtile", "crossfield"), qtile_ties="ordinal"),
        labels=labels,
        crossfield=("before", "before", "before"),
    )
    assert ordinal["settings"]["qtile_ties"] == "ordinal" and res["settings"]["qtile_ties"] == "average"
    o = {n: bench.values["before"][n].reshape(-1) for n in ref.names}
    for target in TARGET_CLASSES:
        q = np.concatenate([qtile(np.zeros_like(o[n]), "ordinal") for n in ref.names])
        expected = ref_auc(q, ref.cats, target)
        for s in ("qtile", "crossfield"):
            assert ordinal["auc"][target][s] == pytest.approx(expected, abs=1e-9), (target, s)


# -- 4. per-(layer, component) rows ---------------------------------------------------------------------------


def test_per_layer_auc_and_update_mass(full_run):
    bench, ref, result = full_run
    assert result["settings"]["per_layer_score"] == "qtile"
    rows = result["per_layer"]
    assert [(r["layer"], r["component"]) for r in rows] == sorted(ref.groups)
    for r in rows:
        key = (r["layer"], r["component"])
        sl = ref.group_rows[key]
        assert r["tensors"] == ref.groups[key]
        assert r["scalars"] == sl.stop - sl.start
        for target in TARGET_CLASSES:
            expected = ref_auc(ref.scores["qtile"][sl], ref.cats[sl], target)
            assert r["auc"][target] == pytest.approx(expected, abs=1e-9), (key, target)
        e = ref.energy[key]
        mass = r["update_mass"]
        for label, c in (("forget", FORGET), ("retain", RETAIN), ("outside", OUTSIDE)):
            assert mass[label] == pytest.approx(e[c] / e.sum(), rel=1e-9, abs=1e-15), (key, label)
        assert sum(mass.values()) == pytest.approx(1.0, abs=1e-12)


# -- 5. precision@k -------------------------------------------------------------------------------------------


def test_precision_at_k(full_run):
    bench, ref, result = full_run
    for target in TARGET_CLASSES:
        for s in SCORES:
            got = result["precision_at_k"][target][s]
            assert set(got) == set(FRACTIONS)
            for label, f in FRACTIONS.items():
                expected = ref_precision(ref.scores[s], ref.cats, target, f)
                assert got[label] == pytest.approx(expected, abs=1e-12), (target, s, label)


# -- 6. composite ---------------------------------------------------------------------------------------------


def test_composite_matches_sklearn_pipeline(full_run):
    bench, ref, result = full_run
    comp = result["composite"]
    assert comp["features"] == list(COMPOSITE_FEATURES) == ref.features
    assert comp["samples"] == ref.cats.size  # composite_samples (2M default) >= universe: everything
    assert comp["folds"] == 5
    for target in TARGET_CLASSES:
        expected = ref_composite(ref, target)
        assert comp["auc"][target] == pytest.approx(expected, abs=1e-9), target
        assert result["auc"][target]["composite"] == comp["auc"][target]


@pytest.mark.parametrize("threads", [1, 3])
def test_out_of_fold_proba_is_cross_val_predict_bit_for_bit(threads):
    """The composite's pooled fits give exactly sklearn's cross_val_predict, for each problem and any threads."""
    rng = np.random.default_rng(5)
    problems = {}
    for name, n in (("a", 900), ("b", 400)):
        y = rng.random(n) < 0.2
        x = rng.normal(size=(n, 3)) + y[:, None] * np.array([0.8, 0.0, -0.3])
        x[:, 1] = np.round(x[:, 1])  # ties
        problems[name] = (x, y)
    got = out_of_fold_proba(problems, 5, threads)
    assert set(got) == {"a", "b"}
    for name, (x, y) in problems.items():
        model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000))
        expected = cross_val_predict(model, x, y, cv=StratifiedKFold(n_splits=5), method="predict_proba")[:, 1]
        assert np.array_equal(got[name], expected), name


def test_composite_features_follow_available_inputs(tmp_path):
    bench = make_bench(tmp_path, seed=8)
    res = bench.run(LocalizationConfig(composite_samples=10**7), control=False, crossfield=())
    ref = reference(bench, control=False, crossfield=())
    assert res["composite"]["features"] == ref.features == ["raw", "layernorm", "signrev", "reversal", "dirreversal"]
    for target in TARGET_CLASSES:
        assert res["composite"]["auc"][target] == pytest.approx(ref_composite(ref, target), abs=1e-9)


def test_composite_roc_curve_is_stored_for_the_plots(small_bench):
    """roc.png draws the best score's curve; the composite is often the best, so its out-of-fold ROC is stored."""
    res = small_bench.run(LocalizationConfig(composite_samples=10**7), control=False, crossfield=())
    assert "roc" not in res["composite"]  # moved next to the single scores' curves
    for target in TARGET_CLASSES:
        curve = res["roc"][target]["composite"]
        area = float(np.trapezoid(curve["tpr"], curve["fpr"]))
        assert area == pytest.approx(res["auc"][target]["composite"], abs=0.02), target  # thinned to roc_points


def test_composite_subsample_on_planted_perfect(planted_root):
    bench = make_bench(planted_root / "perfect_comp", seed=3, shapes=BIG, delta=_planted("perfect"))
    res = bench.run(LocalizationConfig(composite_samples=20_000))
    comp = res["composite"]
    assert 0 < comp["samples"] <= 20_000 < res["universe"]["scalars"]  # a real subsample (exact size: see below)
    assert comp["auc"]["forget"] > 0.9 and comp["auc"]["forget_vs_retain"] > 0.9
    assert comp["auc"]["forget"] == pytest.approx(res["auc"]["forget"]["raw"], abs=0.01)  # raw is perfect here


# -- 7. released mask.pt --------------------------------------------------------------------------------------


def _save_mask_pt(bench: Bench, path: Path) -> Path:
    """Released layout: every parameter listed, flat int32, all-zero vectors for the frozen ones."""
    flat = {}
    for name, shape in bench.shapes.items():
        packed = bench.packed.get(name, np.zeros(shape, np.int32))
        flat[name] = torch.from_numpy(packed.reshape(-1).copy())
    torch.save(flat, path)
    return path


def test_mask_pt_gives_identical_results(full_run, tmp_path):
    bench, ref, result = full_run
    mask_pt = _save_mask_pt(bench, tmp_path / "mask.pt")
    assert MaskReader(mask_pt).shape("model.layers.0.mlp.up_proj.weight") == (24 * 16,)  # stays flat on disk
    again = bench.run(LocalizationConfig(block_elems=50), masks=mask_pt)
    assert jsonable(again) == jsonable(result)


def test_mask_pt_composite_subsample_size_matches_safetensors(tmp_path):
    """The composite's subsample is N scalars at the same fraction of every universe tensor. A released mask.pt lists
    frozen projections (all-zero vectors) too; they are not in the universe and must not shrink the subsample."""
    bench = make_bench(tmp_path, seed=9)
    mask_pt = _save_mask_pt(bench, tmp_path / "mask.pt")
    cfg = LocalizationConfig(composite_samples=2000)
    a = bench.run(cfg, crossfield=())
    b = bench.run(cfg, crossfield=(), masks=mask_pt)
    assert b["composite"]["samples"] == a["composite"]["samples"]
    assert b["composite"]["auc"] == a["composite"]["auc"]
    assert abs(a["composite"]["samples"] - 2000) <= len(a["universe"]["names"])


# -- 8. error paths -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_bench(tmp_path_factory):
    return make_bench(tmp_path_factory.mktemp("small"), seed=21, shapes=llama_shapes(layers=2, hidden=8, inter=12))


def _masks_file(bench: Bench, path: Path, packed: dict[str, np.ndarray]) -> Path:
    return save_masks(MaskSet({n: torch.from_numpy(p) for n, p in packed.items()}), path)


def _without_stray_bits(bench: Bench, path: Path) -> Path:
    """The bench's masks minus its bit-7 scalars: score_pair refuses a bit beyond num_groups (issue 17)."""
    clean = {n: np.where(p >= 1 << 6, 0, p).astype(np.int32) for n, p in bench.packed.items()}
    return _masks_file(bench, path, clean)


def test_mask_for_missing_tensor(small_bench, tmp_path):
    ghost = "model.layers.7.mlp.up_proj.weight"
    masks = _masks_file(
        small_bench, tmp_path / "m.safetensors", {**small_bench.packed, ghost: np.ones((3, 4), np.int32)}
    )
    with pytest.raises(CheckpointError, match=re.escape(ghost)):
        small_bench.run(masks=masks)


def test_mask_shape_mismatch(small_bench, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    packed = dict(small_bench.packed)
    packed[name] = np.ascontiguousarray(packed[name].T)  # same numel, transposed shape
    masks = _masks_file(small_bench, tmp_path / "m.safetensors", packed)
    with pytest.raises(MaskError, match=re.escape(name) + r".*\(8, 12\).*\(12, 8\)"):
        small_bench.run(masks=masks)
    flat = {n: torch.from_numpy(p.reshape(-1).copy()) for n, p in small_bench.packed.items()}
    flat[name] = flat[name][:-1].clone()  # one scalar short
    torch.save(flat, tmp_path / "mask.pt")
    with pytest.raises(MaskError, match=re.escape(name)):
        small_bench.run(masks=tmp_path / "mask.pt")


def _edited_copy(bench: Bench, dest: Path, edit) -> Path:
    values = {n: v.copy() for n, v in bench.values["after"].items()}
    edit(values)
    save_checkpoint(dest, values, torch.float32)
    return dest


def test_score_pair_missing_tensor_and_shape_mismatch(small_bench, tmp_path):
    gone = "model.layers.1.mlp.down_proj.weight"
    missing = _edited_copy(small_bench, tmp_path / "missing", lambda v: v.pop(gone))
    kw = dict(before=small_bench.paths["before"], masks=small_bench.masks, frag=False, progress=False)
    with pytest.raises(CheckpointError, match=r"after .* lacks 1 tensors: '" + re.escape(gone)):
        score_pair(missing, **kw)
    name = "model.layers.0.self_attn.q_proj.weight"
    reshaped = _edited_copy(small_bench, tmp_path / "reshaped", lambda v: v.update({name: v[name][:4].copy()}))
    with pytest.raises(CheckpointError, match=re.escape(name) + r": before \[8, 8\] vs after \[4, 8\]"):
        score_pair(reshaped, **kw)
    # a missing base is just as loud
    with pytest.raises(CheckpointError, match=r"base .* lacks 1 tensors"):
        score_pair(small_bench.paths["after"], base=missing, **kw)


@pytest.mark.parametrize("name", ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"])
def test_nan_in_after_names_the_tensor(small_bench, tmp_path, name):
    def poison(v):
        v[name].reshape(-1)[3] = np.nan

    after = _edited_copy(small_bench, tmp_path / "nan", poison)
    masks = _without_stray_bits(small_bench, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(name) + ".*NaN"):
        score_pair(after, before=small_bench.paths["before"], masks=masks, frag=False, progress=False)


@pytest.mark.parametrize("threads", [1, 4])
def test_first_bad_block_in_file_order_is_reported(small_bench, tmp_path, threads):
    """Two poisoned tensors, blocks of one row on several workers: the error names the earlier tensor (as a
    sequential read would), the walk does not hang, and no later block's error wins the race."""
    first, later = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"

    def poison(v):
        v[first].reshape(-1)[-1] = np.inf
        v[later].reshape(-1)[0] = np.nan

    after = _edited_copy(small_bench, tmp_path / "bad", poison)
    config = LocalizationConfig(block_elems=1, threads=threads)
    masks = _without_stray_bits(small_bench, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(f"{first}' contains 1 NaN/inf values (rows 7-8)")):
        score_pair(after, before=small_bench.paths["before"], masks=masks, frag=False, progress=False,
                   config=config)  # fmt: skip


@pytest.mark.parametrize("threads", [1, 3])
def test_score_names_the_pair_by_the_fingerprints_its_walk_hashed(small_bench, tmp_path, threads):
    """Masks recording no model: both checkpoints are hashed from the scoring walk's own reads (small blocks on
    several workers), and the manifest holds the same fingerprints as hashing the files."""
    masks = _without_stray_bits(small_bench, tmp_path / "m.safetensors")
    warnings: list[str] = []
    config = LocalizationConfig(block_elems=7, threads=threads, scores=("raw",), composite=False)
    result = score_pair(small_bench.paths["after"], before=small_bench.paths["before"], masks=masks, frag=False,
                        progress=False, null=False, config=config, warn=warnings.append)  # fmt: skip
    inputs = result["manifest"]["inputs"]
    assert list(inputs) == ["before", "after"]
    for label in inputs:
        assert inputs[label]["fingerprint"] == Checkpoint(small_bench.paths[label]).fingerprint()
    assert result["manifest"]["masks_model"]["status"] == "unverified"
    assert len(warnings) == 1 and "records no model fingerprint" in warnings[0]


def test_unknown_score_name(small_bench):
    with pytest.raises(ValueError, match="unknown scores.*bogus"):
        small_bench.run(LocalizationConfig(scores=("raw", "bogus")))


def test_masks_without_any_two_class_tensor(small_bench, tmp_path):
    packed = {}
    for i, (name, p) in enumerate(small_bench.packed.items()):
        packed[name] = np.full(p.shape, 1 << 0 if i % 2 else 1 << 1, np.int32)  # all forget or all retain
    masks = _masks_file(small_bench, tmp_path / "m.safetensors", packed)
    with pytest.raises(MaskError, match="no tensor has both forget and non-forget scalars"):
        small_bench.run(masks=masks)
    masks = _masks_file(small_bench, tmp_path / "norms.safetensors", {"model.norm.weight": np.ones(8, np.int32)})
    with pytest.raises(MaskError, match="no masked attention/MLP tensors"):
        small_bench.run(masks=masks)


# -- 9. subsets and missing inputs ----------------------------------------------------------------------------


def test_raw_only_config(full_run):
    """scores=("raw",) computes raw and the baselines only; per-layer AUCs fall back to raw."""
    bench, ref, _ = full_run
    res = bench.run(LocalizationConfig(scores=("raw",)))
    for target in TARGET_CLASSES:
        assert res["auc"][target]["raw"] == pytest.approx(ref_auc(ref.scores["raw"], ref.cats, target), abs=1e-9)
        assert res["precision_at_k"][target].keys() == {"raw"}
        assert set(res["baselines"][target]) == set(BASELINES)
        for b in BASELINES:
            assert res["baselines"][target][b] == pytest.approx(ref_auc(ref.scores[b], ref.cats, target), abs=1e-9)
    assert res["not_applicable"] == {}
    assert res["settings"]["per_layer_score"] == "raw"
    for r in res["per_layer"]:
        sl = ref.group_rows[(r["layer"], r["component"])]
        for target in TARGET_CLASSES:
            expected = ref_auc(ref.scores["raw"][sl], ref.cats[sl], target)
            assert r["auc"][target] == pytest.approx(expected, abs=1e-9)
    # nothing but raw: no composite (fitted on raw and an unrequested layernorm) competing for "best"
    assert res["composite"] is None
    for target in TARGET_CLASSES:
        assert set(res["auc"][target]) == {"raw", "best"}, target
        assert res["auc"][target]["best"] == {"score": "raw", "value": res["auc"][target]["raw"]}


def test_one_pass_and_threads_do_not_change_results(full_run):
    """raw + qtile needs no group statistic, so it is scored in one pass; the thread count changes nothing."""
    bench, ref, full = full_run
    one = bench.run(LocalizationConfig(scores=("raw", "qtile"), threads=1))
    many = bench.run(LocalizationConfig(scores=("raw", "qtile"), threads=3))
    assert one["settings"]["passes_per_group"] == 1 and full["settings"]["passes_per_group"] == 2
    for key in ("auc", "auc_error_bound", "precision_at_k", "baselines", "per_layer", "universe", "roc"):
        assert one[key] == many[key], key
    for target in TARGET_CLASSES:
        for s in ("raw", "qtile"):
            assert one["auc"][target][s] == full["auc"][target][s], (target, s)
    for a, b in zip(one["per_layer"], full["per_layer"], strict=True):  # full_run sums in 50-scalar blocks
        assert a["update_mass"] == pytest.approx(b["update_mass"], rel=1e-12)
    with pytest.raises(ValueError, match="threads"):
        LocalizationConfig(threads=0)


def test_every_score_and_composite_are_independent_of_threads(full_run):
    """Blocks are scored on worker threads in any order: every number (the two-pass scores with their group σ,
    crossfield, the composite's samples) must come out the same for one thread and for several."""
    bench, _ref, full = full_run  # the default thread count
    one = bench.run(LocalizationConfig(block_elems=50, threads=1))
    many = bench.run(LocalizationConfig(block_elems=50, threads=4))
    for key in ("auc", "auc_error_bound", "precision_at_k", "baselines", "per_layer", "universe", "roc", "composite"):
        assert one[key] == many[key] == full[key], key


def test_buffered_and_reread_groups_score_the_same(full_run):
    """The group-normalised scores (layernorm, compnorm, contrastln, also as composite features) come from the
    group's buffers once its σ is known, or, for groups over ``group_buffer_scalars``, from a second read: the
    same numbers, bit for bit."""
    bench, _ref, buffered = full_run  # the default: every group buffered
    reread = bench.run(LocalizationConfig(block_elems=50, group_buffer_scalars=0))
    groups = len(buffered["per_layer"])
    assert buffered["settings"]["reread_groups"] == 0 and reread["settings"]["reread_groups"] == groups > 0
    for key in ("auc", "auc_error_bound", "precision_at_k", "baselines", "per_layer", "universe", "roc", "composite"):
        assert reread[key] == buffered[key], key


def test_missing_inputs_are_not_applicable(full_run):
    bench, ref, _ = full_run
    res = bench.run(LocalizationConfig(composite=False), base=False, control=False, crossfield=("cf0",))
    absent = {*CONTROL_SCORES, *BASE_SCORES, "crossfield", "injection_magnitude"}
    assert set(res["not_applicable"]) == absent
    assert "--base" in res["not_applicable"]["reversal"] and "--control" in res["not_applicable"]["contrast"]
    for target in TARGET_CLASSES:
        for s in SCORES:
            if s in absent:
                assert res["auc"][target][s] is None
            else:
                assert res["auc"][target][s] == pytest.approx(ref_auc(ref.scores[s], ref.cats, target), abs=1e-9)
        assert res["baselines"][target]["injection_magnitude"] is None
        best = res["auc"][target]["best"]
        present = {s: a for s, a in res["auc"][target].items() if s != "best" and a is not None}
        assert set(present) == {"raw", "qtile", "layernorm"}
        assert best["value"] == max(present.values()) and present[best["score"]] == best["value"]
