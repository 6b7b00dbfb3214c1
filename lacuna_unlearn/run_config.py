"""``lacuna run``'s configuration: the run presets, the YAML/``--set`` loader and its validation.

Kept apart from the pipeline (``lacuna_unlearn/run.py``) so the settings, their defaults and their checks have
one home (docs/guide.md "lacuna run").
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_tasks.normalize import SUCCESS_AT_N_JUDGE

__all__ = ["DEFAULT_RUN", "POSITIVE_CONTROL", "PRESETS", "RELEARN_SOURCES", "load_run_config", "validate_run_config"]

#: Sources of the restricted relearning protocol (``attack=relearn_restricted source=...``).
RELEARN_SOURCES = ("forget", "retain", "unrelated")
#: The positive control's name in results: JensUn's refusal objective confined to the last (never masked) layer.
POSITIVE_CONTROL = "suppress_last_layer"

#: The default experiment (``--preset mini``). Method overrides are ``lacuna-unlearn`` Hydra overrides.
DEFAULT_RUN: dict[str, Any] = {
    "preset": "mini",  # testbed preset built when `testbed` is null
    "testbed": None,  # an existing testbed directory to use instead
    "testbed_seed": None,
    "fields": ["email"],  # email | phone | birth_city | drivers_license
    "experiment": "mini",  # lacuna-unlearn experiment preset shared by the methods (null: none)
    "methods": {
        "grad_diff": [],
        "simnpo": [],
        "jensun": [],
        "rmu": ["method.args.alpha=10"],  # alpha 1 erases the retain facts on mini (see experiment/mini.yaml)
        "frp": [],
        "oracle_grad": [],
        "alpha_edit": ["experiment=mini/alpha_edit"],  # the layer and value space that can move mini's outputs
        "memflex": ["trainer.args.learning_rate=1e-3"],  # LoRA needs a larger step than mini's 2e-4
        "wagle": [],
    },
    "eval": {
        "batch_size": 32,
        "tasks": None,
        "neutral_ppl": True,
    },  # tasks: null = the field group lacuna_<field>; or suffixes
    "score": {"enabled": True, "composite_samples": 200_000, "frag": True, "null": True, "null_tolerance": 0.05},
    # judge: the leak rule of Success@N (docs/tasks.md "Judges"); lacuna = LACUNA's, comparable with the paper
    "attack": {"enabled": True, "protocol": "relearn", "attempts": 200, "overrides": [], "judge": SUCCESS_AT_N_JUDGE},
    "regime": {"tau_rev": 0.5, "tau_cat": 0.2, "relative": False},
    # Restricted relearning (docs/definitions.md#restricted-relearning, docs/report.md "Regime"): |D_f| rows from each
    # source; the regime is read from the source that recovers most. The positive control (output suppression only) must
    # come out reversible.
    "reversibility": {
        "enabled": True,
        "sources": ["forget", "retain", "unrelated"],
        "learning_rate": 1e-3,
        "epochs": 5,
        "positive_control": True,
    },
    # Matched forgetting (docs/report.md "Trade-off curves"): gradient methods keep `points` evenly spaced
    # checkpoints, each probed cheaply (forget QA, retain-eval QA, raw AUC); the table adds each method at the first
    # checkpoint whose forget leak is <= leak_threshold.
    "trajectory": {"enabled": True, "points": 6, "leak_threshold": 0.1},
    "seed": 42,
    "seeds": None,  # unlearning seeds, e.g. [1, 2, 3]: mean ± sd of every metric across them (null: [seed])
}

#: ``smoke``: the tiny testbed of the tests (too few retain people for the ICR tasks, so no worst-case probe),
#: the same nine methods with the same overrides as ``mini`` (both testbeds are 4-layer OLMo-2 models), each
#: with its method's own default schedule instead of mini's 60-epoch one.
PRESETS = {
    "mini": DEFAULT_RUN,
    "smoke": {
        **DEFAULT_RUN,
        "preset": "smoke",
        "experiment": None,
        "eval": {"batch_size": 32, "tasks": ["forget_qa", "retain_qa", "forget_memorization"]},
    },
}


def load_run_config(
    path: str | os.PathLike[str] | None = None, *, preset: str = "mini", overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The preset's config, updated by the YAML file at ``path`` and by dotted ``overrides`` (``attack.attempts``)."""
    import yaml

    if preset not in PRESETS:
        raise ValueError(f"unknown run preset {preset!r}; choose from {sorted(PRESETS)}")
    cfg = copy.deepcopy(PRESETS[preset])
    if path is not None:
        file = Path(path)
        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:  # one line: where in the file, and what
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ValueError(f"{file}:{where} cannot read the run config: {problem}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: a run config is a mapping, got {type(loaded).__name__}")
        _merge(cfg, loaded, str(file))
    for key, value in (overrides or {}).items():
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"--set {key}: {part!r} is not a section of the run config")
            node = node[part]
        if node is not cfg.get("methods") and leaf not in node:
            raise ValueError(f"--set {key}: unknown run setting {leaf!r}; known: {sorted(node)}")
        node[leaf] = _typed(node.get(leaf), _all_fields(key, value), f"--set {key}")
    validate_run_config(cfg)
    return cfg


def _merge(base: dict[str, Any], update: Mapping[str, Any], where: str) -> None:
    for key, value in update.items():
        if key not in base:
            raise ValueError(f"{where}: unknown run setting {key!r}; known: {sorted(base)}")
        if isinstance(base[key], dict) and isinstance(value, dict) and key != "methods":
            _merge(base[key], value, f"{where}:{key}")
        else:
            base[key] = _typed(base[key], _all_fields(key, value), f"{where}:{key}")


def _all_fields(key: str, value: Any) -> Any:
    """``fields: all`` means every field of the schema, in its order."""
    if key == "fields" and value == "all":
        from lacuna_tasks.schema import FIELDS

        return list(FIELDS)
    return value


def _typed(default: Any, value: Any, where: str) -> Any:
    """``value`` checked against the type of the setting's default (numbers stay numbers, switches booleans), so
    ``--set attack.attempts=abc`` fails here, not after a testbed build."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        value = float(value)
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
    elif isinstance(default, (list, dict)) and not isinstance(value, type(default)):
        raise ValueError(f"{where}: expected a {type(default).__name__}, got {value!r}")
    return value


def validate_run_config(cfg: Mapping[str, Any]) -> None:
    """Refuse a run config with a bad setting, naming it and its allowed values, before any work starts."""
    from lacuna_tasks.schema import FIELDS

    fields = cfg["fields"]
    if fields == "all":  # every field, in the schema's order
        fields = cfg["fields"] = list(FIELDS)
    if (
        not isinstance(fields, list)
        or not fields
        or any(f not in FIELDS for f in fields)
        or len(set(fields)) < len(fields)
    ):
        raise ValueError(
            f"run config: fields must be 'all' or a non-empty list of distinct fields from {sorted(FIELDS)}, "
            f"got {fields!r}"
        )
    methods = cfg["methods"]
    if not isinstance(methods, dict) or not methods:
        raise ValueError("run config: methods must map method config names to override lists")
    configs = Path(__file__).with_name("configs") / "method"
    for name, extra in methods.items():
        if not (configs / f"{name}.yaml").is_file():
            known = sorted(p.stem for p in configs.glob("*.yaml"))
            raise ValueError(f"run config: unknown method {name!r}; available: {known}")
        if not isinstance(extra or [], list) or not all(isinstance(o, str) and "=" in o for o in extra or []):
            raise ValueError(f"run config: methods.{name} must be a list of key=value overrides, got {extra!r}")
    ranges = {  # setting: (lowest, highest); integers unless the default is a float
        ("seed",): (0, 2**32 - 1),
        ("testbed_seed",): (0, 2**32 - 1),
        ("eval", "batch_size"): (1, 4096),
        ("score", "composite_samples"): (0, 10**9),
        ("score", "null_tolerance"): (0.0, 0.5),
        ("attack", "attempts"): (1, 10**6),
        ("regime", "tau_rev"): (0.0, 1.0),
        ("regime", "tau_cat"): (0.0, 1.0),
    }
    for path, (low, high) in ranges.items():
        value = cfg
        for part in path:
            value = value[part]
        if value is None and path == ("testbed_seed",):
            continue
        kind = float if isinstance(low, float) else int
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (kind is int and not isinstance(value, int))
        ):
            raise ValueError(f"run config: {'.'.join(path)} must be {'a number' if kind is float else 'an integer'}, "
                             f"got {value!r}")  # fmt: skip
        if not low <= value <= high:
            raise ValueError(f"run config: {'.'.join(path)} must be in [{low}, {high}], got {value!r}")
    rev = cfg["reversibility"]
    if (
        not isinstance(rev.get("sources"), list)
        or not rev["sources"]
        or any(src not in RELEARN_SOURCES for src in rev["sources"])
    ):
        raise ValueError(
            f"run config: reversibility.sources must be a non-empty list from {list(RELEARN_SOURCES)}, "
            f"got {rev.get('sources')!r}"
        )
    lr = rev.get("learning_rate")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr <= 1:
        raise ValueError(f"run config: reversibility.learning_rate must be a number in (0, 1], got {lr!r}")
    epochs = rev.get("epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or not 1 <= epochs <= 1000:
        raise ValueError(f"run config: reversibility.epochs must be an integer in [1, 1000], got {epochs!r}")
    traj = cfg["trajectory"]
    points = traj.get("points")
    if isinstance(points, bool) or not isinstance(points, int) or not 2 <= points <= 100:
        raise ValueError(f"run config: trajectory.points must be an integer in [2, 100], got {points!r}")
    threshold = traj.get("leak_threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise ValueError(f"run config: trajectory.leak_threshold must be a number in [0, 1], got {threshold!r}")
    seeds = cfg.get("seeds")
    if seeds is not None and (
        not isinstance(seeds, list)
        or not seeds
        or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**32 for x in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(
            f"run config: seeds must be a non-empty list of distinct integers in [0, 2**32), got {seeds!r}"
        )
    if cfg["testbed"] is not None and not (Path(cfg["testbed"]) / "manifest.json").is_file():
        raise ValueError(f"run config: testbed {cfg['testbed']}: not a testbed (no manifest.json)")
    protocols = sorted(f.stem for f in (Path(__file__).with_name("configs") / "attack").glob("*.yaml"))
    if cfg["attack"]["protocol"] not in protocols:
        raise ValueError(f"run config: attack.protocol {cfg['attack']['protocol']!r} is not one of {protocols}")
    from lacuna_tasks.normalize import JUDGES

    if cfg["attack"]["judge"] not in JUDGES:
        raise ValueError(f"run config: attack.judge {cfg['attack']['judge']!r} is not one of {list(JUDGES)}")
