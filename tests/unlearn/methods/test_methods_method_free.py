"""The method-free updates ``null_gaussian`` and ``null_weight_decay`` (noise controls, not unlearning methods), on
real tiny Llama checkpoints written in float32, bfloat16 and float16: the stored relative L2 per tensor is ``size``
within the dtype's rounding, out-of-scope tensors are byte-identical, draws are seeded, the data is ignored, and the
Hydra entry point writes the model or refuses a bad setting in one line naming it."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from helpers.tiny_lm import tiny_llama_config
from safetensors import safe_open

from lacuna_unlearn.methods.method_free import MethodFreeConfig, run_from_config, run_method_free

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: significand bits (with the implicit one) and the smallest spacing (subnormals) of each stored dtype
_PRECISION = {torch.float32: (24, 2.0**-149), torch.bfloat16: (8, 2.0**-133), torch.float16: (11, 2.0**-24)}
SIZES = (1e-3, 1e-2, 1e-1)


@pytest.fixture(scope="module")
def tokenizer():
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    return train_tokenizer(["Q: What is the email of Ann? A: ann@example.com", "hello world 0123456789"], 300)


@pytest.fixture(scope="module")
def models(tokenizer, tmp_path_factory) -> dict[torch.dtype, Path]:
    """The same random tiny Llama (2 blocks, hidden 32) saved in each dtype."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer, hidden_size=32, num_layers=2)).eval()
    out = {}
    for dtype in DTYPES:
        path = root / str(dtype).removeprefix("torch.")
        model.to(dtype).save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[dtype] = path
    return out


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def _in_scope(name: str) -> bool:
    """The default scope, written out independently: the seven projection weights of each block."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _rounding_bound(stored: torch.Tensor) -> float:
    """‖e‖₂ for |e_i| = half the spacing of the dtype at the stored value: the most rounding to ``stored.dtype`` can
    have moved θ + δ (round to nearest)."""
    bits, smallest = _PRECISION[stored.dtype]
    _, exponent = torch.frexp(stored.float().abs())  # |x| = m 2^e, m in [0.5, 1): spacing 2^(e - bits)
    spacing = torch.pow(2.0, exponent.double() - bits).clamp_min(smallest)
    return float((spacing / 2).norm())


def _relative(before: torch.Tensor, after: torch.Tensor) -> float:
    return float((after.double() - before.double()).norm() / before.double().norm())


def _run(model_dir: Path, out: Path, **args) -> tuple[dict[str, torch.Tensor], dict]:
    run_from_config(model_dir, [], [], out, args, seed=42)
    return _tensors(out), json.loads((out / "unlearn_manifest.json").read_text())


@pytest.mark.parametrize("kind", ["gaussian", "weight_decay"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_stored_relative_l2_is_the_size_within_rounding(models, tmp_path, kind, dtype) -> None:
    before = _tensors(models[dtype])
    in_scope = sorted(n for n in before if _in_scope(n))
    assert len(in_scope) == 14 and {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= set(before)
    for size in SIZES:
        after, manifest = _run(models[dtype], tmp_path / f"{size}", kind=kind, size=size)
        assert manifest["method"] == f"null_{kind}" and manifest["config"]["kind"] == kind
        assert manifest["config"]["size"] == size and manifest["config"]["scope"] == "all"
        assert sorted(manifest["update"]["relative_l2"]) == in_scope and manifest["update"]["dtypes"] == [
            str(dtype).removeprefix("torch.")
        ]
        off = []
        for name, theta in before.items():
            stored = after[name]
            assert stored.dtype == dtype and stored.shape == theta.shape
            if not _in_scope(name):
                assert torch.equal(_bits(stored), _bits(theta)), f"{name} is out of scope but changed"
                continue
            rel = _relative(theta, stored)
            assert manifest["update"]["relative_l2"][name] == pytest.approx(rel, rel=1e-9, abs=1e-15)
            off += [name] if abs(rel - size) > 0.1 * size else []
            # the intended update has ||delta|| = size ||theta|| (float32, up to ~1e-7 relative); rounding to the
            # stored dtype moves the stored update by at most half a spacing per scalar
            tolerance = _rounding_bound(stored) / float(theta.double().norm()) + 1e-6 * size
            assert abs(rel - size) <= tolerance, (name, size, rel, tolerance)
            if dtype == torch.bfloat16 and size == 1e-3:
                continue  # bf16's spacing (2^-8..2^-7 relative) exceeds the update: see below
            # the dtype resolves this size: a size off by 2x in either direction would fail
            assert tolerance < size / 2, (name, size, tolerance)
            assert size / 2 < rel < 2 * size
        assert sorted(manifest["update"]["tensors_off_size"]) == sorted(
            off
        )  # the manifest flags what rounding moved off size
        if dtype == torch.bfloat16 and size == 1e-3:
            # measured on this model: gaussian stores 0.76-0.87 x size; 1e-3 of theta is below half of bf16's
            # spacing everywhere, so weight decay rounds back to theta in every scalar
            assert sorted(off) == in_scope
            if kind == "weight_decay":
                assert all(torch.equal(_bits(after[n]), _bits(before[n])) for n in in_scope)
        else:
            assert off == []


def test_seeded_draws_and_the_checkpoint_bytes(models, tmp_path) -> None:
    model = models[torch.bfloat16]

    def weights(kind: str, seed: int, tag: str) -> bytes:
        out = tmp_path / f"{kind}-{seed}-{tag}"
        run_from_config(model, [], [], out, {"kind": kind}, seed=seed)
        return (out / "model.safetensors").read_bytes()

    assert weights("gaussian", 1, "a") == weights("gaussian", 1, "b")  # same seed: byte-identical
    assert weights("gaussian", 2, "a") != weights("gaussian", 1, "c")  # another seed: another draw
    assert weights("weight_decay", 1, "a") == weights("weight_decay", 2, "a")  # no draws
    # each tensor's draw depends on (seed, name) only, not on which tensors are updated
    everything = _tensors(tmp_path / "gaussian-1-a")
    run_from_config(model, [], [], tmp_path / "mlp", {"kind": "gaussian", "scope": "mlp"}, seed=1)
    mlp_only = _tensors(tmp_path / "mlp")
    original = _tensors(model)
    for name, stored in mlp_only.items():
        if ".mlp." in name and name.endswith("_proj.weight"):
            assert torch.equal(_bits(stored), _bits(everything[name]))
        else:
            assert torch.equal(_bits(stored), _bits(original[name]))


def test_the_data_is_ignored(models, tmp_path) -> None:
    model = models[torch.float32]
    rows_a = [{"question": "What is the email of Ann?", "answer": "ann@example.com"}]
    rows_b = [{"question": "Where was Bob born?", "answer": "Paris"}] * 3
    written = []
    for i, (forget, retain) in enumerate([(rows_a, rows_b), (rows_b, []), ([], rows_a)]):
        out = run_from_config(model, forget, retain, tmp_path / str(i), {"size": 0.05}, seed=7, data=object())
        written.append((out / "model.safetensors").read_bytes())
    assert written[0] == written[1] == written[2]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset

    profiles = generate_profiles(16, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=2, validation_people=1)
    return Path(write_dataset(tmp_path_factory.mktemp("data") / "data", profiles, splits))


def _cli(monkeypatch, capsys, *overrides: str) -> tuple[int, str]:
    """``lacuna-unlearn OVERRIDES`` through its console entry (``lacuna_unlearn.trainer.app.main``), in process."""
    from lacuna_unlearn.trainer.app import main

    monkeypatch.setattr(sys, "argv", ["lacuna-unlearn", *overrides])
    # Hydra's job logging (`disabled`: disable_existing_loggers) would silence this process's loggers for every
    # later test in the worker: keep their state and put it back
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    saved = [(lg, lg.disabled) for lg in loggers]
    root_level = logging.root.level
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        for lg, disabled in saved:
            lg.disabled = disabled
        logging.root.setLevel(root_level)
    return code, capsys.readouterr().err


def test_cli_writes_the_model_in_hf_layout(models, data_dir, tmp_path, monkeypatch, capsys) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "null"
    model = models[torch.float16]
    code, err = _cli(monkeypatch, capsys, "method=null_gaussian", f"model={model}", f"data={data_dir}",
                     "field=email", f"output_dir={out}", "method.args.size=0.05", "seed=3")  # fmt: skip
    assert code == 0, err
    assert {"config.json", "model.safetensors", "tokenizer.json", "unlearn_manifest.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not out.with_name(out.name + ".partial").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert sum(p.numel() for p in loaded.parameters()) > 0
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["config"] == {"kind": "gaussian", "size": 0.05, "scope": "all", "seed": 3}
    lo, hi = manifest["update"]["relative_l2_range"]
    assert 0.045 < lo <= hi < 0.055 and manifest["update"]["tensors"] == 14
    assert "versions" in manifest and "hardware" in manifest  # the shared manifest fields
    # the Hydra defaults of the second name: weight decay
    code, err = _cli(monkeypatch, capsys, "method=null_weight_decay", f"model={model}", f"data={data_dir}",
                     f"output_dir={tmp_path / 'wd'}")  # fmt: skip
    assert code == 0, err
    manifest = json.loads((tmp_path / "wd" / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "null_weight_decay" and manifest["config"]["size"] == 0.01


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("method.args.size=0", "method.args.size"),
        ("method.args.size=-1", "method.args.size"),
        ("method.args.size=nan", "method.args.size"),
        ("method.args.kind=foo", "method.args.kind"),
        ("method.args.scope=nowhere", "method.args.scope"),
    ],
)
def test_cli_refuses_bad_settings_in_one_line(models, data_dir, tmp_path, monkeypatch, capsys, override, key) -> None:
    out = tmp_path / "out"
    code, err = _cli(monkeypatch, capsys, "method=null_gaussian", f"model={models[torch.float32]}",
                     f"data={data_dir}", f"output_dir={out}", override)  # fmt: skip
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lacuna-unlearn: error: ") and key in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written: no output, no .partial, no lock


def test_config_errors_name_the_key() -> None:
    for args, key in [({"size": 0.0}, "size"), ({"size": float("inf")}, "size"), ({"size": True}, "size"),
                      ({"kind": "permutation"}, "kind"), ({"scope": "bogus"}, "scope")]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"^method\.args\.{key}"):
            MethodFreeConfig(**args).validate()
    with pytest.raises(ValueError, match=r"^method\.args: .*unexpected keyword argument 'lam'"):
        run_from_config("unused", [], [], "unused", {"lam": 0.1})
    with pytest.raises(FileNotFoundError):
        run_method_free("/nonexistent/model", "/nonexistent/out")
