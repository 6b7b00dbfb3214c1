"""Tests for FRAG (docs/definitions.md#frag-score): activation norms, the FRAG accumulator, the global L2 distance
baseline.

Every metric is checked against a brute-force reference written here independently (explicit loops / numpy).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lacuna_metrics.frag.activations import (
    ActivationStats,
    activation_stats,
    calibration_texts,
    collect_input_norms,
    linear_weight_names,
    transposed_weight_names,
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


def reference_norms(
    model: torch.nn.Module, tokenizer, texts: list[str], modules: dict[str, torch.nn.Module], max_length
):
    """x_j = mean over texts of sqrt(sum_t X_tj^2), with our own forward hooks and explicit loops over j."""
    captured: dict[str, list[np.ndarray]] = {n: [] for n in modules}
    handles = [
        m.register_forward_hook(lambda mod, inp, out, n=n: captured[n].append(inp[0][0].detach().double().numpy()))
        for n, m in modules.items()
    ]
    try:
        with torch.no_grad():
            for text in texts:
                enc = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
                model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    finally:
        for h in handles:
            h.remove()
    out = {}
    for name, xs in captured.items():
        assert len(xs) == len(texts)
        d_in = xs[0].shape[1]
        acc = np.zeros(d_in)
        for x in xs:
            for j in range(d_in):
                acc[j] += math.sqrt(sum(float(v) ** 2 for v in x[:, j]))
        out[f"{name}.weight"] = acc / len(texts)
    return out


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


# -- activation norms on a real tiny model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_lacuna):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir, local_files_only=True, dtype=torch.float32)
    model.eval()
    forget = calibration_texts(tiny_lacuna.data_dir, "forget", n=4)
    retain = calibration_texts(tiny_lacuna.data_dir, "retain", n=4)
    return tiny_lacuna, tok, model, forget, retain


def test_linear_weight_names_targets(tiny):
    _, _, model, _, _ = tiny
    names = linear_weight_names(model)
    assert len(names) == 2 * 7
    assert names["model.layers.0.self_attn.q_proj"] == "model.layers.0.self_attn.q_proj.weight"
    assert set(linear_weight_names(model, "mlp").values()) == {
        f"model.layers.{i}.mlp.{p}.weight" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")
    }
    assert linear_weight_names(model, "linear") == names  # lm_head excluded
    assert transposed_weight_names(model) == set()
    with pytest.raises(ValueError, match="unknown target 'attn'"):
        linear_weight_names(model, "attn")


def test_collect_input_norms_matches_brute_force(tiny):
    _, tok, model, forget, _ = tiny
    texts = forget[:3]
    assert len(tok(texts[0])["input_ids"]) > 12  # truncation below is exercised
    got = collect_input_norms(model, tok, texts, max_length=12, dtype=torch.float32)
    modules = {n: model.get_submodule(n) for n in linear_weight_names(model)}
    want = reference_norms(model, tok, texts, modules, max_length=12)
    assert set(got) == set(want)
    for name, vec in got.items():
        assert vec.dtype == torch.float32
        assert vec.shape == (model.get_parameter(name).shape[1],)
        np.testing.assert_allclose(vec.numpy(), want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_collect_input_norms_errors(tiny):
    _, tok, model, _, _ = tiny
    with pytest.raises(ValueError, match="no calibration texts"):
        collect_input_norms(model, tok, [], dtype=torch.float32)
    with pytest.raises(ValueError, match="calibration text #1 is int"):
        collect_input_norms(model, tok, ["a", 3], dtype=torch.float32)


def test_gpt2_conv1d_is_scored_transposed(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tok, _, forget, _ = tiny
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=64)).eval()
    names = linear_weight_names(model, "linear")
    assert set(names) == {f"transformer.h.0.{m}" for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert linear_weight_names(model) == names  # the default target finds GPT-2's Conv1D projections too
    assert transposed_weight_names(model, "linear") == set(names.values()) == transposed_weight_names(model)
    got = collect_input_norms(model, tok, forget[:2], target="linear", max_length=20, dtype=torch.float32)
    want = reference_norms(model, tok, forget[:2], {n: model.get_submodule(n) for n in names}, max_length=20)
    for name, vec in got.items():
        assert vec.shape == (model.get_parameter(name).shape[0],)  # Conv1D weight is (d_in, d_out)
        np.testing.assert_allclose(vec.numpy(), want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_activation_stats_cache(tiny, tmp_path, monkeypatch):
    lac, tok, model, forget, retain = tiny
    cache = tmp_path / "cache"
    first = activation_stats(lac.model_dir, forget, retain, cache_dir=cache, max_length=32, dtype=torch.float32)
    assert not first.cached and first.fingerprint.startswith("sha256:")
    direct = collect_input_norms(model, tok, forget, max_length=32, dtype=torch.float32)
    for name, vec in direct.items():
        torch.testing.assert_close(first.forget[name], vec)
    files = list(cache.iterdir())
    assert [f.name for f in files] == [first.fingerprint.removeprefix("sha256:") + ".safetensors"]
    with safe_open(str(files[0]), framework="pt") as fh:
        keys = set(fh.keys())
        assert fh.metadata()["fingerprint"] == first.fingerprint
    assert keys == {f"forget/{n}" for n in first.forget} | {f"retain/{n}" for n in first.retain}

    import transformers

    def no_load(*args, **kwargs):
        raise AssertionError("a cache hit must not load the model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    second = activation_stats(lac.model_dir, forget, retain, cache_dir=cache, max_length=32, dtype=torch.float32)
    assert second.cached and second.fingerprint == first.fingerprint
    for side in ("forget", "retain"):
        a, b = getattr(first, side), getattr(second, side)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    monkeypatch.undo()

    other = activation_stats(lac.model_dir, forget[:3], retain, cache_dir=cache, max_length=32, dtype=torch.float32)
    assert not other.cached and other.fingerprint != first.fingerprint
    assert len(list(cache.iterdir())) == 2
    mlp = activation_stats(
        lac.model_dir, forget, retain, cache_dir=cache, target="mlp", max_length=32, dtype=torch.float32
    )
    assert mlp.fingerprint not in (first.fingerprint, other.fingerprint) and len(mlp.forget) == 6
    for name, vec in mlp.forget.items():
        torch.testing.assert_close(vec, first.forget[name])

    # a corrupt cache file is ignored (with a warning) and rewritten
    files[0].write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="ignoring unreadable activation cache"):
        again = activation_stats(lac.model_dir, forget, retain, cache_dir=cache, max_length=32, dtype=torch.float32)
    assert not again.cached and again.fingerprint == first.fingerprint
    assert not [f for f in os.listdir(cache) if f.startswith(".tmp")]


def test_activation_stats_default_bf16_and_frag_end_to_end(tiny, tmp_path):
    """The bf16 pass stays close to float32; FRAG of a perturbed copy of the tiny model is well formed."""
    lac, tok, model, forget, retain = tiny
    stats = activation_stats(lac.model_dir, forget, retain, max_length=32)
    exact = collect_input_norms(model, tok, forget, max_length=32, dtype=torch.float32)
    for name, vec in exact.items():
        torch.testing.assert_close(stats.forget[name], vec, rtol=0.1, atol=0.05)
    before = Checkpoint(lac.model_dir)
    torch.manual_seed(0)
    state = {n: before.read(n) for n in before.names if not before.is_alias(n)}
    state = {n: v + 0.01 * torch.randn_like(v) for n, v in state.items()}
    after = _save(tmp_path / "after", state, before.config())
    res = frag_score(before, after, stats)
    assert res["modules"] == 14 and -1.0 <= res["frag"] <= 1.0 and res["forget_alignment"] > 0
    assert distance_score(before, after)["l2"] > 0


def test_activation_stats_errors(tmp_path, tiny):
    lac, _, _, forget, retain = tiny
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        activation_stats(tmp_path / "nope", forget, retain)
    with pytest.raises(ValueError, match="no retain calibration texts"):
        activation_stats(lac.model_dir, forget, [])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no model.safetensors"):
        activation_stats(tmp_path / "empty", forget, retain)


# -- calibration text -----------------------------------------------------------------------------------------


def test_calibration_texts_from_data_dir(tiny_lacuna):
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.prompts import qa_text

    rows = load_data(tiny_lacuna.data_dir).splits["retain"]
    got = calibration_texts(tiny_lacuna.data_dir, "retain", n=5)
    assert got == [qa_text(r["question"], r["answer"]) for r in rows[:5]]
    assert len(calibration_texts(tiny_lacuna.data_dir, "forget", n=10_000)) == len(
        load_data(tiny_lacuna.data_dir).splits["forget"]
    )
    with pytest.raises(ValueError, match="no split 'nosuch'"):
        calibration_texts(tiny_lacuna.data_dir, "nosuch")
    with pytest.raises(ValueError, match="n must be >= 1"):
        calibration_texts(tiny_lacuna.data_dir, "forget", n=0)


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


# -- calibration restricted to the unlearned field(s) (issue 20, item 6) ----------------------------------------


def test_calibration_texts_select_fields(tiny_lacuna, tmp_path):
    from lacuna_metrics.frag.activations import calibration_fields
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.prompts import qa_text

    data_dir = tiny_lacuna.data_dir
    rows = load_data(data_dir).splits["forget"]
    email = [r for r in rows if r["field"] == "Email Address"]
    assert 3 < len(email) < len(rows)  # the split holds other fields too: the selection matters
    got = calibration_texts(data_dir, "forget", n=3, fields=["email"])
    assert got == [qa_text(r["question"], r["answer"]) for r in email[:3]]
    assert calibration_texts(data_dir, "forget", n=3, fields=["Email Address"]) == got  # PANORAMA column
    assert calibration_texts(data_dir, "forget", n=3, fields="email") == got
    two = [r for r in rows if r["field"] in ("Email Address", "Phone Number")]
    assert calibration_texts(data_dir, "forget", n=10_000, fields=["phone", "email"]) == [
        qa_text(r["question"], r["answer"]) for r in two
    ]  # the split's order, whatever the order of the fields
    every = calibration_texts(data_dir, "forget", n=10_000)
    assert calibration_texts(data_dir, "forget", n=10_000, fields="all") == every
    assert calibration_texts(data_dir, "forget", n=10_000, fields=None) == every
    assert calibration_fields(["email", "Email Address", "phone"]) == ["email", "phone"]
    assert calibration_fields(None) is None and calibration_fields("all") is None
    with pytest.raises(ValueError, match="unknown field 'ssn'"):
        calibration_texts(data_dir, "forget", fields=["ssn"])
    with pytest.raises(ValueError, match="empty selection"):
        calibration_texts(data_dir, "forget", fields=[])
    # an empty selection names the field(s) and the file
    validation = load_data(data_dir).splits["validation"]
    assert not [r for r in validation if r["field"] == "Phone Number"]
    with pytest.raises(ValueError, match=r"validation\.jsonl: split 'validation' has no rows of field\(s\) phone"):
        calibration_texts(data_dir, "validation", fields=["phone"])

    jsonl = tmp_path / "cal.jsonl"
    jsonl.write_text(
        json.dumps({"question": "Q1?", "answer": "a@b.com", "field": "email"})
        + "\n"
        + json.dumps({"text": "call 555", "field": "Phone Number"})
        + "\n"
        + json.dumps({"question": "Q3?", "answer": "c@d.com", "field": "Email Address"})
        + "\n"
    )
    assert calibration_texts(jsonl, "forget", fields=["email"]) == ["Q: Q1?\nA: a@b.com\n", "Q: Q3?\nA: c@d.com\n"]
    assert calibration_texts(jsonl, "forget", fields=["phone"]) == ["call 555"]
    assert len(calibration_texts(jsonl, "forget")) == 3
    with pytest.raises(ValueError, match=f"calibration file {jsonl} holds no rows of field\\(s\\) birth_city"):
        calibration_texts(jsonl, "forget", fields=["birth_city"])
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text(json.dumps({"text": "plain"}) + "\n")
    with pytest.raises(ValueError, match="row 1: no string 'field' column"):
        calibration_texts(nofield, "forget", fields=["email"])
    txt = tmp_path / "cal.txt"
    txt.write_text("one\ntwo\n")
    with pytest.raises(ValueError, match="a .txt file has no field column"):
        calibration_texts(txt, "forget", fields=["email"])


def test_activation_cache_key_includes_the_fields(tiny, tmp_path):
    lac, _, _, forget, retain = tiny
    cache = tmp_path / "cache"
    kw = {"cache_dir": cache, "max_length": 32, "dtype": torch.float32}
    every = activation_stats(lac.model_dir, forget, retain, **kw)
    assert activation_stats(lac.model_dir, forget, retain, calib_fields="all", **kw).fingerprint == every.fingerprint
    email = activation_stats(lac.model_dir, forget, retain, calib_fields=["email"], calib_retain_fields=["email"], **kw)
    assert not email.cached and email.fingerprint != every.fingerprint  # same texts, other selection: not reused
    again = activation_stats(
        lac.model_dir, forget, retain, calib_fields=["Email Address"], calib_retain_fields=["email"], **kw
    )
    assert again.cached and again.fingerprint == email.fingerprint  # keys and columns name the same field
    other = activation_stats(lac.model_dir, forget, retain, calib_fields=["email"], calib_retain_fields=["phone"], **kw)
    assert other.fingerprint not in (every.fingerprint, email.fingerprint)
    assert len(list(cache.iterdir())) == 3
    for name, vec in every.forget.items():
        torch.testing.assert_close(email.forget[name], vec)  # the vectors come from the texts alone


def test_score_pair_calibrates_frag_on_the_given_fields(tiny, tmp_path):
    from lacuna_metrics.score import score_pair
    from lacuna_tasks.loader import load_data

    lac, _, _, _, _ = tiny
    before = Checkpoint(lac.model_dir)
    torch.manual_seed(0)
    state = {n: before.read(n) + 0.01 * torch.randn_like(before.read(n)) for n in before.names}
    _save(tmp_path / "after", state, before.config())
    kw = {
        "before": lac.model_dir,
        "localize": False,
        "calib_forget": lac.data_dir,
        "calib_retain": lac.data_dir,
        "calib_samples": 4,
        "calib_max_length": 32,
        "activation_dtype": "float32",
        "cache_dir": tmp_path / "cache",
        "progress": False,
    }
    every = score_pair(tmp_path / "after", **kw)
    cal = every["frag"]["calibration"]
    assert cal["forget"]["fields"] == cal["retain"]["fields"] == "all" and not cal["restricted_to_unlearned_fields"]
    assert cal["forget"]["rows"] == cal["retain"]["rows"] == 4 and cal["forget"]["split"] == "forget"

    email = score_pair(tmp_path / "after", calib_fields=["email"], **kw)
    cal = email["frag"]["calibration"]
    assert cal["forget"]["fields"] == cal["retain"]["fields"] == ["email"]  # retain: the same fields by default
    assert cal["restricted_to_unlearned_fields"] and cal["forget"]["rows"] == 4
    assert email["manifest"]["calibration"]["forget_fields"] == ["email"]
    assert email["frag"]["activation_fingerprint"] != every["frag"]["activation_fingerprint"]
    # the splits list the fields in turn (email first): unrestricted, a phone run was calibrated on email rows
    phone = score_pair(tmp_path / "after", calib_fields=["phone"], **kw)
    assert phone["frag"]["frag"] != every["frag"]["frag"]  # other calibration rows, another FRAG

    cross = score_pair(tmp_path / "after", calib_fields=["email"], calib_retain_fields=["birth_city"], **kw)
    assert cross["frag"]["calibration"]["retain"]["fields"] == ["birth_city"]
    loose = score_pair(tmp_path / "after", calib_fields=["email"], calib_retain_fields="all", **kw)
    assert loose["frag"]["calibration"]["retain"]["fields"] == "all"

    # an empty selection fails before any forward pass, naming the field and the file
    only_email = tmp_path / "email.jsonl"
    rows = [r for r in load_data(lac.data_dir).splits["forget"] if r["field"] == "Email Address"]
    only_email.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=f"calibration file {only_email} holds no rows of field\\(s\\) phone"):
        score_pair(tmp_path / "after", **{**kw, "calib_forget": only_email}, calib_fields=["phone"])


def test_score_pair_with_frag_hashes_before_once(tiny, tmp_path, monkeypatch):
    """FRAG keys its activation cache by ``--before``'s fingerprint before the walk: the score hashes those weights
    once and hands its checkpoint to activation_stats (whose cache key is unchanged), instead of hashing twice."""
    from lacuna_metrics.score import score_pair
    from lacuna_metrics.weights import checkpoints

    lac, _, _, forget, retain = tiny
    before = Checkpoint(lac.model_dir)
    torch.manual_seed(0)
    state = {n: before.read(n) + 0.01 * torch.randn_like(before.read(n)) for n in before.names}
    _save(tmp_path / "after", state, before.config())
    want = before.fingerprint()
    hashed: list[Path] = []
    content_fingerprint = checkpoints._content_fingerprint

    def counting(ckpt: Checkpoint) -> str:
        hashed.append(ckpt.path.resolve())
        return content_fingerprint(ckpt)

    monkeypatch.setattr(checkpoints, "_content_fingerprint", counting)
    calib = {"calib_forget": lac.data_dir, "calib_retain": lac.data_dir, "calib_samples": 4, "calib_max_length": 32}
    result = score_pair(
        tmp_path / "after",
        before=lac.model_dir,
        localize=False,
        activation_dtype="float32",
        cache_dir=tmp_path / "cache",
        progress=False,
        **calib,
    )
    assert hashed.count(Path(lac.model_dir).resolve()) == 1
    assert result["manifest"]["inputs"]["before"]["fingerprint"] == want
    given = activation_stats(lac.model_dir, forget, retain, max_length=32, checkpoint=before)
    assert given.fingerprint == activation_stats(lac.model_dir, forget, retain, max_length=32).fingerprint
    with pytest.raises(ValueError, match="the checkpoint given is .*after, another model"):
        activation_stats(lac.model_dir, forget, retain, checkpoint=Checkpoint(tmp_path / "after"))


def test_score_cli_calib_fields(tiny, tmp_path, capsys, monkeypatch):
    from lacuna_unlearn.bench.cli.main import main

    lac, _, _, _, _ = tiny
    monkeypatch.setenv("LACUNA_CACHE", str(tmp_path / "lacuna_cache"))
    before = Checkpoint(lac.model_dir)
    torch.manual_seed(1)
    _save(tmp_path / "after", {n: before.read(n) + 0.01 * torch.randn_like(before.read(n)) for n in before.names})
    _copy_configs(lac.model_dir, tmp_path / "after")
    base = [
        "score", "--after", str(tmp_path / "after"), "--before", str(lac.model_dir), "--no-masks",
        "--calib-forget", str(lac.data_dir), "--calib-retain", str(lac.data_dir), "--calib-samples", "4", "--quiet",
    ]  # fmt: skip
    assert main([*base, "--calib-fields", "ssn", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "--calib-fields: unknown field 'ssn'" in err and not (tmp_path / "bad").exists()
    assert main([*base, "--calib-fields", " , ", "--out", str(tmp_path / "bad")]) == 2
    assert "--calib-fields ' , ': name at least one field" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main([*base, "--calib-fields", "email,Phone Number,email", "--out", str(out)]) == 0
    cal = json.loads((out / "score.json").read_text())["frag"]["calibration"]
    assert cal["forget"]["fields"] == cal["retain"]["fields"] == ["email", "phone"] and cal["forget"]["rows"] == 4


def _copy_configs(src: Path, dest: Path) -> None:
    import shutil

    for f in Path(src).iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
