"""lacuna_metrics.layout: a lacuna-bench testbed and a regime directory of the LACUNA release resolve to the same
roles; anything else is refused naming what it holds (docs/release.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lacuna_metrics import LayoutError, resolve_testbed


def _release(root: Path, *, tuned: str = "intruction_tuned", mask: bool = True, unmasked: bool = True) -> Path:
    size = root / "OLMo2-1B"
    masked = size / "masked"
    (masked / tuned).mkdir(parents=True)
    (masked / "model.safetensors").write_bytes(b"")
    if mask:
        (masked / "mask.pt").write_bytes(b"")
    (size / "data-masked" / "data").mkdir(parents=True)
    if unmasked:
        (size / "unmasked" / "intruction_tuned").mkdir(parents=True)
        (size / "unmasked" / "model.safetensors").write_bytes(b"")
        (size / "data-unmasked" / "data").mkdir(parents=True)
    return masked


def test_resolve_testbed(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "manifest.json").write_text("{}")
    layout = resolve_testbed(tmp_path)
    assert layout.kind == "testbed" and not layout.is_release
    assert (layout.before, layout.base, layout.data, layout.masks) == (
        tmp_path / "model", tmp_path / "base", tmp_path / "data", tmp_path / "masks.safetensors",
    )  # fmt: skip
    assert layout.control_before is None and layout.notes == ()


def test_release_masked_regime(tmp_path):
    masked = _release(tmp_path)
    layout = resolve_testbed(masked)
    assert layout.is_release and (layout.size, layout.regime) == ("OLMo2-1B", "masked")
    assert layout.before == masked / "intruction_tuned"  # the published (misspelt) folder
    assert layout.masks == masked / "mask.pt"
    assert layout.data == tmp_path / "OLMo2-1B" / "data-masked"
    assert layout.base == masked  # the authors' reversal reference: the model after continual pretraining
    assert layout.control_before == tmp_path / "OLMo2-1B" / "unmasked" / "intruction_tuned"
    assert layout.notes == ()
    assert layout.unlearned_dir("Email_Address", "SimNPO") == masked / "unlearned_models" / "Email_Address" / "SimNPO"


def test_release_corrected_folder_and_control_after(tmp_path):
    masked = _release(tmp_path, tuned="instruction_tuned")
    layout = resolve_testbed(masked)
    assert layout.before == masked / "instruction_tuned"
    assert any("instruction_tuned/" in n for n in layout.notes)
    after = masked / "unlearned_models" / "Email_Address" / "SimNPO"
    after.mkdir(parents=True)
    assert layout.control_after_for(after) is None  # no unmasked run of the method yet
    twin = tmp_path / "OLMo2-1B" / "unmasked" / "unlearned_models" / "Email_Address" / "SimNPO"
    twin.mkdir(parents=True)
    assert layout.control_after_for(after) == twin
    assert layout.control_after_for(tmp_path) is None  # not under unlearned_models/


def test_release_unmasked_regime_and_missing_parts(tmp_path):
    _release(tmp_path)
    unmasked = resolve_testbed(tmp_path / "OLMo2-1B" / "unmasked")
    assert unmasked.masks is None and unmasked.control_before is None
    assert any("mask.pt" in n and "unmasked regime" in n for n in unmasked.notes)
    other = tmp_path / "other"
    masked = _release(other, mask=False, unmasked=False)
    (other / "OLMo2-1B" / "data-masked" / "data").rmdir()
    (other / "OLMo2-1B" / "data-masked").rmdir()
    layout = resolve_testbed(masked)
    assert layout.masks is None and layout.data is None and layout.control_before is None
    assert len(layout.notes) == 3


def test_neither_layout_names_what_it_found(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(
        LayoutError, match=r"--testbed X: not a testbed: expected .*intruction_tuned/.*found: notes.txt, weights/"
    ):
        resolve_testbed(tmp_path, name="--testbed X")
    with pytest.raises(LayoutError, match="not a directory"):
        resolve_testbed(tmp_path / "notes.txt")
