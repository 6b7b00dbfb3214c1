"""End-to-end tests of ``lacuna score`` (real subprocesses) on the smoke testbed, against a planted "after" model
whose only change is seeded noise on the forget-mask scalars."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from lacuna_metrics.localization.precision import SCORES
from lacuna_metrics.masks import load_masks
from lacuna_metrics.weights.checkpoints import Checkpoint, file_fingerprint

REMOVED = "model.layers.1.mlp.up_proj.weight"


def _env(cache_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        LACUNA_CACHE=str(cache_root),  # never touch ~/.cache from tests
    )
    return env


def lacuna(env: dict[str, str], *args: Any) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lacuna")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "lacuna_unlearn.bench.cli.main"]
    return subprocess.run(
        [*cmd, "score", *map(str, args)], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def _copy_with_weights(src: Path, dest: Path, state: dict[str, torch.Tensor]) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))  # config + tokenizer files
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


class Scored:
    def __init__(self, testbed: Path, root: Path) -> None:
        self.testbed, self.root = testbed, root
        self.cache = root / "activation_cache"
        self.env = _env(root / "lacuna_cache")
        before = load_file(str(testbed / "model" / "model.safetensors"))
        masks = load_masks(testbed / "masks.safetensors")
        gen = torch.Generator().manual_seed(1234)
        after = dict(before)
        for name in masks.packed:
            noise = torch.randn(before[name].shape, generator=gen, dtype=torch.float32) * 1e-2
            after[name] = before[name] + noise * masks.forget_mask(name).reshape(before[name].shape)
        self.expected_l2 = math.sqrt(sum(float(((after[n] - before[n]).double() ** 2).sum()) for n in before))
        self.forget_mask_names = set(masks.packed)
        self.after = _copy_with_weights(testbed / "model", root / "after", after)
        broken = {n: t for n, t in after.items() if n != REMOVED}
        self.broken = _copy_with_weights(testbed / "model", root / "after_missing", broken)

    def run(self, out: Path, *args: Any) -> subprocess.CompletedProcess[str]:
        return lacuna(self.env, "--after", self.after, "--out", out, *args)


@pytest.fixture(scope="module")
def scored(smoke_testbed, tmp_path_factory) -> Scored:
    return Scored(Path(smoke_testbed), tmp_path_factory.mktemp("score_cli"))


@pytest.fixture(scope="module")
def first(scored):
    """The documented command, run once: planted after-model, plots, a fresh activation cache."""
    out = scored.root / "out1"
    proc = scored.run(
        out,
        "--testbed",
        scored.testbed,
        "--plots",
        "--activation-cache",
        scored.cache,
        "--composite-samples",
        "20000",
    )
    assert proc.returncode == 0, proc.stderr
    return out, proc, json.loads((out / "score.json").read_text())


@pytest.fixture(scope="module")
def second(scored, first):
    out = scored.root / "out2"
    proc = scored.run(
        out, "--testbed", scored.testbed, "--activation-cache", scored.cache, "--composite-samples", "20000"
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "score.json").read_text())


def _localization(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result[k] for k in ("auc", "auc_error_bound", "precision_at_k", "baselines", "per_layer", "universe")}


def test_score_writes_json_markdown_and_plots(scored, first):
    out, proc, result = first
    assert (out / "score.json").is_file() and (out / "score.md").is_file()
    for png in ("roc.png", "layers.png"):
        data = (out / "plots" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert result["schema"] == "lacuna-bench/score" and result["schema_version"] == 3

    auc = result["auc"]
    assert auc["forget"]["raw"] > 0.99  # the planted update touches forget scalars only
    assert auc["forget_vs_retain"]["raw"] > 0.99
    for target in ("forget", "unified", "forget_vs_retain"):
        assert set(SCORES) | {"best", "composite"} <= set(auc[target])
        present = {s: v for s, v in auc[target].items() if s != "best" and v is not None}
        best = auc[target]["best"]
        assert set(best) == {"score", "value"}
        assert best["value"] == max(present.values()) and present[best["score"]] == best["value"]
        assert set(result["baselines"][target]) == {"before_magnitude", "injection_magnitude"}
        assert all(v is not None for v in result["baselines"][target].values())  # the testbed has base/
    # the same fraction of every universe tensor, each rounded: 20000 up to one scalar per tensor
    assert abs(result["composite"]["samples"] - 20000) <= result["universe"]["tensors"]
    assert auc["forget"]["composite"] > 0.9
    assert "contrast" in result["not_applicable"] and "crossfield" in result["not_applicable"]

    frag = result["frag"]
    for key in ("forget_alignment", "retain_alignment", "frag", "gamma"):
        assert isinstance(frag[key], float)
    assert frag["frag"] == pytest.approx(frag["forget_alignment"] - frag["gamma"] * frag["retain_alignment"])
    assert frag["activation_cache_hit"] is False

    assert result["distance"]["l2"] > 0
    assert result["distance"]["l2"] == pytest.approx(scored.expected_l2, rel=1e-6)

    assert result["per_layer"]
    for row in result["per_layer"]:
        assert {"layer", "component", "auc", "update_mass", "tensors", "scalars"} <= set(row)
        assert row["update_mass"]["forget"] == pytest.approx(1.0)
    assert set(result["universe"]["names"]) <= scored.forget_mask_names

    manifest = result["manifest"]
    assert {"before", "after", "base"} <= set(manifest["inputs"])
    for entry in manifest["inputs"].values():  # schema 2: resolved path and content fingerprint of each input
        assert entry["fingerprint"] == Checkpoint(entry["path"]).fingerprint()
        assert Path(entry["path"]).is_absolute() and Path(entry["path"]) == Path(entry["path"]).resolve()
    assert manifest["inputs"]["after"]["path"] == str(scored.after.resolve())
    assert manifest["inputs"]["before"]["path"] == str((scored.testbed / "model").resolve())
    assert manifest["masks"] == {
        "path": str((scored.testbed / "masks.safetensors").resolve()),
        "fingerprint": file_fingerprint(scored.testbed / "masks.safetensors"),
    }
    assert "torch" in manifest["versions"] and "cpu_count" in manifest["hardware"]
    assert manifest["config"]["composite_samples"] == 20000 and manifest["seed"] == 42

    md = (out / "score.md").read_text()
    assert "| score | forget | unified | forget_vs_retain |" in md
    assert f"| raw | {auc['forget']['raw']:.4f} |" in md
    assert "## FRAG" in md and "## Distance" in md and "| layer | component |" in md
    assert md.strip() in proc.stdout  # the summary is printed too


def test_second_run_hits_activation_cache(first, second):
    _, _, result = first
    assert second["frag"]["activation_cache_hit"] is True
    assert second["frag"]["activation_fingerprint"] == result["frag"]["activation_fingerprint"]
    assert second["frag"]["frag"] == result["frag"]["frag"]
    assert _localization(second) == _localization(result)
    assert second["composite"] == result["composite"]


def test_explicit_paths_match_testbed(scored, first):
    tb = scored.testbed
    out = scored.root / "out_explicit"
    proc = scored.run(
        out,
        *("--before", tb / "model", "--masks", tb / "masks.safetensors", "--base", tb / "base"),
        *("--calib-forget", tb / "data", "--calib-retain", tb / "data"),
        *("--activation-cache", scored.cache, "--composite-samples", "20000"),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "score.json").read_text())
    _, _, expected = first
    assert _localization(result) == _localization(expected)
    assert result["composite"] == expected["composite"]
    assert result["frag"]["frag"] == pytest.approx(expected["frag"]["frag"], abs=1e-12)
    assert result["distance"] == expected["distance"]


def test_python_api_returns_the_json_content(scored, second):
    code = (
        "import json, sys; import lacuna_metrics.score as s; "
        "from lacuna_metrics.localization.precision import LocalizationConfig; "
        "r = s.score_pair(sys.argv[1], testbed=sys.argv[2], cache_dir=sys.argv[3], "
        "config=LocalizationConfig(composite_samples=20000), progress=False); "
        "print('\\nJSON:' + json.dumps(r, default=str, allow_nan=False))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(scored.after), str(scored.testbed), str(scored.cache)],
        capture_output=True,
        text=True,
        env=scored.env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    api = json.loads(proc.stdout.rsplit("\nJSON:", 1)[1])
    cli = json.loads(json.dumps(second))
    for r in (api, cli):  # timings differ from run to run
        del r["manifest"]["wall_seconds"]
        assert set(r["manifest"].pop("localization_timings")) == {"walk_seconds", "composite_seconds", "null_seconds"}
    assert api == cli


def test_missing_masks_without_testbed_exits_2(scored):
    out = scored.root / "out_no_masks_arg"
    proc = scored.run(out, "--before", scored.testbed / "model")
    assert proc.returncode == 2
    assert "lacuna: error:" in proc.stderr and "--masks" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_after_with_missing_tensor_exits_2(scored):
    out = scored.root / "out_missing_tensor"
    proc = lacuna(
        scored.env,
        *("--after", scored.broken, "--testbed", scored.testbed, "--out", out),
        *("--activation-cache", scored.cache),
    )
    assert proc.returncode == 2
    assert "lacuna: error:" in proc.stderr and REMOVED in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_no_frag(scored, first):
    out = scored.root / "out_no_frag"
    proc = scored.run(out, "--testbed", scored.testbed, "--no-frag", "--composite-samples", "0", "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "score.json").read_text())
    _, _, expected = first
    assert result["frag"] is None
    assert result["composite"] is None and "composite" not in result["auc"]["forget"]
    for target in ("forget", "unified", "forget_vs_retain"):
        for s in SCORES:
            assert result["auc"][target][s] == expected["auc"][target][s]
    assert result["per_layer"] == expected["per_layer"]
    assert result["distance"] == expected["distance"]
    assert "## FRAG" not in (out / "score.md").read_text()
    assert not (out / "plots").exists()


def test_no_masks_with_before(scored, first):
    out = scored.root / "out_no_masks"
    proc = scored.run(out, "--before", scored.testbed / "model", "--no-masks", "--no-frag", "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "score.json").read_text())
    assert result["auc"] is None and result["per_layer"] == [] and result["universe"] is None
    assert "localization" in result["not_applicable"]
    assert result["distance"] == first[2]["distance"]
    md = (out / "score.md").read_text()
    assert "## Localization" not in md and "## Distance" in md


def test_no_masks_with_testbed_skips_localization(scored, first):
    """--no-masks must win over the testbed's default masks.safetensors."""
    out = scored.root / "out_no_masks_tb"
    proc = scored.run(
        out, "--testbed", scored.testbed, "--no-masks", "--no-frag", "--quiet", "--composite-samples", "0"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "score.json").read_text())
    assert result["auc"] is None and result["per_layer"] == []
    assert result["manifest"]["masks"] is None
    assert result["distance"] == first[2]["distance"]
