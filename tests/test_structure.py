"""The layout rules of scripts/structure_report.py hold for the repository, and each rule can fail: a fake tree
that breaks it is caught (a check that cannot fail is a defect)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "structure_report.py"


@pytest.fixture()
def report(monkeypatch):
    spec = importlib.util.spec_from_file_location("structure_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A fake repository: the three packages with faces, plus ``files`` (path -> source)."""
    base = {
        "lacuna_tasks/__init__.py": '_EXPORTS = {n: m for m, ns in {"lacuna_tasks.schema": ("FIELDS",)}.items() for n in ns}\n',
        "lacuna_tasks/schema.py": "FIELDS = ()\n",
        "lacuna_metrics/__init__.py": "_EXPORTS = {}\n",
        "lacuna_metrics/score.py": "from lacuna_tasks import FIELDS\n",
        "lacuna_unlearn/__init__.py": "_EXPORTS = {}\n",
        "lacuna_unlearn/bench/__init__.py": "",
        "lacuna_unlearn/bench/run.py": "import lacuna_metrics\n",
        "benchmarks/bench_x.py": "from lacuna_tasks import FIELDS\n",
        "_lacuna_lmeval_hook.py": "",
    }
    for rel, text in {**base, **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _breaches(report, root: Path) -> list[str]:
    report.ROOT = root
    return report.breaches(report.import_graph())


def test_the_repository_keeps_its_layout():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "layout breaches: 0" in result.stdout


def test_a_clean_fake_tree_has_no_breach(report, tmp_path):
    assert _breaches(report, _tree(tmp_path, {})) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"lacuna_metrics/frag.py": "from lacuna_tasks.schema import FIELDS\n"}, "deep cross-package import"),
        ({"benchmarks/bench_y.py": "from lacuna_metrics.score import x\n"}, "deep cross-package import"),
        ({"benchmarks/bench_y.py": "import lacuna_metrics.score\n"}, "deep cross-package import"),
        ({"lacuna_tasks/prompts.py": "from lacuna_metrics import score\n"}, "layering"),
        ({"lacuna_unlearn/trainer.py": "from lacuna_unlearn.bench import run\n"}, "bench on top"),
        (
            {
                "lacuna_metrics/a.py": "from lacuna_metrics import b\n",
                "lacuna_metrics/b.py": "import lacuna_metrics.a\n",
            },
            "import cycle",
        ),
        (
            {
                "lacuna_metrics/x/__init__.py": "",
                "lacuna_metrics/x/one.py": "from lacuna_metrics.y import two\n",
                "lacuna_metrics/y/__init__.py": "",
                "lacuna_metrics/y/two.py": "",
                "lacuna_metrics/y/three.py": "from lacuna_metrics.x import one\n",
            },
            "folder cycle (depth 2)",
        ),
        ({f"lacuna_metrics/gate_{n}.py": "" for n in ("a", "b", "c")}, "prefix family at a package root"),
        ({"lacuna_metrics/scores.py": ""}, "plural twins"),
    ],
)
def test_each_rule_catches_a_tree_that_breaks_it(report, tmp_path, files, expected):
    found = _breaches(report, _tree(tmp_path, files))
    assert any(line.startswith(expected) for line in found), found


def test_two_modules_of_a_prefix_are_no_family_and_a_face_name_is_no_deep_import(report, tmp_path):
    files = {
        "lacuna_metrics/gate_a.py": "",
        "lacuna_metrics/gate_b.py": "",
        "lacuna_unlearn/bench/gate.py": "from lacuna_tasks import FIELDS\nimport lacuna_metrics\n",
    }
    assert _breaches(report, _tree(tmp_path, files)) == []


def test_the_faces_are_lazy_and_export_what_they_list():
    code = (
        "import sys, lacuna_tasks, lacuna_metrics, lacuna_unlearn\n"
        "assert not {'torch', 'sklearn', 'transformers'} & set(sys.modules), sorted(sys.modules)\n"
        "for m in (lacuna_tasks, lacuna_metrics, lacuna_unlearn):\n"
        "    for name in m.__all__: getattr(m, name)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr
