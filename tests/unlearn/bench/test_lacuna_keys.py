"""Results in LACUNA's key names (lacuna_unlearn.bench.report.lacuna_keys, docs/release.md): the one key table
against the docs' tables, both ways, and the files ``lacuna run`` writes from a ``results.json``.

The results are built here the way ``lacuna run`` assembles a method entry: the behaviour through
:func:`~lacuna_unlearn.bench.behaviour.behaviour` from lm-eval figures, the resurfacing sets through
:func:`~lacuna_unlearn.bench.attacks.resurfacing` from per-person leaks, the intervals through
:func:`lacuna_metrics.rate_interval`; the score part as ``score.json`` sections. ``lacuna score``'s files are
tested against the authors' definitions in tests/metrics/localization/test_release_parity.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from lacuna_unlearn.bench.report.lacuna_keys import (
    KEYS,
    LACUNA_FAMILIES,
    NOTES,
    lacuna_field,
    lacuna_method,
    run_lacuna_files,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "release.md"
#: notes the docs state once for every AUC / p@k key instead of on each row
COMMON_NOTES = {"auc", "universe", "p_at_k"}

# -- the table and the docs ----------------------------------------------------------------------------------------


def docs_rows() -> dict[tuple[str, str], list[str]]:
    """(file, LACUNA key) -> the row's other cells, from docs/release.md's key tables."""
    section = DOCS.read_text().split("### The key tables")[1].split("### Differences in definition")[0]
    rows: dict[tuple[str, str], list[str]] = {}
    file = None
    for line in section.splitlines():
        header = re.match(r"\*\*`([\w.]+\.json)`\*\*", line)
        if header:
            file = header.group(1)
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert file is not None, line
            assert (file, cells[0].strip("`")) not in rows, f"{cells[0]} twice in the {file} table"
            rows[file, cells[0].strip("`")] = cells[1:]
    return rows


def test_every_key_of_the_table_is_in_the_docs_and_back():
    rows = docs_rows()
    table = {(k.file, k.key): k for k in KEYS}
    assert set(rows) == set(table), set(rows) ^ set(table)
    for (file, key), cells in rows.items():
        spec = table[file, key]
        sources = [spec.score, spec.run] if file == "metrics.json" else [spec.run]
        for cell, path in zip(cells, sources, strict=False):  # the lacuna-bench key cells, then the notes
            assert cell == (f"`{path}`" if path else "—"), (key, cell, path)
        noted = {n.strip() for n in cells[-1].split(",") if n.strip()}
        assert noted <= set(spec.notes) and set(spec.notes) - noted <= COMMON_NOTES, (key, noted, spec.notes)


def test_the_mapping_is_one_to_one():
    """Read backwards, every lacuna-bench key names one LACUNA key (per file)."""
    for side in ("run", "score"):
        paths = [(k.file, getattr(k, side)) for k in KEYS if getattr(k, side) is not None]
        assert len(paths) == len(set(paths)), side
    assert len({(k.file, k.key) for k in KEYS}) == len(KEYS)


def test_every_note_is_defined_once_and_explained_in_the_docs():
    text = DOCS.read_text().split("### Differences in definition")[1].split("## Parity")[0]
    used = {n for k in KEYS for n in k.notes}
    assert used <= set(NOTES) and set(NOTES) <= used
    for note in NOTES:
        assert text.count(f"* **`{note}`**") == 1, note


def test_the_keys_name_what_lacuna_bench_computes():
    """LACUNA's families are lacuna-bench's (same names and formulas); behaviour keys are METRIC_TABLE's."""
    from lacuna_metrics import SCORES
    from lacuna_unlearn.bench.metric_table import run_metric_paths

    assert set(LACUNA_FAMILIES) <= {*SCORES, "composite"}
    behaviour = {p for p in run_metric_paths().values() if p.startswith("behaviour.")}
    assert {k.run for k in KEYS if k.run and k.run.startswith("behaviour.")} <= behaviour


def test_field_and_method_directories():
    assert [lacuna_field(f) for f in ("email", "phone", "birth_city", "drivers_license")] == [
        "Email_Address", "Phone_Number", "Birth_City", "Drivers_License",
    ]  # fmt: skip
    assert lacuna_field("Driver's License") == "Drivers_License"
    assert lacuna_method("oracle_grad") == "GradDiff_OracleGrad" and lacuna_method("simnpo") == "SimNPO"
    assert lacuna_method("grad_diff") == "grad_diff"  # LACUNA runs no such method: lacuna-bench's name


# -- the files lacuna run writes ---------------------------------------------------------------------------------


def _entry(field: str, *, attack: bool = True, score: bool = True) -> dict[str, Any]:
    """A method entry as lacuna run assembles it (lacuna_unlearn/bench/method_stages.py)."""
    from lacuna_metrics import rate_interval
    from lacuna_unlearn.bench.attacks import resurfacing
    from lacuna_unlearn.bench.behaviour import behaviour

    lm_eval = {
        f"lacuna_{field}_forget_qa": {"leak_rate": 0.25},
        f"lacuna_{field}_forget_memorization": {"em": 0.5, "es": 0.375, "prob": 0.125},
        f"lacuna_{field}_retain_memorization": {"em": 1.0, "es": 0.875, "prob": 0.75},
        f"lacuna_{field}_retain_paraphrased_memorization": {"em": 0.9, "es": 0.8, "prob": 0.7},
    }
    entry: dict[str, Any] = {
        "checkpoint": {"path": "/ckpts/unlearned", "fingerprint": "sha256:ab"},
        "behaviour": behaviour(lm_eval, field),
    }
    if score:
        families = {"raw": 0.61, "qtile": 0.6, "layernorm": 0.62, "signrev": 0.5, "reversal": 0.39,
                    "dirreversal": 0.5, "composite": 0.64}  # fmt: skip
        entry.update(
            auc={
                t: {"best": {"score": "composite", "value": 0.64}, "families": families} for t in ("forget", "unified")
            },
            per_layer=[
                {"layer": 0, "component": "attention", "auc": {"forget": 0.7, "unified": 0.6, "forget_vs_retain": 0.8}},
                {"layer": 0, "component": "mlp", "auc": {"forget": 0.55, "unified": None, "forget_vs_retain": 0.5}},
            ],
            precision_at_k={
                t: {"raw": {"0.1%": 0.5, "1%": 0.4, "5%": None, "10%": 0.3}, "qtile": {"0.1%": 0.25}}
                for t in ("forget", "unified", "forget_vs_retain")
            },
            localization_settings={"qtile_ties": "average", "per_layer_score": "qtile"},
            not_applicable={"contrast": "needs --control-before/--control-after"},
        )
    if attack:
        unlearned = {"p1": False, "p2": False, "p3": True}
        relearned = {"p1": True, "p2": False, "p3": True}
        sets = resurfacing(unlearned, relearned)
        entry["attack"] = {
            "protocol": "relearn", "attempts": 200, "persons": sets["persons"], "judge": "lacuna",
            "success_at_n_unlearned": sets["success_at_n_unlearned"],
            "pct_resurfaced_of_forgotten": sets["pct_resurfaced_of_forgotten"],
            "ci": {"success_at_n_unlearned": rate_interval({p: float(v) for p, v in unlearned.items()},
                                                           metric="success_at_n_unlearned")},
            "forgotten": len(sets["forgotten"]), "resurfaced": len(sets["resurfaced"]),
        }  # fmt: skip
    return entry


@pytest.fixture()
def written(tmp_path) -> tuple[Path, dict[str, Any], list[Path]]:
    results = {
        "field": "email",
        "by_field": {
            "email": {"methods": {"oracle_grad": _entry("email"), "grad_diff": _entry("email", attack=False)}},
            "phone": {"methods": {"simnpo": _entry("phone", score=False)}},
        },
    }
    out = tmp_path / "lacuna"
    return out, results, run_lacuna_files(results, out)


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_files_land_in_lacunas_layout(written):
    out, _results, paths = written
    run = Path("unlearned_models/Email_Address/GradDiff_OracleGrad")
    precision = Path("cached_notebook_files/precision_metrics")
    expected = {
        run / "Panorama_SUMMARY.json",
        run / "extraction_leakage.json",
        Path("unlearned_models/Email_Address/grad_diff/Panorama_SUMMARY.json"),  # no attack: no leakage file
        Path("unlearned_models/Phone_Number/SimNPO/Panorama_SUMMARY.json"),
        Path("unlearned_models/Phone_Number/SimNPO/extraction_leakage.json"),  # no score: no metrics.json
        *(precision / t / "Email_Address" / m / "metrics.json" for t in ("forget", "unified")
          for m in ("GradDiff_OracleGrad", "grad_diff")),
    }  # fmt: skip
    files = {p.relative_to(out) for p in paths if not p.name.endswith(".provenance.json")}
    assert files == expected
    for path in paths:
        assert path.is_file()
        if not path.name.endswith(".provenance.json"):
            assert path.with_name(path.stem + ".provenance.json") in paths
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*"))  # atomic writes leave nothing behind


def test_panorama_summary_holds_what_was_evaluated_and_nothing_else(written):
    out, results, _ = written
    run = out / "unlearned_models" / "Email_Address" / "GradDiff_OracleGrad"
    summary = _read(run / "Panorama_SUMMARY.json")
    assert summary == {
        "exact_memorization": 0.5, "extraction_strength": 0.375, "forget_Q_A_Prob": 0.125,
        "retain_exact_memorization": 1.0, "retain_extraction_strength": 0.875, "retain_Q_A_Prob": 0.75,
        "retain_exact_memorization_paraphrased": 0.9, "retain_extraction_strength_paraphrased": 0.8,
        "retain_Q_A_Prob_paraphrased": 0.7,
    }  # fmt: skip
    assert list(summary) == sorted(summary)  # OpenUnlearning writes its summary sorted
    provenance = _read(run / "Panorama_SUMMARY.provenance.json")
    assert provenance["schema"] == {"name": "lacuna-bench/lacuna-files", "version": 1}
    assert provenance["written_by"].startswith("lacuna-bench ")
    assert provenance["source"] == "results.json" and provenance["entry"] == "by_field.email.methods.oracle_grad"
    assert provenance["keys"]["forget_Q_A_Prob"] == "behaviour.prob"
    assert provenance["absent"]["forget_Q_A_ROUGE"] == NOTES["not_computed"]
    assert "behaviour.forget_paraphrased_em" in provenance["absent"]["exact_memorization_paraphrased"]
    assert set(provenance["differences"]) == {"label_split", "rows"}


def test_precision_metrics_per_target(written):
    out, _results, _ = written
    base = out / "cached_notebook_files" / "precision_metrics"
    for target in ("forget", "unified"):
        metrics = _read(base / target / "Email_Address" / "GradDiff_OracleGrad" / "metrics.json")
        assert metrics["auc_raw"] == 0.61 and metrics["auc_composite"] == 0.64
        assert metrics["pk_raw"] == {"p@0.1%": 0.5, "p@1%": 0.4, "p@10%": 0.3}  # a None share is left out
        assert metrics["pk_qtile"] == {"p@0.1%": 0.25}
        assert metrics["layer_aucs"] == ({"0_attention": 0.7, "0_mlp": 0.55} if target == "forget"
                                         else {"0_attention": 0.6})  # fmt: skip
        for absent in ("auc_contrast", "auc_crossfield", "pk_composite", "pk_layernorm"):
            assert absent not in metrics
        assert None not in metrics.values()
        provenance = _read(base / target / "Email_Address" / "GradDiff_OracleGrad" / "metrics.provenance.json")
        assert provenance["target"] == target
        assert provenance["localization_settings"]["qtile_ties"] == "average"
        assert provenance["not_applicable"]["contrast"].startswith("needs --control")
        assert f"auc.{target}.families.contrast" in provenance["absent"]["auc_contrast"]
        assert {"auc", "universe", "ties", "reference", "composite_fit"} <= set(provenance["differences"])


def test_extraction_leakage_in_lacunas_keys(written):
    out, _results, _ = written
    run = out / "unlearned_models" / "Email_Address" / "GradDiff_OracleGrad"
    assert _read(run / "extraction_leakage.json") == {
        "field": "Email_Address", "attempts": 200, "total_forget_people": 3, "still_leaking_after_unlearn": 1,
        "forgotten_by_unlearn": 2, "resurfaced_after_relearn": 1, "pct_resurfaced_of_forgotten": 50.0,
    }  # fmt: skip
    provenance = _read(run / "extraction_leakage.provenance.json")
    assert provenance["attack"] == {"protocol": "relearn", "judge": "lacuna", "attempts": 200, "persons": 3}
    assert {"probe_prompt", "judge", "rounded"} <= set(provenance["differences"])


def test_percentages_are_rounded_as_lacuna_writes_them(tmp_path):
    entry = _entry("email", score=False)
    entry["attack"]["pct_resurfaced_of_forgotten"] = 100 / 3
    run_lacuna_files({"by_field": {"email": {"methods": {"simnpo": entry}}}}, tmp_path)
    leakage = _read(tmp_path / "unlearned_models" / "Email_Address" / "SimNPO" / "extraction_leakage.json")
    assert leakage["pct_resurfaced_of_forgotten"] == 33.33
