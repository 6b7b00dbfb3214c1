"""The per-field task YAMLs in ``task_yamls/`` are what ``scripts/generate_task_yamls.py`` makes of its template."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import REPO

SCRIPT = REPO / "scripts" / "generate_task_yamls.py"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("generate_task_yamls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_task_yamls_are_current(generator, tmp_path):
    """Byte for byte: a hand edit of a generated file, or a template edit without a rerun, fails here."""
    assert generator.main(["--out", str(tmp_path)]) == 0
    ours = sorted(p.name for p in tmp_path.iterdir())
    assert len(ours) == 4 * 16 + 1  # 16 files per field, and the lacuna group
    stale = [p.name for p in generator.stale_files(REPO / "task_yamls", dict.fromkeys(ours, ""))]
    assert not stale, f"generated files the template no longer makes: {stale}"
    differ = [name for name in ours if (tmp_path / name).read_bytes() != (REPO / "task_yamls" / name).read_bytes()]
    assert not differ, f"task_yamls/ is not current; run `python scripts/generate_task_yamls.py`: {differ}"
    assert generator.main(["--check"]) == 0


def test_generated_files_say_so_and_hand_written_ones_do_not(generator):
    for path in sorted((REPO / "task_yamls").glob("*.yaml")):
        generated = path.read_text(encoding="utf-8").startswith(generator.GENERATED_MARK)
        assert generated != (path.name.startswith("_") or path.name == "lacuna_neutral_ppl.yaml"), path.name


def test_render_is_deterministic_and_rejects_bad_templates(generator):
    template = "# comment\n=== t_{field}.yaml\ntask: t_{field}\n"
    files = generator.render(template, ["b", "a"])
    assert list(files) == ["lacuna.yaml", "t_a.yaml", "t_b.yaml"]
    assert files["t_a.yaml"].endswith("task: t_a\n") and "# comment" not in files["t_a.yaml"]
    assert "  - lacuna_b\n  - lacuna_a\n" in files["lacuna.yaml"]  # the fields' order, as given
    assert generator.render(template, ["b", "a"]) == files
    with pytest.raises(ValueError, match="containing"):
        generator.render("=== fixed.yaml\ntask: x\n", ["a"])
    with pytest.raises(ValueError, match="no '=== "):
        generator.render("task: x\n", ["a"])


def test_check_reports_a_hand_edit_and_write_removes_stale_files(generator, tmp_path, capsys):
    files = generator.generated_files()
    generator.write(tmp_path, files)
    name = "lacuna_email_forget_qa.yaml"
    (tmp_path / name).write_text((tmp_path / name).read_text() + "# hand edit\n")
    stale = tmp_path / "lacuna_ssn_forget_qa.yaml"
    stale.write_text(generator.GENERATED_MARK + " from a field that is gone\n")
    (tmp_path / "_mine.yaml").write_text("# hand-written, kept\n")
    assert generator.main(["--check", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split() == ["not", "current:", str(tmp_path / name), "not", "current:", str(stale)]
    assert sorted(generator.write(tmp_path, files)) == sorted([name, stale.name])
    assert not stale.exists() and (tmp_path / "_mine.yaml").exists()
    assert generator.differences(tmp_path, files) == []
