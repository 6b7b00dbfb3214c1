"""Outputs publish together: one `lacuna run` per --out, cache keys carry the package version, `build-testbed --force`
deletes only testbeds. SIGTERM on a real build: tests/e2e/test_run_sigterm.py.
"""

from __future__ import annotations

import pytest

from lacuna_unlearn.bench.cli.main import main
from lacuna_unlearn.bench.run import load_run_config, run_benchmark
from lacuna_unlearn.bench.stages import locked, stage_key


def test_second_run_into_the_same_out_is_refused(tmp_path):
    (tmp_path / "tb" / "model").mkdir(parents=True)
    (tmp_path / "tb" / "manifest.json").write_text("{}")
    cfg = load_run_config(preset="smoke", overrides={"testbed": str(tmp_path / "tb")})
    with locked(tmp_path / "run"):
        with pytest.raises(FileExistsError, match=r"another lacuna run is writing here \(pid \d+\)"):
            run_benchmark(tmp_path / "run", cfg)
    with locked(tmp_path / "run"):  # released when the first holder is done
        pass


def test_stage_keys_change_with_the_package_version(monkeypatch):
    import lacuna_metrics.manifest as manifest

    before = stage_key({"kind": "eval", "model": "x"})
    assert before == stage_key({"kind": "eval", "model": "x"})
    monkeypatch.setattr(manifest, "package_versions", lambda names: {"lacuna-bench": "999.0"})
    assert stage_key({"kind": "eval", "model": "x"}) != before


def test_force_refuses_a_directory_that_is_not_a_testbed(tmp_path, capsys):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("years of work")
    assert main(["build-testbed", "--preset", "smoke", "--out", str(precious), "--force"]) == 2
    assert "is not a lacuna-bench testbed" in capsys.readouterr().err
    assert (precious / "chapter1.tex").read_text() == "years of work"
    assert not (tmp_path / "thesis.partial").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"attack.atempts": 5}, r"--set attack.atempts: unknown run setting 'atempts'"),
        ({"seeed": 1}, r"--set seeed: unknown run setting 'seeed'"),
        ({"attack.attempts": "abc"}, r"--set attack.attempts: expected an integer, got 'abc'"),
        ({"attack.attempts": 0}, r"attack.attempts must be in \[1, 1000000\]"),
        ({"score.frag": "yes"}, r"--set score.frag: expected true or false"),
        ({"regime.tau_rev": 2}, r"regime.tau_rev must be in \(0.0, 1.0\)"),
        ({"fields": ["emial"]}, r"fields must be .all. or a non-empty list"),
        ({"attack.protocol": "relern"}, r"attack.protocol 'relern' is not one of"),
        ({"methods.grad_diff": ["oops"]}, r"methods.grad_diff must be a list of key=value overrides"),
        ({"testbed": "/nonexistent/tb"}, r"testbed /nonexistent/tb: not a testbed"),
        ({"nope.x": 1}, r"'nope' is not a section"),
    ],
)
def test_run_overrides_are_checked_before_any_work(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_run_config(preset="smoke", overrides=overrides)


def test_run_yaml_typos_and_types_are_named(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("attack:\n  attempts: many\n")
    with pytest.raises(ValueError, match=r"run.yaml:attack:attempts: expected an integer, got 'many'"):
        load_run_config(config, preset="smoke")


def test_outputs_publish_together_or_not_at_all(tmp_path):
    from lacuna_metrics.manifest import publish_together, write_json, write_text

    out = tmp_path / "score"
    out.mkdir()
    (out / "score.json").write_text('{"old": true}')
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(RuntimeError, match="plot failed"):
        with publish_together(out) as staging:
            write_text(staging / "score.md", "# new report")
            raise RuntimeError("plot failed")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "score.json"]  # no report beside the old JSON
    assert (out / "score.json").read_text() == '{"old": true}'

    with publish_together(out) as staging:
        write_text(staging / "score.md", "# new report")
        write_json(staging / "score.json", {"new": True})
        write_text(staging / "plots" / "roc.txt", "curve")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "plots", "score.json", "score.md"]
    assert (out / "score.md").read_text() == "# new report" and (out / "plots" / "roc.txt").is_file()
    assert '"new": true' in (out / "score.json").read_text()
