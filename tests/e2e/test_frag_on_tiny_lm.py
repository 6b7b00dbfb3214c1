"""FRAG (docs/definitions.md#frag-score) on a real tiny model (``tiny_lacuna``): activation norms against brute
force, the activation-statistics cache, calibration texts from a data directory, ``score_pair`` and ``lacuna score``
with FRAG. The accumulator and the distances on hand-made tensors: tests/metrics/frag/test_frag.py.
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
    activation_stats,
    calibration_texts,
    collect_input_norms,
    linear_weight_names,
    transposed_weight_names,
)
from lacuna_metrics.frag.alignment import frag_score
from lacuna_metrics.frag.distance import distance_score
from lacuna_metrics.weights.checkpoints import Checkpoint


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


def _save(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Checkpoint:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return Checkpoint(directory)


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


def test_blank_padded_txt_calibration_gives_the_authors_frag(tiny, tmp_path):
    """A ``.txt`` calibration file is read as FRAG's own loader reads it (each line stripped, blank lines skipped),
    so padding the lines with blanks leaves x^f, x^r and FRAG unchanged; the unstripped lines move FRAG."""
    lac, _, _, forget, retain = tiny
    plain_f, plain_r = [t.replace("\n", " ").strip() for t in forget], [t.replace("\n", " ").strip() for t in retain]
    (tmp_path / "f.txt").write_text("".join(f"{t}\n" for t in plain_f))
    (tmp_path / "r.txt").write_text("".join(f"{t}\n" for t in plain_r))
    (tmp_path / "f_pad.txt").write_text("\n   \n" + "".join(f"  \t{t}   \n\n" for t in plain_f))
    (tmp_path / "r_pad.txt").write_text("".join(f"\t {t} \t\n" for t in plain_r) + "  \n")
    # The authors' loader (predictor.py load_examples) for plain-text lines, written out.
    authors = [ln.strip() for ln in (tmp_path / "f_pad.txt").read_text().splitlines() if ln.strip()]
    assert calibration_texts(tmp_path / "f_pad.txt", "forget") == authors == plain_f
    assert calibration_texts(tmp_path / "r_pad.txt", "retain") == plain_r

    before = Checkpoint(lac.model_dir)
    torch.manual_seed(1)
    state = {n: before.read(n) for n in before.names if not before.is_alias(n)}
    after = _save(tmp_path / "after", {n: v + 0.01 * torch.randn_like(v) for n, v in state.items()}, before.config())

    def frag_of(f: list[str], r: list[str]) -> float:
        stats = activation_stats(lac.model_dir, f, r, max_length=32, dtype=torch.float32)
        return frag_score(before, after, stats)["frag"]

    stripped = frag_of(calibration_texts(tmp_path / "f.txt", "forget"), calibration_texts(tmp_path / "r.txt", "retain"))
    padded = frag_of(
        calibration_texts(tmp_path / "f_pad.txt", "forget"), calibration_texts(tmp_path / "r_pad.txt", "retain")
    )
    assert padded == stripped
    # What keeping the blanks did (the former reading): FRAG moves, so the check above can fail.
    kept_f = [f"  \t{t}   " for t in plain_f]
    kept_r = [f"\t {t} \t" for t in plain_r]
    assert abs(frag_of(kept_f, kept_r) - stripped) > 1e-6
