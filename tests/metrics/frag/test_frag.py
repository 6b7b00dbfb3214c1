"""Tests for FRAG (docs/definitions.md#frag-score): the FRAG accumulator, streamed scoring of checkpoints, the global
L2 distance baseline, calibration texts from files. Activation norms and FRAG on a real tiny model:
tests/e2e/test_frag_on_tiny_lm.py.

Every metric is checked against a brute-force reference written here independently (explicit loops / numpy).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lacuna_metrics.frag.activations import (
    ActivationStats,
    calibration_texts,
)
from lacuna_metrics.frag.alignment import FragAccumulator, frag_score
from lacuna_metrics.frag.distance import DistanceAccumulator, distance_score
from lacuna_metrics.weights.checkpoints import Checkpoint, CheckpointError

EPS = 1e-6
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# -- brute-force references ---------------------------------------------------------------------------------


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def reference_frag(modules: dict, gamma: float) -> dict:
    """modules: name -> (W, W_unl, x_f, x_r, transposed). Builds F, R, D element by element, then global cosines."""
    f_all, r_all, d_all, per = [], [], [], {}
    for name, (w, wu, xf, xr, transposed) in modules.items():
        w, wu = np.asarray(w, np.float64), np.asarray(wu, np.float64)
        xf, xr = np.asarray(xf, np.float64), np.asarray(xr, np.float64)
        f, r, d = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                c = i if transposed else j  # the input channel of W_ij
                f[i, j] = abs(w[i, j]) * xf[c] / (xr[c] + EPS)
                r[i, j] = abs(w[i, j]) * xr[c] / (xf[c] + EPS)
                d[i, j] = (wu[i, j] - w[i, j]) ** 2
        af, ar = _cos(f.ravel(), d.ravel()), _cos(r.ravel(), d.ravel())
        per[name] = (af, ar, af - gamma * ar)
        f_all.append(f.ravel())
        r_all.append(r.ravel())
        d_all.append(d.ravel())
    f, r, d = np.concatenate(f_all), np.concatenate(r_all), np.concatenate(d_all)
    af, ar = _cos(f, d), _cos(r, d)
    return {"forget_alignment": af, "retain_alignment": ar, "frag": af - gamma * ar, "per_module": per}


def _assert_frag_close(got: dict, want: dict, gamma: float) -> None:
    for key in ("forget_alignment", "retain_alignment", "frag"):
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    assert got["gamma"] == gamma
    assert got["eps"] == EPS
    assert got["modules"] == len(want["per_module"])
    for name, (af, ar, fr) in want["per_module"].items():
        pm = got["per_module"][name]
        assert pm["forget_alignment"] == pytest.approx(af, rel=1e-9, abs=1e-12)
        assert pm["retain_alignment"] == pytest.approx(ar, rel=1e-9, abs=1e-12)
        assert pm["frag"] == pytest.approx(fr, rel=1e-9, abs=1e-12)


def _random_modules(rng: np.random.Generator, transposed: tuple[str, ...] = ()) -> dict:
    shapes = {"l.0.q_proj.weight": (5, 4), "l.0.down_proj.weight": (3, 7), "l.1.up_proj.weight": (8, 4)}
    mods = {}
    for name, shape in shapes.items():
        w = rng.normal(size=shape).astype(np.float32)
        wu = (w + rng.normal(scale=0.1, size=shape) * (rng.random(shape) < 0.6)).astype(np.float32)
        d_in = shape[0] if name in transposed else shape[1]
        xf = rng.random(d_in).astype(np.float32) * 2
        xr = rng.random(d_in).astype(np.float32) * 2
        xr[0] = 0.0  # eps matters
        mods[name] = (w, wu, xf, xr, name in transposed)
    return mods


def _accumulator(mods: dict, gamma: float) -> FragAccumulator:
    return FragAccumulator(
        {n: torch.from_numpy(m[2]) for n, m in mods.items()},
        {n: torch.from_numpy(m[3]) for n, m in mods.items()},
        gamma=gamma,
        conv1d_transposed=[n for n, m in mods.items() if m[4]],
    )


def _feed(acc: FragAccumulator, mods: dict, chunk: int) -> None:
    for name, (w, wu, *_rest) in mods.items():
        for start in range(0, w.shape[0], chunk):
            acc.add(name, torch.from_numpy(w[start : start + chunk]), torch.from_numpy(wu[start : start + chunk]))


# -- FRAG accumulator ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_frag_matches_brute_force(gamma, chunk):
    mods = _random_modules(np.random.default_rng(0))
    acc = _accumulator(mods, gamma)
    _feed(acc, mods, chunk)
    got, want = acc.result(), reference_frag(mods, gamma)
    _assert_frag_close(got, want, gamma)
    assert acc.rows_seen == {n: m[0].shape[0] for n, m in mods.items()}
    assert 0.0 <= got["forget_alignment"] <= 1.0 and 0.0 <= got["retain_alignment"] <= 1.0
    if gamma == 0.0:
        assert got["frag"] == got["forget_alignment"]
    # the global cosine is not the mean of the per-module cosines
    mean_af = np.mean([v["forget_alignment"] for v in got["per_module"].values()])
    assert got["forget_alignment"] != pytest.approx(mean_af, rel=1e-6)


def test_frag_conv1d_transposed_matches_brute_force_and_untransposed():
    rng = np.random.default_rng(1)
    mods = _random_modules(rng, transposed=("l.0.down_proj.weight",))
    acc = _accumulator(mods, 1.0)
    _feed(acc, mods, 2)
    _assert_frag_close(acc.result(), reference_frag(mods, 1.0), 1.0)
    # the same weights stored (d_out, d_in) give the same FRAG
    flipped = {
        n: (w.T.copy(), wu.T.copy(), xf, xr, False) if t else (w, wu, xf, xr, t)
        for n, (w, wu, xf, xr, t) in mods.items()
    }
    acc2 = _accumulator(flipped, 1.0)
    _feed(acc2, flipped, 3)
    assert acc2.result()["frag"] == pytest.approx(acc.result()["frag"], rel=1e-12)


def test_frag_zero_delta_is_zero():
    mods = _random_modules(np.random.default_rng(2))
    mods = {n: (w, w.copy(), xf, xr, t) for n, (w, _wu, xf, xr, t) in mods.items()}
    acc = _accumulator(mods, 1.0)
    _feed(acc, mods, 2)
    res = acc.result()
    assert res["forget_alignment"] == 0.0 and res["retain_alignment"] == 0.0 and res["frag"] == 0.0
    assert all(v["frag"] == 0.0 for v in res["per_module"].values())


def test_frag_partial_zero_delta_module():
    """A module that did not move contributes nothing but is still counted; its own cosines are 0."""
    mods = _random_modules(np.random.default_rng(3))
    name = "l.0.q_proj.weight"
    w, _wu, xf, xr, t = mods[name]
    mods[name] = (w, w.copy(), xf, xr, t)
    acc = _accumulator(mods, 1.0)
    _feed(acc, mods, 4)
    _assert_frag_close(acc.result(), reference_frag(mods, 1.0), 1.0)
    assert acc.result()["per_module"][name]["forget_alignment"] == 0.0


def test_frag_does_not_modify_inputs():
    w = torch.randn(3, 4, dtype=torch.float64)
    keep = w.clone()
    acc = FragAccumulator({"a.weight": torch.ones(4)}, {"a.weight": torch.ones(4)})
    acc.add("a.weight", w, w + 1)
    assert torch.equal(w, keep)


def test_frag_errors_name_the_tensor():
    x = {"a.weight": torch.ones(4)}
    acc = FragAccumulator(x, x)
    with pytest.raises(ValueError, match="'b.weight'.*no activation norms"):
        acc.add("b.weight", torch.zeros(2, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="'a.weight' has 5 input columns.*4 channels"):
        acc.add("a.weight", torch.zeros(2, 5), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="'a.weight': before block"):
        acc.add("a.weight", torch.zeros(2, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="'a.weight' has shape \\[4, 3\\]"):
        acc.check_shape("a.weight", (4, 3))
    with pytest.raises(ValueError, match="no tensors were added"):
        acc.result()
    with pytest.raises(ValueError, match="only forget \\['a.weight'\\]"):
        FragAccumulator(x, {"c.weight": torch.ones(4)})
    with pytest.raises(ValueError, match="tensor 'a.weight': forget norms have 4 channels, retain norms 3"):
        FragAccumulator(x, {"a.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="retain activation norms of 'a.weight'.*negative, NaN"):
        FragAccumulator(x, {"a.weight": torch.tensor([1.0, float("nan"), 1.0, 1.0])})
    t = FragAccumulator(x, x, conv1d_transposed=["a.weight"])
    t.add("a.weight", torch.zeros(3, 7), torch.zeros(3, 7))
    with pytest.raises(ValueError, match="'a.weight' \\(Conv1D.*rows \\[3, 5\\) exceed its 4"):
        t.add("a.weight", torch.zeros(2, 7), torch.zeros(2, 7))
    with pytest.raises(ValueError, match="conv1d_transposed names without activation norms: \\['z'\\]"):
        FragAccumulator(x, x, conv1d_transposed=["z"])


# -- checkpoints: frag_score and distance ---------------------------------------------------------------------


def _save(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Checkpoint:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return Checkpoint(directory)


def _block(proj: str) -> str:
    return "mlp" if proj in ("gate_proj", "up_proj", "down_proj") else "self_attn"


def _toy_state(rng: np.random.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    state = {"model.embed_tokens.weight": torch.from_numpy(rng.normal(size=(11, 6)).astype(np.float32))}
    for layer in range(2):
        for proj in PROJECTIONS:
            d_out, d_in = {"gate_proj": (9, 6), "up_proj": (9, 6), "down_proj": (6, 9)}.get(proj, (6, 6))
            state[f"model.layers.{layer}.{_block(proj)}.{proj}.weight"] = torch.from_numpy(
                rng.normal(size=(d_out, d_in)).astype(np.float32)
            )
        state[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(6)
    state["model.norm.weight"] = torch.ones(6)
    return {k: v.to(dtype) for k, v in state.items()}


def _perturbed(state: dict[str, torch.Tensor], rng: np.random.Generator) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        noise = torch.from_numpy(rng.normal(scale=0.05, size=tuple(v.shape)).astype(np.float32))
        out[k] = (v.float() + noise * (torch.rand(v.shape) < 0.5)).to(v.dtype)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frag_score_streams_checkpoints(tmp_path, dtype):
    rng = np.random.default_rng(4)
    before_state = _toy_state(rng, dtype)
    after_state = _perturbed(before_state, rng)
    before = _save(tmp_path / "before", before_state, {"tie_word_embeddings": False})
    after = _save(tmp_path / "after", after_state, {"tie_word_embeddings": False})
    scored = [n for n in before_state if any(p in n for p in PROJECTIONS)]
    xf = {n: torch.rand(before_state[n].shape[1]) for n in scored}
    xr = {n: torch.rand(before_state[n].shape[1]) for n in scored}
    stats = ActivationStats(xf, xr, fingerprint="sha256:test")
    got = frag_score(before, after, stats, gamma=1.0, block_elems=13)  # several blocks per tensor
    mods = {
        n: (before_state[n].float().numpy(), after_state[n].float().numpy(), xf[n].numpy(), xr[n].numpy(), False)
        for n in scored
    }
    _assert_frag_close(got, reference_frag(mods, 1.0), 1.0)
    assert got["modules"] == 14


def test_frag_score_errors(tmp_path):
    rng = np.random.default_rng(5)
    state = _toy_state(rng, torch.float32)
    before = _save(tmp_path / "b", state, {"tie_word_embeddings": False})
    name = "model.layers.0.self_attn.q_proj.weight"
    short = _save(tmp_path / "a", {k: v for k, v in state.items() if k != name}, {"tie_word_embeddings": False})
    stats = ActivationStats({name: torch.ones(6)}, {name: torch.ones(6)}, fingerprint="x")
    with pytest.raises(CheckpointError, match=f"lacks 1 tensors: '{name}'"):
        frag_score(before, short, stats)
    bad = ActivationStats({name: torch.ones(5)}, {name: torch.ones(5)}, fingerprint="x")
    with pytest.raises(ValueError, match=f"tensor '{name}' has shape \\[6, 6\\].*5 channels"):
        frag_score(before, before, bad)


def reference_distance(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> tuple[float, dict]:
    total, per = 0.0, {}
    for name, w in before.items():
        w64 = w.float().numpy().astype(np.float64)
        d = after[name].float().numpy().astype(np.float64) - w64
        sq = float(np.sum(d * d))
        total += sq
        per[name] = (math.sqrt(sq), math.sqrt(sq) / math.sqrt(float(np.sum(w64 * w64))))
    return math.sqrt(total), per


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_distance_matches_brute_force_and_skips_tied_alias(tmp_path, dtype):
    rng = np.random.default_rng(6)
    before_state = _toy_state(rng, dtype)
    after_state = _perturbed(before_state, rng)
    before = _save(tmp_path / "before", before_state)  # no config: tied by default -> lm_head.weight alias
    after = _save(tmp_path / "after", after_state)
    assert before.is_alias("lm_head.weight")
    got = distance_score(before, after, block_elems=7)
    l2, per = reference_distance(before_state, after_state)
    assert got["l2"] == pytest.approx(l2, rel=1e-12)
    assert got["l2_squared"] == pytest.approx(l2**2, rel=1e-12)
    assert got["tensors"] == len(before_state)  # embeddings and norms included, alias not counted twice
    assert "lm_head.weight" not in got["per_tensor"]
    for name, (t_l2, rel) in per.items():
        assert got["per_tensor"][name]["l2"] == pytest.approx(t_l2, rel=1e-12)
        assert got["per_tensor"][name]["relative"] == pytest.approx(rel, rel=1e-12)
    assert got["per_module"]["model.norm"] == pytest.approx(per["model.norm.weight"][0], rel=1e-12)
    assert got["unshared"] == [] and got["relative_undefined"] == []


def test_distance_relative_edge_cases_and_unshared(tmp_path):
    before = _save(tmp_path / "b", {"z.weight": torch.zeros(2, 2), "s.weight": torch.zeros(3), "only.b": torch.ones(2)})
    after = _save(tmp_path / "a", {"z.weight": torch.ones(2, 2), "s.weight": torch.zeros(3), "only.a": torch.ones(2)})
    got = distance_score(before, after)
    assert got["per_tensor"]["z.weight"] == {"l2": 2.0, "relative": None}
    assert got["per_tensor"]["s.weight"] == {"l2": 0.0, "relative": 0.0}
    assert got["relative_undefined"] == ["z.weight"]
    assert sorted(got["unshared"]) == ["only.a", "only.b"]
    assert got["l2"] == pytest.approx(2.0)


def test_distance_accumulator_blocks_and_errors():
    acc = DistanceAccumulator()
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    acc.add("w", w[:1], w[:1] + 1)
    acc.add("w", w[1:], w[1:] + 1)
    assert acc.rows_seen == {"w": 4}
    assert acc.result()["l2"] == pytest.approx(math.sqrt(12))
    with pytest.raises(ValueError, match="'w': before block \\[1, 3\\] vs after block \\[2, 3\\]"):
        acc.add("w", w[:1], w[:2])
    with pytest.raises(ValueError, match="no tensors were added"):
        DistanceAccumulator().result()


def test_calibration_texts_from_files(tmp_path):
    txt = tmp_path / "cal.txt"
    txt.write_text("first text\n\n  \nsecond text\nthird\n")
    assert calibration_texts(txt, "forget") == ["first text", "second text", "third"]
    assert calibration_texts(txt, "forget", n=2) == ["first text", "second text"]
    jsonl = tmp_path / "cal.jsonl"
    jsonl.write_text(json.dumps({"text": "plain"}) + "\n\n" + json.dumps({"question": "Q1?", "answer": "A1"}) + "\n")
    assert calibration_texts(jsonl, "retain") == ["plain", "Q: Q1?\nA: A1\n"]

    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match=f"calibration file {empty} holds no texts"):
        calibration_texts(empty, "forget")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=f"{bad}:2: malformed JSON"):
        calibration_texts(bad, "forget")
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text(json.dumps({"q": 1}) + "\n")
    with pytest.raises(ValueError, match=f"{nofield}: row 1: expected a string field 'text'"):
        calibration_texts(nofield, "forget")
    other = tmp_path / "cal.csv"
    other.write_text("a\n")
    with pytest.raises(ValueError, match="expected a .jsonl or .txt file"):
        calibration_texts(other, "forget")
