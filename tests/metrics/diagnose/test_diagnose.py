"""Tests for the representation diagnostics (docs/definitions.md#representation-diagnostics): CKA, PCA similarity/shift,
pooling, Fisher, diagnose.

CKA is checked against an independent brute-force implementation of the H-centring formula. The model-level checks
use a tiny Llama built from a config (random init: the checks are about the plumbing, not about what was learned)
with a tokenizer trained on a small generated LACUNA dataset, built in ~2 s instead of the session ``tiny_lacuna``
fixture's training run (no network).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from lacuna_metrics.diagnose.diagnostics import (
    SCHEMA,
    SCHEMA_VERSION,
    diagnose_models,
    empirical_fisher,
    fisher_diagonal,
    hidden_features,
    linear_cka,
    mean_pca_distance,
    pca_shift,
    pca_similarity,
)
from lacuna_metrics.frag.activations import calibration_texts

# -- brute-force reference ----------------------------------------------------------------------------------


def _cka_brute(x: np.ndarray, y: np.ndarray) -> float:
    """The toolkit formula, literally: tr(HKH HLH) / (sqrt(tr(HKH HKH) tr(HLH HLH)) + 1e-12)."""
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l_ = x @ x.T, y @ y.T
    hkh, hlh = h @ k @ h, h @ l_ @ h
    return float(np.trace(hkh @ hlh) / (math.sqrt(np.trace(hkh @ hkh) * np.trace(hlh @ hlh)) + 1e-12))


def _orthogonal(d: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


# -- CKA ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(20, 8), (6, 30)])  # n > d (feature form) and n < d (Gram form)
def test_cka_identity_invariances_and_brute_force(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    y = x @ rng.standard_normal((shape[1], shape[1])) + 0.5 * rng.standard_normal(shape)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-10)  # 1 - 1e-12 / ||Xc^T Xc||_F after scaling
    q = _orthogonal(shape[1], rng)
    base = linear_cka(x, y)
    assert 0.0 <= base <= 1.0
    assert linear_cka(x @ q, y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(x, y @ q) == pytest.approx(base, rel=1e-10)
    assert linear_cka(3.7 * x, y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(x, 1e-5 * y) == pytest.approx(base, rel=1e-10)  # the 1e-12 does not dominate small scales
    assert linear_cka(x + 5.0, y - 2.0) == pytest.approx(base, rel=1e-10)  # column centring
    assert base == pytest.approx(_cka_brute(x, y), rel=1e-10)
    z = rng.standard_normal(shape)
    assert linear_cka(x, z) == pytest.approx(_cka_brute(x, z), rel=1e-10)
    assert linear_cka(torch.from_numpy(x), torch.from_numpy(z)) == pytest.approx(_cka_brute(x, z), rel=1e-10)


def test_cka_degenerate_inputs_are_nan_not_errors():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4))
    assert math.isnan(linear_cka(x[:1], x[:1]))  # one sample: no variance
    const = np.tile(rng.standard_normal((1, 4)), (5, 1))
    assert math.isnan(linear_cka(const, x))
    assert math.isnan(linear_cka(x, const))
    assert math.isnan(linear_cka(np.zeros((5, 4)), x))
    with pytest.raises(ValueError, match="shapes differ"):
        linear_cka(x, x[:4])
    with pytest.raises(ValueError, match="2-D"):
        linear_cka(x[0], x[0])
    with pytest.raises(ValueError, match="non-finite"):
        linear_cka(np.full((5, 4), np.nan), x)


# -- PCA ----------------------------------------------------------------------------------------------------


def test_pca_similarity_and_shift_on_synthetic_features():
    rng = np.random.default_rng(2)
    n, d = 40, 6
    direction = np.zeros(d)
    direction[0] = 1.0
    x = rng.standard_normal((n, 1)) * 10 * direction + 0.1 * rng.standard_normal((n, d))
    assert pca_similarity(x, x) == pytest.approx(1.0, abs=1e-12)
    assert pca_similarity(x, -x, absolute=False) == pytest.approx(1.0, abs=1e-12)  # deterministic sign convention
    rotated = x[:, [1, 0, 2, 3, 4, 5]]  # PC1 now along axis 1: orthogonal to the reference PC1
    assert pca_similarity(x, rotated) == pytest.approx(0.0, abs=0.05)
    # PC1 = sklearn's PCA component (up to sign)
    from sklearn.decomposition import PCA

    y = x + 0.5 * rng.standard_normal((n, d))
    c_ref, c_upd = PCA(1).fit(x).components_[0], PCA(1).fit(y).components_[0]
    assert pca_similarity(x, y) == pytest.approx(abs(c_ref @ c_upd), abs=1e-9)

    delta, pc2_ref, pc2_upd = pca_shift(x, x)
    assert delta == 0.0 and pc2_ref == pc2_upd
    c = PCA(2).fit(x).components_
    shifted = x + 3.0 * c[0]  # move every point 3 along the reference PC1
    delta, pc2_ref, pc2_upd = pca_shift(x, shifted)
    assert abs(delta) == pytest.approx(3.0, rel=1e-9)
    assert pc2_upd == pytest.approx(pc2_ref, abs=1e-9)
    # uncentred projections, as in the toolkit: mean(H c) with sklearn's components
    assert abs(pc2_ref) == pytest.approx(abs(float(np.mean(x @ c[1]))), rel=1e-9)


def test_pca_degenerate_cases():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3))
    assert math.isnan(pca_similarity(x[:1], x[:1]))
    const = np.ones((4, 3))
    assert math.isnan(pca_similarity(const, x))
    assert all(math.isnan(v) for v in pca_shift(const, x))
    two = x[:2]  # two points: PC1 defined, PC2 not
    delta, pc2_ref, pc2_upd = pca_shift(two, two + 1.0)
    assert math.isfinite(delta) and math.isnan(pc2_ref) and math.isnan(pc2_upd)


def test_mean_pca_distance():
    """Index 0 is the embedding output: the default averages the transformer layers 1..L only."""
    shifts = [(3.0, 1.0, 5.0), (0.0, 2.0, 2.0), (-1.0, 0.0, 0.0)]
    assert mean_pca_distance(shifts) == pytest.approx((0.0 + 1.0) / 2)
    assert mean_pca_distance(shifts, use_pc2=False) == pytest.approx((0.0 + 1.0) / 2)
    assert mean_pca_distance(shifts, layers=[0, 2]) == pytest.approx(3.0)  # the embedding output, when asked for
    assert math.isnan(mean_pca_distance([(0.0, 0.0, 0.0), (1.0, float("nan"), float("nan"))]))
    with pytest.raises(ValueError, match="out of range"):
        mean_pca_distance(shifts, layers=[3])
    with pytest.raises(ValueError, match="no layers"):
        mean_pca_distance([])
    with pytest.raises(ValueError, match="no transformer layer"):
        mean_pca_distance([(1.0, 0.0, 0.0)])


# -- model-level --------------------------------------------------------------------------------------------


@dataclass
class TinyDirs:
    data_dir: Path
    model_dir: Path


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> TinyDirs:
    from transformers import LlamaConfig, LlamaForCausalLM

    from lacuna_tasks.prompts import qa_text
    from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("diagnose")
    profiles = generate_profiles(24, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=4, validation_people=2)
    data_dir = Path(write_dataset(root / "data", profiles, splits))
    tok = train_tokenizer([qa_text(r["question"], r["answer"]) for rows in splits.values() for r in rows], 512)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    model_dir = root / "model"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return TinyDirs(data_dir=data_dir, model_dir=model_dir)


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dirs.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs.model_dir, local_files_only=True).eval()
    texts = calibration_texts(tiny_dirs.data_dir, "forget", 12)
    return model, tok, texts


def test_hidden_features_shapes_and_pooling(tiny):
    model, tok, texts = tiny
    n_layers, d = model.config.num_hidden_layers, model.config.hidden_size
    feats = hidden_features(model, tok, texts[:5], batch_size=2)
    assert len(feats) == n_layers + 1
    assert all(f.shape == (5, d) and f.dtype == np.float64 for f in feats)
    # masked mean does not depend on batching/padding; the features of a text alone match those in a batch
    alone = hidden_features(model, tok, texts[:1])
    for layer in range(n_layers + 1):
        np.testing.assert_allclose(alone[layer][0], feats[layer][0], rtol=1e-4, atol=1e-5)

    short = min(texts, key=lambda t: len(tok(t)["input_ids"]))
    n_tok = len(tok(short)["input_ids"])
    # no padding (max_length = the text's length): plain mean == masked mean
    plain = hidden_features(model, tok, [short], pooling="mean", max_length=n_tok)
    masked = hidden_features(model, tok, [short], pooling="masked_mean", max_length=n_tok)
    for a, b in zip(plain, masked, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # padded to max_length: the toolkit's plain mean averages pad positions in and differs
    plain = hidden_features(model, tok, [short], pooling="mean", max_length=n_tok + 20)
    masked_long = hidden_features(model, tok, [short], pooling="masked_mean", max_length=n_tok + 20)
    assert np.abs(plain[-1] - masked_long[-1]).max() > 1e-3
    np.testing.assert_allclose(masked_long[-1], masked[-1], rtol=1e-4, atol=1e-5)
    # first / last token: the right rows of the hidden states
    ids = tok([short], return_tensors="pt")
    with torch.no_grad():
        states = model(**ids, output_hidden_states=True).hidden_states
    first = hidden_features(model, tok, [short, texts[0]], pooling="first")
    last = hidden_features(model, tok, [short, texts[0]], pooling="last")
    np.testing.assert_allclose(first[1][0], states[1][0, 0].double().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last[1][0], states[1][0, -1].double().numpy(), rtol=1e-4, atol=1e-5)
    assert tok.padding_side == "right" and tok.pad_token is not None  # tokenizer restored
    with pytest.raises(ValueError, match="pooling"):
        hidden_features(model, tok, texts, pooling="max")
    with pytest.raises(ValueError, match="no query texts"):
        hidden_features(model, tok, [])


def test_fisher_nonnegative_and_zero_for_frozen(tiny):
    model, tok, texts = tiny
    frozen = [n for n, _ in model.named_parameters() if n.startswith("model.layers.0.")]
    assert frozen
    try:
        for n, p in model.named_parameters():
            if n in frozen:
                p.requires_grad_(False)
        values = empirical_fisher(model, tok, texts, batch_size=4, num_batches=2, max_length=64)
        assert set(values) == {n for n, _ in model.named_parameters()}
        assert all(bool((v >= 0).all()) for v in values.values())
        assert all(bool((values[n] == 0).all()) for n in frozen)
        assert any(float(values[n].max()) > 0 for n in values if n.startswith("model.layers.1."))
        assert all(p.grad is None for p in model.parameters())  # .grad untouched

        summary = fisher_diagonal(model, tok, texts, batch_size=4, num_batches=2, max_length=64)
        assert summary["num_batches"] == 2
        layer0, layer1 = summary["layers"]
        assert layer0["max"] == 0.0 and layer0["n_frozen"] == layer0["n_params"] and layer0["zero_fraction"] == 1.0
        assert layer0["log10_quantiles"] is None
        assert layer1["n_frozen"] == 0 and layer1["max"] > 0 and layer1["mean"] >= 0
        q = layer1["log10_quantiles"]
        assert q["0.01"] <= q["0.5"] <= q["0.99"] <= math.log10(layer1["max"]) + 1e-9
        n_all = sum(p.numel() for p in model.parameters())
        assert sum(r["n_params"] for r in summary["layers"]) + summary["other"]["n_params"] == n_all
        # the toolkit mode (pad tokens as labels) is a different loss, hence a different Fisher
        toolkit = fisher_diagonal(model, tok, texts, batch_size=4, num_batches=2, max_length=64, labels="toolkit")
        assert toolkit["labels"] == "toolkit" and toolkit["layers"][1]["mean"] != layer1["mean"]
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    with pytest.raises(ValueError, match="labels"):
        fisher_diagonal(model, tok, texts, labels="all")


def _paper_mean_pca_distance(ref_dir: Path, upd_dir: Path, texts: list[str]) -> float:
    """The paper's mean PCA distance, brute force: for each transformer layer l = 1..L (``hidden_states[l]``; index 0
    is the embedding output), mean-pool each text's tokens (one text per forward pass: no padding), fit PCA on the
    reference's vectors, and take the distance between the two centroids in its PC1-PC2 plane; average over the L
    layers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def pooled(path: Path) -> list[np.ndarray]:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
        per_text = []
        with torch.no_grad():
            for text in texts:
                ids = tok(text, return_tensors="pt")
                assert ids["input_ids"].shape[1] <= 256  # the diagnose call below truncates nothing
                states = model(**ids, output_hidden_states=True).hidden_states
                per_text.append([h[0].double().mean(dim=0).numpy() for h in states])
        return [np.stack([t[layer] for t in per_text]) for layer in range(len(per_text[0]))]

    ref, upd = pooled(ref_dir), pooled(upd_dir)
    n_layers = len(ref) - 1
    distances = []
    for layer in range(1, n_layers + 1):
        a, b = ref[layer], upd[layer]
        _, _, vt = np.linalg.svd(a - a.mean(axis=0), full_matrices=False)
        shift = [float((b @ c).mean() - (a @ c).mean()) for c in vt[:2]]  # the sign of c cancels in the norm
        distances.append(math.hypot(*shift))
    return sum(distances) / n_layers


def test_mean_pca_distance_is_the_papers_over_the_transformer_layers(tiny_dirs, tmp_path):
    """Against a brute-force computation of the paper's formula on a tiny model whose embeddings stay put: the
    embedding output's distance is 0, and averaging it in would report L / (L + 1) of the paper's value."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dirs.model_dir, local_files_only=True)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".layers." in name:
                param.add_(0.05 * torch.randn_like(param))
    updated = tmp_path / "updated"
    model.save_pretrained(updated)
    shutil.copytree(tiny_dirs.model_dir, updated, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors",
                                                                                                    "config.json"))  # fmt: skip
    texts = calibration_texts(tiny_dirs.data_dir, "forget", 10)
    result = diagnose_models(tiny_dirs.model_dir, [updated], texts, max_length=256, fisher=False)
    (upd,) = result["updated"]
    n_layers = model.config.num_hidden_layers
    assert result["options"]["mean_pca_distance"]["layers"] == list(range(1, n_layers + 1))
    assert upd["per_layer"][0]["pca_distance"] == pytest.approx(0.0, abs=1e-9)  # embeddings unchanged
    expected = _paper_mean_pca_distance(tiny_dirs.model_dir, updated, texts)
    assert expected > 1e-3
    assert upd["mean_pca_distance"] == pytest.approx(expected, rel=1e-6)
    rows = [r["pca_distance"] for r in upd["per_layer"]]
    assert upd["mean_pca_distance"] == pytest.approx(sum(rows[1:]) / n_layers)
    assert sum(rows) / (n_layers + 1) == pytest.approx(n_layers / (n_layers + 1) * expected, rel=1e-6)  # the old mean


def test_diagnose_identical_models(tiny_dirs, tmp_path):
    texts = calibration_texts(tiny_dirs.data_dir, "forget", 10)
    out = tmp_path / "diag"
    result = diagnose_models(
        tiny_dirs.model_dir,
        [tiny_dirs.model_dir],
        texts,
        max_length=64,
        fisher_num_batches=1,
        out_dir=out,
        plots=True,
    )
    assert result["schema"] == SCHEMA and result["version"] == SCHEMA_VERSION == 2
    (upd,) = result["updated"]
    assert len(upd["per_layer"]) == len(result["layers"]) == 3
    for row in upd["per_layer"]:
        assert row["pca_sim"] == pytest.approx(1.0, abs=1e-9)
        assert row["cka"] == pytest.approx(1.0, abs=1e-9)
        assert row["delta_pc1"] == 0.0 and row["pc2_ref"] == row["pc2_upd"]
    assert upd["mean_pca_distance"] == 0.0
    assert upd["fisher"]["layers"] == result["reference"]["fisher"]["layers"]
    assert result["options"]["pooling"] == "masked_mean"
    on_disk = json.loads((out / "diagnose.json").read_text())
    assert on_disk["updated"][0]["per_layer"] == upd["per_layer"]
    for name in ("diagnose_layers.png", "diagnose_pca_shift.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in (out / "plots").iterdir() if p.name.startswith(".")]  # no temp files left
    with pytest.raises(ValueError, match="no query texts"):
        diagnose_models(tiny_dirs.model_dir, [tiny_dirs.model_dir], [])


def test_diagnose_rejects_mismatched_models(tiny_dirs, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    ref = tiny_dirs.model_dir
    texts = calibration_texts(tiny_dirs.data_dir, "forget", 4)
    tok = AutoTokenizer.from_pretrained(ref, local_files_only=True)
    config = LlamaConfig.from_pretrained(ref, local_files_only=True)
    config.hidden_size, config.intermediate_size = 32, 64
    wide = tmp_path / "hidden32"
    LlamaForCausalLM(config).save_pretrained(wide)
    tok.save_pretrained(wide)
    with pytest.raises(ValueError, match="hidden_size") as err:
        diagnose_models(ref, [wide], texts, fisher=False)
    assert str(ref) in str(err.value) and str(wide) in str(err.value)

    other_tok = tmp_path / "other_tokenizer"
    shutil.copytree(ref, other_tok)
    for f in other_tok.glob("*token*"):
        f.unlink()
    train_tokenizer(
        ["an entirely different corpus", "with other merges", "0123456789"], vocab_size=300
    ).save_pretrained(other_tok)
    with pytest.raises(ValueError, match="tokenizers differ") as err:
        diagnose_models(ref, [other_tok], texts, fisher=False)
    assert str(ref) in str(err.value) and str(other_tok) in str(err.value)


def test_cli_diagnose_writes_json_and_plots(tiny_dirs, tmp_path, capsys):
    from lacuna_unlearn.bench.cli.main import main

    out = tmp_path / "diag"
    code = main(
        [
            "diagnose", "--reference", str(tiny_dirs.model_dir), "--updated", str(tiny_dirs.model_dir),
            "--data", str(tiny_dirs.data_dir), "--queries", "retain", "--n", "6", "--out", str(out), "--plots",
        ]
    )  # fmt: skip
    assert code == 0
    result = json.loads((out / "diagnose.json").read_text())
    assert all(row["pca_sim"] == pytest.approx(1.0) for row in result["updated"][0]["per_layer"])
    assert (out / "plots").is_dir() and any((out / "plots").glob("*.png"))
    assert main(["diagnose", "--reference", "a", "--updated", "b", "--queries", "forget"]) == 2
    assert "--queries forget reads a LACUNA split" in capsys.readouterr().err
