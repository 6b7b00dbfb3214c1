"""The human views of a run (report.md, plots/*.png) and of a score (roc.png, layers.png), from hand-built
results: persons beside every rate, one legend line per column, the regime footnote, every field of a multi-field
run, readable plot sizes, and the best score's ROC curve. No model is trained here."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from matplotlib.image import imread

from lacuna_metrics.plots import roc_series, write_plots
from lacuna_metrics.report import markdown_summary
from lacuna_unlearn.bench.report.markdown import run_markdown, write_run_report
from lacuna_unlearn.bench.report.plots import _axis_ranges
from lacuna_unlearn.bench.report.tables import disagrees

TARGETS = ("forget", "unified", "forget_vs_retain")


def _behaviour(leak, retain, *, forget_n=6, retain_n=5, j_w=None):
    values = {"forget_leak": leak, "retain_accuracy": retain, "j_w": j_w, "em": 0.5, "es": 0.25, "prob": 0.125}
    n = {k: None if v is None else (retain_n if k.startswith("retain") else forget_n) for k, v in values.items()}
    return {**values, "n": n}


def _per_layer(forget_mass, skip=()):
    rows = []
    for layer in range(3):
        for component in ("attention", "mlp"):
            none = (layer, component) in skip
            rows.append(
                {
                    "layer": layer,
                    "component": component,
                    "update_mass": {
                        "forget": None if none else forget_mass,
                        "retain": None if none else 1 - forget_mass,
                        "outside": None if none else 0.0,
                    },
                    "auc": {t: 0.5 if none else 0.55 for t in TARGETS},
                }
            )
    return rows


def _method(auc_f, leak, rel_leak, retain, rel_retain, success, regime, reversible, *, skip=()):
    return {
        "behaviour": _behaviour(leak, retain, j_w=leak),
        "relearned_behaviour": {"forget_leak": rel_leak, "retain_accuracy": rel_retain},
        "auc": {
            t: {
                "best": {"score": "composite", "value": auc_f},
                "raw": 0.5,
                "calibrated_best": {"score": "raw", "value": auc_f - 0.01} if auc_f > 0.545 else {"value": None},
                "best_lift": {"score": "raw", "value": 0.3} if auc_f > 0.545 else {"value": None},
                "null": {"family": "raw", "auc": 0.52, "sd": 0.01} if auc_f > 0.545 else None,
                "families": {"raw": auc_f - 0.01, "composite": auc_f, "reversal": 0.62},
            }
            for t in TARGETS
        },
        "frag": 0.01,
        "per_layer": _per_layer(0.48 if auc_f < 0.9 else 1.0, skip),
        "attack": {
            "protocol": "relearn",
            "attempts": 200,
            "persons": 6,
            "success_at_n_unlearned": success[0],
            "success_at_n_relearned": success[1],
        },
        "regime": {
            "regime": regime,
            "reversible": reversible,
            "recovery_ratio": None if reversible is None else float(reversible),
            "thresholds": {"tau_rev": 0.5, "tau_cat": 0.2, "relative": False},
        },
    }


def _run(fields=("email",)):
    """The shape of a ``lacuna run`` results.json: a suppressing method ("irreversible" by the QA leak while the
    extraction probe still finds everything), an eraser (zero bars), an oracle far above the others."""
    methods = {
        "grad_diff": _method(
            0.54, 0.0, 0.0, 1.0, 0.4, (1.0, 1.0), "irreversible_noncatastrophic", False, skip={(2, "mlp")}
        ),
        "memflex": _method(0.541, 0.0, 0.0, 1.0, 1.0, (0.0, 0.0), "irreversible_noncatastrophic", False),
        "oracle_grad": _method(1.0, 1.0, 1.0, 1.0, 1.0, (1.0, 1.0), "no_forgetting", None),
    }
    by_field = {f: {"baseline": {"behaviour": _behaviour(1.0, 1.0)}, "methods": copy.deepcopy(methods)} for f in fields}
    first = by_field[fields[0]]
    trivial = {t: {"before_magnitude": 0.51, "injection_magnitude": 0.517} for t in TARGETS}
    return {
        "schema": {"name": "lacuna-bench/run", "version": 1},
        "preset": "smoke",
        "field": fields[0],
        "baseline": {**first["baseline"], "auc": trivial},
        "methods": first["methods"],
        "by_field": by_field,
        "manifest": {"wall_seconds": 12.0},
    }


def _row(report: str, name: str) -> list[str]:
    line = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _header(report: str) -> list[str]:
    line = next(line for line in report.splitlines() if line.startswith("| method |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_every_rate_carries_its_persons():
    report = run_markdown(_run())
    header = _header(report)
    cells = dict(zip(header, _row(report, "grad_diff"), strict=True))
    assert cells["forget leak: unlearned → attack=relearn"] == "0.00 → 0.00 (n=6)"
    assert cells["retain acc: unlearned → attack=relearn"] == "1.00 → 0.40 (n=5)"  # relearned retain acc in the table
    assert cells["J_W"] == "0.00 (n=6)"
    assert cells["Success@200: unlearned → attack=relearn"] == "1.00 → 1.00 (n=6)"
    assert cells["forget EM / ES / Prob"] == "0.50 / 0.25 / 0.12 (n=6)"
    base = dict(zip(header, _row(report, "before unlearning"), strict=True))
    assert base["forget leak: unlearned → attack=relearn"] == "1.00 (n=6)"
    assert base["retain acc: unlearned → attack=relearn"] == "1.00 (n=5)"
    # every rate cell of every method row names its n
    for name in ("grad_diff", "memflex", "oracle_grad"):
        row = dict(zip(header, _row(report, name), strict=True))
        rates = [
            "forget EM / ES / Prob",
            "forget leak: unlearned → attack=relearn",
            "retain acc: unlearned → attack=relearn",
        ]
        for column in [*rates, "J_W", "Success@200: unlearned → attack=relearn"]:
            assert re.search(r"\(n=\d+\)$", row[column]), (name, column, row[column])
        assert row["held-out retain acc"] == row["cross-field acc"] == "n/a"  # not in these results


def test_intervals_are_shown_where_the_results_carry_them():
    """Interval records (results.json schema 2) and the two-number lists of schema 1 render alike."""
    results = _run()
    beh = results["methods"]["grad_diff"]["behaviour"]
    beh["ci"] = {"forget_leak": [0.0, 0.39]}
    results["methods"]["grad_diff"]["attack"]["ci"] = {"success_at_n_relearned": [0.61, 1.0]}
    cells = dict(zip(_header(run_markdown(results)), _row(run_markdown(results), "grad_diff"), strict=True))
    assert cells["forget leak: unlearned → attack=relearn"] == "0.00 [0.00, 0.39] → 0.00 (n=6)"
    assert cells["Success@200: unlearned → attack=relearn"] == "1.00 → 1.00 [0.61, 1.00] (n=6)"
    from lacuna_metrics.behaviour.intervals import rate_interval

    beh["ci"] = {"forget_leak": rate_interval([0.0] * 6, metric="forget_leak")}
    results["methods"]["grad_diff"]["attack"]["ci"] = {
        "success_at_n_relearned": rate_interval([1.0] * 6, metric="success_at_n_relearned")
    }
    cells = dict(zip(_header(run_markdown(results)), _row(run_markdown(results), "grad_diff"), strict=True))
    assert cells["forget leak: unlearned → attack=relearn"] == "0.00 [0.00, 0.46] → 0.00 (n=6)"
    assert cells["Success@200: unlearned → attack=relearn"] == "1.00 → 1.00 [0.54, 1.00] (n=6)"


def test_cells_on_fewer_than_five_persons_are_marked_and_footnoted():
    results = _run()
    report = run_markdown(results)
    assert "‡" not in report.split("## Reading this table")[0]  # 5 and 6 persons: no mark, no footnote
    assert "‡ marks fewer than 5" in report  # the legend says what the mark means
    results["methods"]["grad_diff"]["behaviour"]["n"]["forget_leak"] = 4
    results["methods"]["grad_diff"]["attack"]["persons"] = 2
    report = run_markdown(results)
    cells = dict(zip(_header(report), _row(report, "grad_diff"), strict=True))
    assert cells["forget leak: unlearned → attack=relearn"] == "0.00 → 0.00 (n=4)‡"
    assert cells["Success@200: unlearned → attack=relearn"] == "1.00 → 1.00 (n=2)‡"
    assert cells["J_W"] == "0.00 (n=6)"
    assert "‡" not in "".join(_row(report, "memflex"))
    footnote = next(line for line in report.splitlines() if line.startswith("‡ "))
    assert "Fewer than 5 persons" in footnote
    assert "0 of 4: [0.00, 0.60]" in footnote and "1 of 1: [0.03, 1.00]" in footnote
    assert sum(line.startswith("‡ ") for line in report.splitlines()) == 1


def test_legend_has_one_line_per_column():
    report = run_markdown(_run())
    legend = report.split("## Reading this table", 1)[1]
    items = [line for line in legend.splitlines() if line.startswith("- **")]
    for term in ("n", "forget EM / ES / Prob", "forget leak", "retain acc", "J_W", "AUC(F) / AUC(F-R) / AUC(F vs R)",
                 "trivial detector", "FRAG", "Success@N", "regime"):  # fmt: skip
        assert sum(line.startswith(f"- **{term}**") for line in items) == 1, term
    assert not [line for line in legend.splitlines() if line.startswith("  ")]  # no continuation lines
    assert "tau_rev = 0.5" in legend and "tau_cat = 0.2" in legend


def test_regime_footnote_only_where_it_contradicts_success_at_n():
    results = _run()
    report = run_markdown(results)
    assert _row(report, "grad_diff")[-1] == "irreversible_noncatastrophic (ρ=0.00) †"
    assert "†" not in _row(report, "memflex")[-1] and "†" not in _row(report, "oracle_grad")[-1]
    footnote = next(line for line in report.splitlines() if line.startswith("† "))
    assert "QA forget leak" in footnote and "extraction probe" in footnote and "tau_rev = 0.5" in footnote
    assert disagrees(results["methods"]["grad_diff"]) and not disagrees(results["methods"]["memflex"])
    reversible = _method(0.5, 0.0, 1.0, 1.0, 1.0, (0.0, 0.0), "reversible_noncatastrophic", True)
    assert disagrees(reversible)  # reversible by the QA leak, nothing extractable by the probe
    del results["by_field"]["email"]["methods"]["grad_diff"]  # results["methods"] is the same dict
    assert "† " not in run_markdown(results)


def test_every_field_of_a_multi_field_run_is_reported(tmp_path):
    results = _run(("email", "phone"))
    results["by_field"]["phone"]["methods"]["grad_diff"]["behaviour"]["forget_leak"] = 0.5
    report = run_markdown(results)
    assert report.startswith("# lacuna run: smoke testbed, fields `email`, `phone`")
    email, phone = report.split("## Field `email`", 1)[1].split("## Field `phone`", 1)
    assert "| grad_diff | 0.50 / 0.25 / 0.12 (n=6) | 0.00 → 0.00 (n=6)" in email
    assert "| grad_diff | 0.50 / 0.25 / 0.12 (n=6) | 0.50 → 0.00 (n=6)" in phone
    names = {p.name for p in write_run_report(tmp_path, results)}
    assert names == {"report.md", "auc.png", "layers.png", "relearning.png"} | {
        "auc-phone.png", "layers-phone.png", "relearning-phone.png"
    }  # fmt: skip


def test_older_results_without_by_field_still_render():
    results = _run()
    del results["by_field"]
    for block in (results["baseline"]["behaviour"], *(m["behaviour"] for m in results["methods"].values())):
        del block["n"]  # written before persons were counted
    report = run_markdown(results)
    cells = dict(zip(_header(report), _row(report, "grad_diff"), strict=True))
    assert cells["forget leak: unlearned → attack=relearn"] == "0.00 → 0.00"  # no persons recorded, none shown
    assert cells["Success@200: unlearned → attack=relearn"] == "1.00 → 1.00 (n=6)"  # the attack always recorded them


def _with_reversibility(results: dict) -> dict:
    """grad_diff's entry as the reversibility protocol leaves it: restricted relearning from each source, the regime
    read from the source that recovered most (forget), the held-out attack's regime kept aside."""
    method = results["methods"]["grad_diff"]
    n = {"forget_leak": 6, "retain_accuracy": 5}
    method["reversibility"] = {
        "protocol": "restricted_relearning",
        "sources": {
            "forget": {"forget_leak": 0.8, "retain_accuracy": 1.0, "n": n, "ci": {"forget_leak": [0.5, 1.0]}},
            "retain": {"forget_leak": 0.2, "retain_accuracy": 1.0, "n": n, "ci": {}},
            "unrelated": {"forget_leak": 0.0, "retain_accuracy": 1.0, "n": n, "ci": {}},
        },
        "regime": {"regime": "reversible_noncatastrophic", "source": "forget", "recovery_ratio": 0.8},
    }
    method["heldout_regime"] = method["regime"]
    method["regime"] = {**method["reversibility"]["regime"], "reversible": True, "protocol": "restricted_relearning"}
    return results


def test_the_relearned_columns_name_the_relearning_they_show():
    """The forget leak, retain acc and Success@N columns after relearning show the relearning attack of `lacuna
    attack` (attack=relearn, held-out memorized people); the regime comes from restricted relearning, whose leaks get
    their own column: the regime's source first, then the others."""
    results = _with_reversibility(_run())
    report = run_markdown(results)
    header = _header(report)
    assert "forget leak: unlearned → relearned" not in header
    assert header[2:5] == [
        "forget leak: unlearned → attack=relearn",
        "forget leak: unlearned → restricted relearning (regime)",
        "retain acc: unlearned → attack=relearn",
    ]
    cells = dict(zip(header, _row(report, "grad_diff"), strict=True))
    assert cells["forget leak: unlearned → attack=relearn"] == "0.00 → 0.00 (n=6)"  # the attack's relearned model
    assert cells["forget leak: unlearned → restricted relearning (regime)"] == (
        "0.00 → 0.80 [0.50, 1.00] (n=6) from forget; retain 0.20, unrelated 0.00"
    )
    assert cells["regime"] == "reversible_noncatastrophic (ρ=0.80, from forget)"
    memflex = dict(zip(header, _row(report, "memflex"), strict=True))
    assert memflex["forget leak: unlearned → restricted relearning (regime)"] == "n/a"  # regime from the attack
    legend = report.split("## Reading this table", 1)[1]
    assert "- **forget leak: unlearned → restricted relearning (regime)**" in legend
    rows = ("before unlearning", "grad_diff", "trivial detector (abs before / abs injection)")
    assert all(len(_row(report, name)) == len(header) for name in rows)
    trivial = dict(zip(header, _row(report, "trivial detector (abs before / abs injection)"), strict=True))
    assert trivial["J_W"] == "" and trivial["AUC(F)"] == "0.510 / 0.517"  # the detector's AUCs under the AUCs


def test_relearning_plot_names_each_relearning(tmp_path, monkeypatch):
    """plots/relearning.png labelled the held-out attack's QA leak "the regime's input" while the regime came from
    restricted relearning: each mark now names its relearning, and the regime's own relearned leak is drawn."""
    from lacuna_unlearn.bench.report import plots

    drawn = {}
    real = plots.save_figure

    def capture(fig, path):
        drawn[path.name] = fig
        return real(fig, path)

    monkeypatch.setattr(plots, "save_figure", capture)
    results = _with_reversibility(_run())
    plots.write_field_plots(tmp_path, results["methods"], {}, field="email")
    fig = drawn["relearning.png"]
    (ax,) = fig.axes
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "Success@200, after attack=relearn" in labels
    assert "QA forget leak after attack=relearn" in labels  # not the regime's input: grad_diff's regime is not
    restricted = next(lab for lab in labels if "restricted relearning" in lab)
    assert "the regime's input" in restricted
    assert "unlearned → after attack=relearn" in ax.get_title()
    triangles = next(c for c in ax.collections if c.get_label() == restricted)
    leaks = np.ma.filled(triangles.get_offsets()[:, 1], np.nan)  # matplotlib masks the NaN (no mark)
    assert leaks[0] == pytest.approx(0.8) and np.isnan(leaks[1:]).all()  # grad_diff's forget source only
    assert "forget" in [t.get_text() for t in ax.texts]
    # without the protocol anywhere, the attack's leak is the regime's input and says so
    drawn.clear()
    plots.write_field_plots(tmp_path, _run()["methods"], {}, field="email")
    labels = [t.get_text() for t in drawn["relearning.png"].legends[0].get_texts()]
    assert "QA forget leak after attack=relearn (the regime's input)" in labels
    assert not [lab for lab in labels if "restricted" in lab]


def test_run_plots_are_written_at_readable_sizes(tmp_path):
    paths = {p.name: p for p in write_run_report(tmp_path, _run())}
    assert set(paths) == {"report.md", "auc.png", "layers.png", "relearning.png"}
    assert (tmp_path / "report.md").read_text() == run_markdown(_run())
    for name in ("auc.png", "layers.png", "relearning.png"):
        height, width = imread(paths[name]).shape[:2]
        assert height >= 400 and width >= 700, (name, height, width)
    # layers.png: one row per method, not a thin strip
    height, width = imread(paths["layers.png"]).shape[:2]
    assert width / height < 4, (height, width)


def test_auc_plot_reads_the_calibrated_verdict_and_its_null():
    """plots/auc.png drew the uncalibrated best while the README says "against the null updates" (issue 34): the bar
    is the calibrated best (none: no bar, "no verdict"), the band its null's mean ± 2 sd, the marks every family."""
    from lacuna_unlearn.bench.report.plots import _auc_value, _family_values, _null_band

    methods = _run()["methods"]
    assert _auc_value(methods["oracle_grad"], "forget") == pytest.approx(0.99)  # calibrated, not the 1.0 composite
    assert _auc_value(methods["grad_diff"], "forget") != _auc_value(methods["grad_diff"], "forget")  # NaN: none
    assert _null_band(methods["oracle_grad"], "forget") == pytest.approx((0.50, 0.54))
    assert _null_band(methods["grad_diff"], "forget") is None
    assert sorted(_family_values(methods["oracle_grad"], "forget")) == pytest.approx([0.62, 0.99, 1.0])
    old = {"auc": {"forget": {"best": {"score": "raw", "value": 0.7}}}}  # a results.json from before calibration
    assert _auc_value(old, "forget") == 0.7


def test_auc_axis_zooms_to_the_data_and_breaks_for_an_outlier():
    (one,) = _axis_ranges([0.5, 0.54, 0.541, 0.478, 0.51])
    assert 0.45 < one[0] < 0.478 and 0.542 < one[1] < 0.6  # zoomed around 0.5, not from 0
    upper, lower = _axis_ranges([0.5, 0.54, 0.541, 0.478, 0.51, 1.0])
    assert lower[0] < 0.478 and lower[1] < 0.6 and upper[0] < 1.0 < upper[1] and upper[0] > 0.9


def _score(best: str = "composite", with_best_curve: bool = True):
    curve = {"fpr": [0.0, 0.5, 1.0], "tpr": [0.0, 0.6, 1.0]}
    auc, roc = {}, {}
    for t in TARGETS:
        auc[t] = {"raw": 0.52, "qtile": 0.55, "reversal": 0.51, "signrev": 0.5, "layernorm": 0.53, "composite": 0.6}
        auc[t]["best"] = {"score": best, "value": auc[t][best]}
        roc[t] = {s: curve for s in ("raw", "qtile", "reversal", "signrev", "layernorm", "before_magnitude")}
        if with_best_curve:
            roc[t]["composite"] = curve
    return {
        "auc": auc,
        "roc": roc,
        "baselines": {t: {"before_magnitude": 0.51, "injection_magnitude": None} for t in TARGETS},
        "per_layer": [
            {"layer": r["layer"], "component": r["component"], "update_mass": r["update_mass"], "auc": r["auc"]}
            for r in _per_layer(0.47, skip={(0, "attention")})
        ],
        "localization_settings": {"per_layer_score": "qtile"},
    }


def test_roc_draws_the_best_curve_first(tmp_path):
    series = roc_series(_score(), "forget", top=3)
    assert [(s["kind"], s["score"]) for s in series] == [
        ("best", "composite"), ("score", "qtile"), ("score", "layernorm"), ("score", "raw"),
        ("baseline", "before_magnitude"),
    ]  # fmt: skip
    assert series[0]["curve"] is not None and series[0]["label"] == "best: composite (0.600)"
    # a score JSON from before composite curves were stored: the best still leads the legend, marked
    missing = roc_series(_score(with_best_curve=False), "forget")[0]
    assert missing["curve"] is None and missing["label"] == "best: composite (0.600; curve not stored)"
    # the best is a stored single score: drawn once, as the best
    qtile = roc_series(_score(best="qtile"), "unified")
    assert [s["score"] for s in qtile].count("qtile") == 1 and qtile[0]["score"] == "qtile"
    paths = {p.name: p for p in write_plots(_score(), tmp_path)}
    assert set(paths) == {"roc.png", "layers.png"}
    for path in paths.values():
        height, width = imread(path).shape[:2]
        assert height >= 300 and width >= 600


def test_sample_roc_area_is_the_auc():
    from sklearn.metrics import roc_auc_score

    from lacuna_metrics.localization.composite import sample_roc

    rng = np.random.default_rng(0)
    y = rng.random(3000) < 0.3
    scores = np.round(rng.normal(size=3000) + 0.7 * y, 1)  # ties
    curve = sample_roc(scores, y, max_points=10_000)
    area = np.trapezoid(curve["tpr"], curve["fpr"])
    assert area == pytest.approx(roc_auc_score(y, scores), abs=1e-5)
    assert curve["fpr"][0] == curve["tpr"][0] == 0.0 and curve["fpr"][-1] == curve["tpr"][-1] == 1.0


def test_score_markdown_still_renders():
    result = _score()
    result.update(
        manifest={"inputs": {"after": {"path": "a"}, "before": {"path": "b"}}},
        auc_error_bound={t: {} for t in TARGETS},
        not_applicable={},
        universe={"tensors": 1, "scalars": 10, "forget": 2, "retain": 2, "outside": 6},
    )
    assert "| best | **composite** 0.6000" in markdown_summary(result)


def test_score_markdown_headlines_the_calibrated_verdict_and_marks_excluded_families():
    """A bf16 save of an unchanged model was headlined "best unified AUC 1.0" in score.md while the JSON's
    calibration excluded that family: the headline is now the calibrated best, excluded families carry a †, and a
    zero update says so."""
    result = _score()
    result.update(
        manifest={"inputs": {"after": {"path": "a"}, "before": {"path": "b"}}},
        auc_error_bound={t: {} for t in TARGETS},
        not_applicable={},
        universe={"tensors": 1, "scalars": 10, "forget": 2, "retain": 2, "outside": 6},
        distance={"l2": 0.0},
    )
    cal = {"best": {"score": "raw", "value": 0.52}, "best_lift": {"score": "raw", "value": 0.01}}
    result["null_calibration"] = {
        "targets": {
            "forget": {**cal, "excluded": {"composite": "null AUC 0.600 outside 0.5 ± 0.05"}},
            "unified": {"best": {"score": None, "value": None, "reason": "x"}, "best_lift": {}, "excluded": {}},
            "forget_vs_retain": {**cal, "excluded": {}},
        }
    }
    text = markdown_summary(result)
    assert "| **calibrated best** (lift) | **raw** 0.5200 (+0.0100) | none passed | **raw** 0.5200 (+0.0100) |" in text
    assert "| best, uncalibrated | composite 0.6000" in text and "| best | **composite**" not in text
    composite = next(line for line in text.splitlines() if line.startswith("| composite |"))
    assert composite.split(" | ")[1].endswith("†") and not composite.split(" | ")[2].endswith("†")
    assert "Warning: the update is zero" in text


def test_behaviour_counts_the_fields_persons(tmp_path):
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset
    from lacuna_unlearn.bench.behaviour import behaviour

    profiles = generate_profiles(48, seed=7)
    data = write_dataset(tmp_path / "data", profiles, build_splits(profiles, seed=7, people_per_field=5))
    loaded = load_data(data)
    forget = len({r["ID"] for r in loaded.rows("forget", "phone")})
    retain = len({r["ID"] for r in loaded.rows("retain", "phone")})
    results = {
        "lacuna_phone_forget_qa": {"leak_rate": 0.2},
        "lacuna_phone_retain_qa": {"accuracy": 1.0},
        "lacuna_phone_forget_memorization": {"em": 0.5, "es": 0.5, "prob": 0.3},
        "lacuna_phone_retain_memorization": {"em": 0.9, "es": 0.8, "prob": 0.7},
    }
    got = behaviour(results, "phone", data)
    assert got["forget_leak"] == 0.2 and forget == 5
    assert got["n"]["forget_leak"] == got["n"]["em"] == forget and got["n"]["retain_accuracy"] == retain
    # the retain twins LACUNA's Panorama summary reports too; the paraphrased ones did not run
    assert (got["retain_em"], got["retain_es"], got["retain_prob"]) == (0.9, 0.8, 0.7)
    assert got["n"]["retain_em"] == retain and got["forget_paraphrased_em"] is None
    assert got["n"]["retain_paraphrased_prob"] is None
    assert got["n"]["j_w"] is None and got["n"]["retain_j_avg"] is None  # tasks that did not run
    assert "n" not in behaviour(results, "phone")  # no data: no counts (the old shape)


def test_behaviour_intervals_are_over_persons():
    """With the evaluation's per-person values, every rate gets n = persons observed and an exact interval over
    persons (k, n and method beside it) that contains the rate; a metric that did not run gets neither."""
    from lacuna_metrics.behaviour.intervals import clopper_pearson
    from lacuna_unlearn.bench.behaviour import behaviour

    leak = {f"p{i}": float(i < 3) for i in range(10)}  # 3 of 10 persons leak
    shares = {f"p{i}": (0.0, 1 / 3, 2 / 3, 1.0)[i % 4] for i in range(8)}  # 3 questions per person
    results = {
        "lacuna_email_forget_qa": {"leak_rate": 0.3},
        "lacuna_email_forget_worstcase": {"j_w": 0.3},
        "lacuna_email_crossfield_qa": {"accuracy": 0.5},
    }
    persons = {
        "lacuna_email_forget_qa": {"leak_rate": leak},
        "lacuna_email_forget_worstcase": {"j_w": leak, "j_icr": {}},
        "lacuna_email_crossfield_qa": {"accuracy": shares},
    }
    got = behaviour(results, "email", None, persons)
    assert got["n"]["forget_leak"] == got["n"]["j_w"] == 10
    ci = got["ci"]["forget_leak"]
    assert (ci["low"], ci["high"]) == clopper_pearson(3, 10)
    assert ci["k"] == 3 and ci["n"] == 10 and ci["level"] == 0.95 and ci["method"] == "clopper_pearson"
    assert ci["low"] < 0.3 < ci["high"] and 0.0 <= ci["low"] and ci["high"] <= 1.0
    cross = got["ci"]["crossfield_accuracy"]
    assert cross["method"] == "clopper_pearson_fractional" and cross["k"] == pytest.approx(4.0) and cross["n"] == 8
    assert got["ci"]["j_icr"] is None and got["n"]["j_icr"] is None
    assert got["ci"]["retain_accuracy"] is None


def test_a_multi_field_run_pools_each_rate_over_fields_with_an_exact_interval():
    """Issue 35 item 5: one row per method over every field, n = people x fields, k summed, Clopper-Pearson."""
    from lacuna_unlearn.bench.run import pooled

    def entry(k: int, n: int) -> dict:
        ci = {"low": 0.0, "high": 1.0, "k": k, "n": n, "level": 0.95, "method": "clopper_pearson"}
        return {"behaviour": {"forget_leak": k / n, "ci": {"forget_leak": ci}}, "regime": {"regime": "undetermined"}}

    by_field = {"email": {"methods": {"a": entry(0, 5), "b": entry(5, 5)}},
                "phone": {"methods": {"a": entry(1, 5)}}}  # fmt: skip
    out = pooled(by_field)
    assert set(out) == {"a"}  # b is missing in one field: never pooled over fewer fields
    leak = out["a"]["rates"]["forget_leak"]
    assert leak["value"] == pytest.approx(0.1) and leak["ci"]["n"] == 10 and leak["ci"]["k"] == 1
    from scipy.stats import binomtest

    ref = binomtest(1, 10).proportion_ci(method="exact")
    assert (leak["ci"]["low"], leak["ci"]["high"]) == pytest.approx((ref.low, ref.high))
    results = _run(fields=("email", "phone"))
    results["pooled"] = out
    assert "## Pooled over the fields (email, phone)" in run_markdown(results)


def test_a_multi_seed_multi_field_run_gives_the_pooled_rates_mean_and_sd_over_seeds():
    """Issue 35 item 7: the pooled rows once per seed, then mean ± sd (ddof 1) of each rate, with the n behind it;
    a reference computed by hand from the per-seed k/n."""
    from lacuna_unlearn.bench.run import pooled, pooled_across_seeds

    def entry(k: int, n: int, regime: str) -> dict:
        ci = {"low": 0.0, "high": 1.0, "k": k, "n": n, "level": 0.95, "method": "clopper_pearson"}
        return {"behaviour": {"forget_leak": k / n, "ci": {"forget_leak": ci}}, "regime": {"regime": regime}}

    runs = {
        "email": {"a": {42: entry(0, 3, "ideal"), 1: entry(1, 3, "x"), 2: entry(3, 3, "y")}},
        "phone": {"a": {42: entry(1, 3, "ideal"), 1: entry(1, 3, "x"), 2: entry(0, 3, "z")}},
    }
    out = pooled_across_seeds(runs)
    leak = out["a"]["metrics"]["forget_leak"]
    expected = [1 / 6, 2 / 6, 3 / 6]
    assert leak["values"] == pytest.approx(expected) and leak["people"] == 6 and out["a"]["seeds"] == [42, 1, 2]
    assert leak["mean"] == pytest.approx(sum(expected) / 3)
    assert leak["sd"] == pytest.approx(float(np.std(expected, ddof=1)))
    assert out["a"]["regimes"] == [["ideal", "ideal"], ["x", "x"], ["y", "z"]]
    # the first seed's pooled row is the run's own pooled row
    first = pooled({f: {"methods": {"a": runs[f]["a"][42]}} for f in runs})
    assert first["a"]["rates"]["forget_leak"]["value"] == pytest.approx(leak["values"][0])
    results = _run(fields=("email", "phone"))
    results["pooled"] = {"a": {**first["a"], "across_seeds": out["a"]}}
    text = run_markdown(results)
    assert "Pooled, mean ± sd over 3 unlearning seeds (42, 1, 2)" in text
    assert [ci["k"] for ci in leak["cis"]] == [1, 2, 3] and {ci["n"] for ci in leak["cis"]} == {6}
    assert "| a | 0.333 ± 0.167 (n=6; k per seed: 1, 2, 3) |" in text and "ideal, ideal / x, x / y, z" in text


def test_controls_by_seed_give_each_seeds_figures_and_verdict():
    """Issue 35: per seed, the positive control's share silenced and its leak after relearning (the source its
    regime took, not another), the negative control's leak before and after, the verdict and its reason."""
    from lacuna_unlearn.bench.run import controls_by_seed

    def checks(passed: bool, recovered: float, learned: float) -> dict:
        positive = {
            "attack_strong_enough": passed,
            "reason": None if passed else "does not exceed the negative control",
            "silenced": 1.0,
            "reversibility": {
                "regime": {"source": "forget"},
                "sources": {"forget": {"forget_leak": recovered}, "retain": {"forget_leak": 0.0}},
            },
        }
        negative = {"before": {"forget_leak": 0.0}, "relearned": {"forget_leak": learned}}
        return {"positive": positive, "negative": negative}

    out = controls_by_seed({42: checks(True, 1.0, 0.0), 1: checks(False, 2 / 3, 2 / 3)})
    assert list(out) == ["42", "1"]
    assert out["42"] == {
        "positive_passed": True, "reason": None, "silenced": 1.0, "positive_relearned_leak": 1.0,
        "negative_before_leak": 0.0, "negative_relearned_leak": 0.0,
    }  # fmt: skip
    assert out["1"]["positive_passed"] is False and "negative control" in out["1"]["reason"]
    assert out["1"]["positive_relearned_leak"] == pytest.approx(2 / 3)
    assert out["1"]["negative_relearned_leak"] == pytest.approx(2 / 3)


def test_the_report_gives_each_seeds_controls_and_whether_it_reads_regimes():
    from lacuna_unlearn.bench.report.tables import _control_note

    entry = {
        "positive_control": {"attack_strong_enough": True, "silenced": 1.0, "reversibility": {}},
        "controls_by_seed": {
            "42": {"positive_passed": True, "silenced": 1.0, "positive_relearned_leak": 1.0,
                   "negative_before_leak": 0.0, "negative_relearned_leak": 0.0},
            "1": {"positive_passed": False, "silenced": 1.0, "positive_relearned_leak": 2 / 3,
                  "negative_before_leak": 0.0, "negative_relearned_leak": 2 / 3},
        },
    }  # fmt: skip
    text = "\n".join(_control_note(entry))
    assert "| seed | positive control silenced | its leak after relearning |" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 42 |", "| 1 |"))]
    assert rows[0].endswith("| yes |") and rows[1].endswith("| no |") and "→" in rows[1]
