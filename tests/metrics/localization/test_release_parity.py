"""Parity with the authors' localization scoring (LACUNA ``scripts/precision_metrics.py``, docs/release.md "Parity
with precision_metrics.py on CPU").

The authors' script needs ``$SLURM_TMPDIR`` and stages every checkpoint to local disk; lacuna-bench's equivalent is
one ``lacuna score`` call per field and method. Here a tiny model in the release's layout (OLMo2-like names with
``self_attn.q_norm``/``k_norm``, a flat int32 ``mask.pt`` listing every parameter with bit g = group g, the LoRA
block unmasked, ``model.safetensors`` = W_cpt beside ``intruction_tuned/``, an ``unmasked/`` twin and four fields'
runs) is scored through the real ``lacuna score`` command, and every family the authors compute is recomputed here
from their definitions (docs/definitions.md#localization-precision), independently and by brute force: pairwise
Mann-Whitney over every (positive, negative) pair, a per-target universe, ordinal qtile ranks, their 10^6-bin
streaming histogram, their composite pipeline. Where lacuna-bench's definition differs by design, the test asserts
the difference and its size; ``python -m pytest ... -s`` prints the table quoted in docs/release.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import rankdata
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import cross_val_predict
from sklearn.preprocessing import StandardScaler

FIELD_DIRS = ("Email_Address", "Phone_Number", "Birth_City", "Drivers_License")
METHOD = "SimNPO"
SCORED = FIELD_DIRS[0]
TARGET_BITS = {"forget": 0b010101, "unified": 0b111111}  # groups {0, 2, 4}; all six
FAMILIES = ("raw", "qtile", "compnorm", "layernorm", "signrev", "reversal", "dirreversal", "contrast",
            "contrastnorm", "eratio", "contrastln")  # fmt: skip
COMPOSITE_ORDER = ("raw", "layernorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm",
                   "contrastln", "eratio", "compnorm")  # fmt: skip
EPS = np.float32(1e-10)
FRACTIONS = {"0.1%": 0.1, "1%": 1.0, "5%": 5.0, "10%": 10.0}  # percent, as precision_metrics.py loops over them
N_BINS = 1_000_000

# -- a tiny release -----------------------------------------------------------------------------------------------


def olmo2_shapes(layers: int = 4, hidden: int = 16, inter: int = 32, vocab: int = 40) -> dict[str, tuple[int, ...]]:
    """OLMo2's parameter names (q_norm / k_norm inside self_attn, post-norms), small."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in "qkvo":
            shapes[f"{p}self_attn.{proj}_proj.weight"] = (hidden, hidden)
        shapes[p + "self_attn.q_norm.weight"] = (hidden,)
        shapes[p + "self_attn.k_norm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "post_feedforward_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _lora_block(name: str, shapes: dict[str, tuple[int, ...]]) -> bool:
    last = max(int(n.split(".")[2]) for n in shapes if n.startswith("model.layers."))
    return name.startswith(f"model.layers.{last}.") and name.endswith("_proj.weight")


def release_masks(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], edge: bool) -> dict[str, np.ndarray]:
    """Packed bits as the release's masks are: per scalar, group floor(r / 0.08) when below 6, on every parameter
    but norms, embeddings and the LoRA block (lm_head included, as the release's filter keeps it). ``edge``: two
    tensors on which the per-target universes differ (retain bits and no forget bit; every scalar in a group)."""
    packed = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        if "norm" in name or "embed_tokens" in name or _lora_block(name, shapes):
            packed[name] = np.zeros(n, np.int32)
            continue
        g = np.floor(rng.random(n) / 0.08).astype(np.int64)
        packed[name] = np.where(g < 6, 1 << np.minimum(g, 5), 0).astype(np.int32)
    if edge:
        k = packed["model.layers.0.self_attn.k_proj.weight"]
        k[(k & TARGET_BITS["forget"]) != 0] = 0  # retain bits and unmasked scalars only
        v = packed["model.layers.1.self_attn.v_proj.weight"]
        v[:] = 1 << rng.integers(0, 6, v.size)  # every scalar in some group
    return packed


def _bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def _save(path: Path, values: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {n: torch.from_numpy(v.reshape(shapes[n]).copy()).to(torch.bfloat16) for n, v in values.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


@dataclass
class Release:
    """``root/{masked,unmasked}/`` as download_artifacts.py lays them out, plus W_pre under ``root/base``."""

    root: Path
    shapes: dict[str, tuple[int, ...]]
    packed: dict[str, np.ndarray]
    masked: Path = field(init=False)
    unmasked: Path = field(init=False)

    def __post_init__(self) -> None:
        self.masked, self.unmasked = self.root / "OLMo2-1B" / "masked", self.root / "OLMo2-1B" / "unmasked"

    def run(self, regime: Path, f: str) -> Path:
        return regime / "unlearned_models" / f / METHOD

    def weights(self, path: Path) -> dict[str, np.ndarray]:
        file = path if path.suffix == ".safetensors" else path / "model.safetensors"
        return {n: t.float().numpy().ravel() for n, t in load_file(str(file)).items()}


def make_release(root: Path, seed: int, *, edge: bool = False, untouched: bool = True) -> Release:
    """Checkpoints in bf16: W_pre, W_cpt (injection on masked scalars, a small update everywhere else: neutral text),
    W_it (= W_cpt + the LoRA block's update), and per field a SimNPO-like update: larger on forget scalars, 40 % of
    scalars unchanged (ties), norms moved; with ``untouched`` one projection unchanged (AlphaEdit leaves most
    tensors so). The unmasked twin gets untargeted injections and updates."""
    rng = np.random.default_rng(seed)
    shapes = olmo2_shapes()
    packed = release_masks(rng, shapes, edge)
    rel = Release(root, shapes, packed)
    torch.save({n: torch.from_numpy(p.copy()) for n, p in packed.items()}, _mkdir(rel.masked) / "mask.pt")
    pre, cpt, it, ucpt, uit = {}, {}, {}, {}, {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        neutral = 0.0 if "embed_tokens" in name else rng.standard_normal(n) * 0.002
        pre[name] = _bf16(rng.standard_normal(n) * 0.05)
        cpt[name] = _bf16(pre[name] + np.where(packed[name] != 0, rng.standard_normal(n) * 0.02, 0.0) + neutral)
        ucpt[name] = _bf16(pre[name] + (0.0 if "embed_tokens" in name else rng.standard_normal(n) * 0.01))
        lora = rng.standard_normal(n) * 0.01 if _lora_block(name, shapes) else 0.0
        it[name], uit[name] = _bf16(cpt[name] + lora), _bf16(ucpt[name] + lora)
    _save(rel.root / "base" / "model.safetensors", pre, shapes)
    _save(rel.masked / "model.safetensors", cpt, shapes)
    _save(rel.masked / "intruction_tuned" / "model.safetensors", it, shapes)
    _save(rel.unmasked / "intruction_tuned" / "model.safetensors", uit, shapes)
    for f in FIELD_DIRS:
        unl, uunl = {}, {}
        for name, shape in shapes.items():
            n = math.prod(shape)
            forget = (packed[name] & TARGET_BITS["forget"]) != 0
            d = rng.standard_normal(n) * np.where(forget, 0.02, 0.008)
            d[rng.random(n) < 0.4] = 0.0
            du = rng.standard_normal(n) * 0.01
            du[rng.random(n) < 0.3] = 0.0
            if "embed_tokens" in name or (untouched and name == "model.layers.1.self_attn.k_proj.weight"):
                d = np.zeros(n)
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                d = rng.standard_normal(n) * 0.2  # norms move far more than the projections here
            unl[name], uunl[name] = _bf16(it[name] + d), _bf16(uit[name] + du)
        _save(rel.run(rel.masked, f) / "model.safetensors", unl, shapes)
        _save(rel.run(rel.unmasked, f) / "model.safetensors", uunl, shapes)
    return rel


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the authors' definitions, recomputed -------------------------------------------------------------------------


def authors_component(name: str) -> tuple[int, str]:
    """(layer, component) by the release's name rules: inside a block, 'self_attn' is read before 'norm', so
    OLMo2's q_norm/k_norm count as attention; outside, embeddings, lm_head and the rest."""
    if "layers." in name:
        parts = name.split(".")
        layer = int(parts[parts.index("layers") + 1])
        for marker, comp in (("self_attn", "attention"), ("mlp", "mlp"), ("norm", "norm")):
            if marker in name:
                return layer, comp
        return layer, "other"
    return -1, "embedding" if "embed" in name else "lm_head" if "lm_head" in name else "other"


def ordinal_qtile(x: np.ndarray) -> np.ndarray:
    """Rank / (n − 1), ties in index order (a stable sort), as float32."""
    ranks = np.empty(x.size, np.float64)
    ranks[np.argsort(x, kind="stable")] = np.arange(x.size)
    return (ranks / max(1, x.size - 1)).astype(np.float32)


def _pop_std(arrays: list[np.ndarray]) -> float:
    x = np.concatenate(arrays).astype(np.float64)
    return max(math.sqrt(max(float((x * x).mean() - x.mean() ** 2), 0.0)), 1e-12)


@dataclass
class Reference:
    names: list[str]  # the target's universe, in the order the authors stream it
    labels: list[np.ndarray]
    scores: dict[str, list[np.ndarray]]  # family -> one float32 array per tensor
    groups: list[tuple[int, str]]


def authors_reference(rel: Release, target: str, *, reference: str = "cpt", norms_in_sigma: bool = True) -> Reference:
    """Every family of precision_metrics.py for ``target`` (forget or unified) on the scored field's run.

    ``reference``: the checkpoint of inj = W_it − p (``cpt``: the release's ``<regime>/model.safetensors``;
    ``pre``: W_pre). ``norms_in_sigma=False`` leaves q_norm/k_norm out of the σ pools (lacuna-bench's groups)."""
    it = rel.weights(rel.masked / "intruction_tuned")
    unl = rel.weights(rel.run(rel.masked, SCORED))
    ref = rel.weights(rel.masked / "model.safetensors" if reference == "cpt" else rel.root / "base")
    uit = rel.weights(rel.unmasked / "intruction_tuned")
    uunl = rel.weights(rel.run(rel.unmasked, SCORED))
    fields = [rel.weights(rel.run(rel.masked, f)) for f in FIELD_DIRS]
    names = sorted(set(rel.packed) & set(it))
    kept = [n for n in names if authors_component(n)[1] not in ("norm", "embedding", "lm_head")]
    if not norms_in_sigma:
        kept = [n for n in kept if "norm" not in n]
    delta = {n: np.abs(unl[n] - it[n]) for n in kept}
    control = {n: np.abs(uunl[n] - uit[n]) for n in kept}
    pools: dict[tuple[int, str], list[str]] = {}
    for n in kept:
        pools.setdefault(authors_component(n), []).append(n)
    sigma = {g: _pop_std([delta[n] for n in members]) for g, members in pools.items()}
    sigma_c = {g: _pop_std([delta[n] - control[n] for n in members]) for g, members in pools.items()}
    bits = TARGET_BITS[target]
    out = Reference([], [], {f: [] for f in (*FAMILIES, "crossfield")}, [])
    for n in kept:
        y = (rel.packed[n] & bits) != 0
        if not (y.any() and not y.all()):
            continue
        g = authors_component(n)
        diff, de, dc = unl[n] - it[n], delta[n], control[n]
        inj = it[n] - ref[n]
        mean_dc = float(dc.astype(np.float64).mean())
        s = out.scores
        s["raw"].append(de)
        s["qtile"].append(ordinal_qtile(de))
        s["layernorm"].append(de / np.float32(sigma[g]))
        s["compnorm"].append(de / np.float32(mean_dc) if mean_dc > 1e-12 else de)
        s["signrev"].append(-(inj * diff))
        s["reversal"].append((np.abs(inj) - np.abs(diff + inj)) / (np.abs(inj) + EPS))
        s["dirreversal"].append(-(diff * np.sign(inj)) / (np.abs(inj) + EPS))
        s["contrast"].append(de - dc)
        cn = np.zeros_like(de)
        np.divide(de - dc, de + dc, out=cn, where=(de + dc) > 1e-12)
        s["contrastnorm"].append(cn)
        s["eratio"].append(de / (dc + EPS))
        s["contrastln"].append((de - dc) / np.float32(sigma_c[g]))
        s["crossfield"].append(np.minimum.reduce([ordinal_qtile(np.abs(run[n] - it[n])) for run in fields]))
        out.names.append(n)
        out.labels.append(y)
        out.groups.append(g)
    return out


def mann_whitney(scores: np.ndarray, labels: np.ndarray) -> float:
    """Brute force: the share of (positive, negative) pairs the positive wins, ties one half."""
    pos, neg = scores[labels].astype(np.float64), scores[~labels].astype(np.float64)
    wins = 0.0
    for start in range(0, pos.size, 512):
        block = pos[start : start + 512, None]
        wins += float((block > neg).sum()) + 0.5 * float((block == neg).sum())
    return wins / (pos.size * neg.size)


def authors_histogram_auc(
    chunks: list[np.ndarray], labels: list[np.ndarray], n_bins: int = N_BINS, *, middle_bin: bool = True
) -> float:
    """The AUC the authors' streaming histogram gives: each tensor's scores are binned linearly over the range seen
    so far (float32 arithmetic, truncated to a bin); a wider range re-bins the counts by their old bin centres; a
    tensor whose scores are all equal goes to the middle bin (``middle_bin=False``: binned like the others, to
    tell the two effects apart). Ties within a bin count one half."""
    pos, neg = np.zeros(n_bins, np.int64), np.zeros(n_bins, np.int64)
    lo = hi = None
    for s, y in zip(chunks, labels, strict=True):
        low, high = float(s.min()), float(s.max())
        if low == high and lo is None:
            lo, hi = low - 0.5, low + 0.5
        if low == high and middle_bin:
            pos[n_bins // 2] += int(y.sum())
            neg[n_bins // 2] += int((~y).sum())
            continue
        if lo is None:
            lo, hi = low, high
        elif low < lo or high > hi:
            new_lo, new_hi = min(low, lo), max(high, hi)
            centres = np.linspace(lo, hi, n_bins)
            moved = np.clip(((centres - new_lo) / (new_hi - new_lo) * (n_bins - 1)).astype(np.int32), 0, n_bins - 1)
            pos, neg = (
                np.bincount(moved, pos, n_bins).astype(np.int64),
                np.bincount(moved, neg, n_bins).astype(np.int64),
            )
            lo, hi = new_lo, new_hi
        scale = np.float32(hi - lo)
        b = np.clip(((s - np.float32(lo)) / scale * np.float32(n_bins - 1)).astype(np.int32), 0, n_bins - 1)
        pos += np.bincount(b[y], minlength=n_bins)
        neg += np.bincount(b[~y], minlength=n_bins)
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))


def top_share(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Share of positives among the k highest scores, the tie group at the cut counted pro rata."""
    s = scores.astype(np.float64)
    cut = np.sort(s)[::-1][k - 1]
    above, at = s > cut, s == cut
    return float((labels[above].sum() + (k - above.sum()) * labels[at].mean()) / k)


def authors_composite(ref: Reference) -> float:
    """Their pipeline: every tensor's rows in a RandomState(42) permutation (the 2M subsample is everything here),
    one StandardScaler over all rows, then 5-fold cross_val_predict of LogisticRegression(C=1, lbfgs)."""
    rs = np.random.RandomState(42)
    total = sum(y.size for y in ref.labels)
    frac = min(1.0, 2_000_000 / total)
    rows, ys = [], []
    for i, y in enumerate(ref.labels):
        x = np.column_stack([ref.scores[f][i] for f in COMPOSITE_ORDER])
        pick = rs.choice(y.size, max(1, int(y.size * frac)), replace=False)
        rows.append(x[pick])
        ys.append(y[pick].astype(np.float32))
    x, y = StandardScaler().fit_transform(np.concatenate(rows)), np.concatenate(ys)
    model = LogisticRegression(max_iter=1000, solver="lbfgs", C=1.0)
    proba = cross_val_predict(model, x, y, cv=5, method="predict_proba")[:, 1]
    return float(roc_auc_score(y, proba))


# -- lacuna-bench through `lacuna score` -------------------------------------------------------------------------


def lacuna_score(rel: Release, out: Path, *, base: Path | None = None, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The documented CPU equivalent of precision_metrics.py for one field and method (docs/release.md)."""
    from lacuna_unlearn.bench.cli.main import main

    crossfield = [str(rel.run(rel.masked, f)) for f in FIELD_DIRS]
    argv = [
        "score", "--quiet",
        "--before", str(rel.masked / "intruction_tuned"),
        "--after", str(rel.run(rel.masked, SCORED)),
        "--masks", str(rel.masked / "mask.pt"),
        "--base", str(base or rel.masked / "model.safetensors"),
        "--control-before", str(rel.unmasked / "intruction_tuned"),
        "--control-after", str(rel.run(rel.unmasked, SCORED)),
        "--crossfield", *crossfield,
        "--qtile-ties", "ordinal",
        "--no-frag", "--no-null",
        "--out", str(out), "--lacuna-files", str(out / "precision_metrics" / "{target}" / SCORED / METHOD),
        *extra,
    ]  # fmt: skip
    assert main(argv) == 0
    return json.loads((out / "score.json").read_text())


def lacuna_file(out: str | Path, target: str, name: str = "metrics.json") -> dict[str, Any]:
    """A file ``lacuna score --lacuna-files OUT/precision_metrics/{target}/F/M`` wrote (LACUNA's layout)."""
    return json.loads((Path(out) / "precision_metrics" / target / SCORED / METHOD / name).read_text())


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Release:
    return make_release(tmp_path_factory.mktemp("release"), seed=5)


@pytest.fixture(scope="module")
def scored(release, tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("score")
    return {**lacuna_score(release, out), "_out": str(out)}


@pytest.fixture(scope="module")
def references(release) -> dict[str, Reference]:
    return {t: authors_reference(release, t) for t in TARGET_BITS}


@pytest.fixture(scope="module")
def norm_free(release) -> dict[str, Reference]:
    """The authors' definitions with lacuna-bench's σ pools (no q_norm/k_norm): the σ difference taken out."""
    return {t: authors_reference(release, t, norms_in_sigma=False) for t in TARGET_BITS}


# -- 1. the families that match -----------------------------------------------------------------------------------

EXACT = ("raw", "qtile", "compnorm", "signrev", "reversal", "dirreversal", "contrast", "contrastnorm", "eratio",
         "crossfield")  # fmt: skip


def test_families_match_the_authors_definitions_exactly(scored, references):
    """With --qtile-ties ordinal, the release's W_cpt as --base and the four fields' runs as --crossfield, every
    family but the σ-normalised two equals the authors' definition as an exact Mann-Whitney AUC."""
    assert scored["universe"]["names"] == references["forget"].names
    for target, ref in references.items():
        y = np.concatenate(ref.labels)
        for family in EXACT:
            expected = mann_whitney(np.concatenate(ref.scores[family]), y)
            assert scored["auc"][target][family] == pytest.approx(expected, abs=1e-12), (target, family)
    # the reference checkpoint of the release is W_cpt: inj = 0 in every scored tensor, the family is degenerate
    for target in TARGET_BITS:
        assert scored["auc"][target]["signrev"] == scored["auc"][target]["dirreversal"] == 0.5
        assert scored["auc"][target]["reversal"] == pytest.approx(1 - scored["auc"][target]["raw"], abs=1e-12)


def test_reversal_family_with_the_pretrained_reference(release, tmp_path):
    """lacuna-bench's default reference (the testbed's base/, W_pre) gives the same formulas a real injection."""
    scores = ("--scores", "raw,signrev,reversal,dirreversal", "--composite-samples", "0")
    got = lacuna_score(release, tmp_path / "pre", base=release.root / "base", extra=scores)
    for target in TARGET_BITS:
        ref = authors_reference(release, target, reference="pre")
        y = np.concatenate(ref.labels)
        for family in ("signrev", "reversal", "dirreversal"):
            expected = mann_whitney(np.concatenate(ref.scores[family]), y)
            assert got["auc"][target][family] == pytest.approx(expected, abs=1e-12), (target, family)
        assert got["auc"][target]["signrev"] != 0.5


def test_per_layer_aucs_and_their_keys(scored, references):
    """layer_aucs: per (layer, component) the ordinal qtile AUC over the target's universe, keyed like the authors."""
    for target, ref in references.items():
        written = lacuna_file(scored["_out"], target)
        expected = {}
        for g in dict.fromkeys(ref.groups):
            rows = [i for i, h in enumerate(ref.groups) if h == g]
            q = np.concatenate([ref.scores["qtile"][i] for i in rows])
            expected[f"{g[0]}_{g[1]}"] = mann_whitney(q, np.concatenate([ref.labels[i] for i in rows]))
        assert written["layer_aucs"].keys() == expected.keys()
        for key, value in expected.items():
            assert written["layer_aucs"][key] == pytest.approx(value, abs=1e-12), (target, key)


# -- 2. the differences by design, measured -----------------------------------------------------------------------


def test_sigma_pools_differ_by_olmo2_qk_norms(scored, references, norm_free):
    """layernorm / contrastln: the authors' attention σ also pools q_norm/k_norm; without them it is lacuna-bench's.
    Here the norms are 3% of a layer's attention scalars and move 10x more than the projections; in OLMo2-1B they
    are 0.02% of it."""
    for target in TARGET_BITS:
        without = norm_free[target]
        y = np.concatenate(without.labels)
        for family in ("layernorm", "contrastln"):
            ours = scored["auc"][target][family]
            assert ours == pytest.approx(mann_whitney(np.concatenate(without.scores[family]), y), abs=1e-12)
            theirs = mann_whitney(np.concatenate(references[target].scores[family]), y)
            PARITY.setdefault("sigma", {})[(target, family)] = ours - theirs
            assert 0 < abs(ours - theirs) < 0.05, (target, family, ours, theirs)


def average_qtile(x: np.ndarray) -> np.ndarray:
    """lacuna-bench's default qtile: tied values share their average rank."""
    return ((rankdata(x, method="average") - 1) / max(1, x.size - 1)).astype(np.float32)


def test_average_ties_differ_from_the_authors_index_order(release, references, tmp_path):
    """Without --qtile-ties ordinal (lacuna-bench's default, and lacuna run's), tied |δ| share their average rank:
    qtile, crossfield and the per-layer AUCs then differ from the authors' by the tie rule alone (40% of |δ| are
    zero here, one bf16 tie group per tensor)."""
    argv = ("--qtile-ties", "average", "--scores", "qtile,crossfield", "--composite-samples", "0")
    got = lacuna_score(release, tmp_path / "average", extra=argv)
    it = release.weights(release.masked / "intruction_tuned")
    runs = [release.weights(release.run(release.masked, f)) for f in FIELD_DIRS]
    for target, ref in references.items():
        y = np.concatenate(ref.labels)
        cross = [np.minimum.reduce([average_qtile(np.abs(r[n] - it[n])) for r in runs]) for n in ref.names]
        averaged = {"qtile": [average_qtile(d) for d in ref.scores["raw"]], "crossfield": cross}
        for family in ("qtile", "crossfield"):
            ours = got["auc"][target][family]
            assert ours == pytest.approx(mann_whitney(np.concatenate(averaged[family]), y), abs=1e-12)
            PARITY.setdefault("ties", {})[(target, family)] = ours - mann_whitney(np.concatenate(ref.scores[family]), y)
            assert abs(PARITY["ties"][target, family]) > 1e-4, (target, family)


def test_the_authors_histogram_against_exact_auc(references):
    """The authors' 10^6-bin streaming histogram against the exact statistic lacuna-bench reports. Two effects:
    an unchanged tensor (here one k_proj; AlphaEdit leaves most tensors so) has constant raw / compnorm /
    layernorm / reversal / eratio scores, which go to the middle bin whatever their value, above every small
    nonzero change; and eratio's few huge values (δ / 1e-10 where the control did not move) stretch the bins so
    far that all the others share a few. The families without either agree to 1e-3."""
    for target, ref in references.items():
        y = np.concatenate(ref.labels)
        for family in (*FAMILIES, "crossfield"):
            exact = mann_whitney(np.concatenate(ref.scores[family]), y)
            binned = authors_histogram_auc(ref.scores[family], ref.labels)
            PARITY.setdefault("histogram", {})[(target, family)] = binned - exact
            flat = authors_histogram_auc(ref.scores[family], ref.labels, middle_bin=False) - exact
            PARITY.setdefault("histogram_without_middle_bin", {})[(target, family)] = flat
    deviation, flat = PARITY["histogram"], PARITY["histogram_without_middle_bin"]
    for target in TARGET_BITS:
        for family in ("qtile", "contrast", "contrastnorm", "contrastln", "crossfield", "signrev", "dirreversal"):
            assert abs(deviation[target, family]) < 1e-3, (target, family)
        for family in ("raw", "compnorm", "layernorm", "reversal"):
            assert abs(flat[target, family]) < 1e-4, (target, family)  # the middle bin is the whole difference
        assert abs(flat[target, "eratio"]) > 1e-2  # the stretched range
    for family in ("raw", "compnorm", "layernorm", "reversal"):
        assert abs(deviation["forget", family]) > 1e-3, family


def test_precision_at_k_differs_by_the_rounding_of_k(scored, norm_free):
    """p@k: lacuna-bench's k = ceil(f·n) equals the brute-force share to 1e-12; the authors' k = max(1, floor(f·n))
    differs by at most 1/k, and not at all where f·n is whole (σ pools as lacuna-bench's, so only k differs)."""
    for target, ref in norm_free.items():
        y = np.concatenate(ref.labels)
        n = y.size
        for family in (*FAMILIES, "crossfield"):
            s = np.concatenate(ref.scores[family])
            for label, pct in FRACTIONS.items():
                ours = scored["precision_at_k"][target][family][label]
                k_ceil, k_floor = math.ceil(round(n * pct / 100, 9)), max(1, int(n * pct / 100))
                assert ours == pytest.approx(top_share(s, y, k_ceil), abs=1e-12), (target, family, label)
                theirs = top_share(s, y, k_floor)
                PARITY.setdefault("p_at_k", {})[(target, family, label)] = ours - theirs
                assert abs(ours - theirs) <= 1 / k_floor + 1e-12
                if k_ceil == k_floor:
                    assert ours == pytest.approx(theirs, abs=1e-12)


def test_composite_differs_by_its_fit(scored, references):
    """The authors standardise before the folds and permute each tensor's rows; lacuna-bench standardises inside
    each fold, rows in tensor order. Same features, same model: close, not equal."""
    for target, ref in references.items():
        theirs = authors_composite(ref)
        ours = scored["auc"][target]["composite"]
        PARITY.setdefault("composite", {})[target] = ours - theirs
        assert abs(ours - theirs) < 0.02, (target, ours, theirs)


def test_universe_per_target(tmp_path):
    """On masks where one tensor holds retain bits but no forget bit and another has every scalar in a group, the
    authors' per-target universes differ from lacuna-bench's single one for `unified`; `forget` still matches."""
    rel = make_release(tmp_path / "edge", seed=6, edge=True)
    got = lacuna_score(rel, tmp_path / "out", extra=("--scores", "raw,qtile", "--composite-samples", "0"))
    for target in TARGET_BITS:
        ref = authors_reference(rel, target)
        y = np.concatenate(ref.labels)
        for family in ("raw", "qtile"):
            theirs = mann_whitney(np.concatenate(ref.scores[family]), y)
            PARITY.setdefault("universe", {})[(target, family)] = got["auc"][target][family] - theirs
    assert "model.layers.0.self_attn.k_proj.weight" not in got["universe"]["names"]
    assert "model.layers.1.self_attn.v_proj.weight" in got["universe"]["names"]
    for family in ("raw", "qtile"):
        assert PARITY["universe"]["forget", family] == pytest.approx(0.0, abs=1e-12)
        assert abs(PARITY["universe"]["unified", family]) > 1e-4


# -- 3. the LACUNA-named files the command wrote ------------------------------------------------------------------


def test_lacuna_files_hold_the_score_in_the_authors_keys(scored):
    from lacuna_unlearn.bench.report.lacuna_keys import LACUNA_FAMILIES

    for target in TARGET_BITS:
        written = lacuna_file(scored["_out"], target)
        provenance = lacuna_file(scored["_out"], target, "metrics.provenance.json")
        for family in LACUNA_FAMILIES:
            assert written[f"auc_{family}"] == scored["auc"][target][family]
        assert "pk_composite" not in written and "pk_composite" in provenance["absent"]
        assert written["pk_raw"] == {f"p@{k}": v for k, v in scored["precision_at_k"][target]["raw"].items()}
        assert provenance["localization_settings"]["qtile_ties"] == "ordinal"
        assert provenance["schema"]["name"] == "lacuna-bench/lacuna-files"


#: Differences measured above, printed at the end of the module (`-s`) for docs/release.md.
PARITY: dict[str, dict[Any, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_parity():
    yield
    for kind, values in PARITY.items():
        worst = max(values.items(), key=lambda kv: abs(kv[1]))
        print(f"\n{kind}: max |Δ| = {abs(worst[1]):.2e} at {worst[0]}")
        for key, value in values.items():
            if kind != "p_at_k" or abs(value) > 0:
                print(f"  {key}: {value:+.6f}")
