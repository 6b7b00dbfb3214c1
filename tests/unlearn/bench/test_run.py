"""`lacuna run` without running: every preset's method list, bad run configs named. End to end on the smoke testbed:
tests/e2e/test_run_benchmark.py.
"""

from __future__ import annotations

import pytest

from lacuna_unlearn.bench.run import PRESETS, load_run_config


def test_every_preset_runs_the_same_method_list():
    """The test below runs the smoke preset's full method list; mini's is the same list with the same
    overrides (it differs only in the shared schedule, which the tests replace by a few steps). ``demo`` runs no
    method (``lacuna demo``: evaluation only)."""
    assert PRESETS["smoke"]["methods"] == PRESETS["mini"]["methods"]
    assert set(PRESETS) == {"demo", "mini", "smoke"} and PRESETS["demo"]["methods"] == {}


def test_bad_run_configs_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        load_run_config(overrides={"methods": {"nope": []}})
    with pytest.raises(ValueError, match="fields must be .all. or a non-empty list"):
        load_run_config(overrides={"fields": ["shoe_size"]})
    bad = tmp_path / "bad.yaml"
    bad.write_text("methodz: {}\n")
    with pytest.raises(ValueError, match="bad.yaml: unknown run setting 'methodz'"):
        load_run_config(bad)
    bad.write_text("methods: [unclosed\n")
    with pytest.raises(ValueError, match=r"bad.yaml: line \d+, column \d+: cannot read the run config"):
        load_run_config(bad)
    with pytest.raises(ValueError, match="unknown run preset"):
        load_run_config(preset="huge")
