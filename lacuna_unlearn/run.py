"""``lacuna run``: the whole benchmark as one declarative, cached pipeline.

Stages (each cached under ``OUT/stages/<kind>-<hash>/`` by the SHA-256 of its inputs, so a rerun redoes only
what changed): build (or reuse) the testbed; evaluate the model before unlearning with the lm-eval task pack;
per field and method: unlearn (``lacuna-unlearn`` config ``method=<name>`` + overrides), evaluate, score the
pair (``lacuna score``: best-of AUC, FRAG, L2), relearning attack with the extraction probe (``lacuna attack``),
evaluate the relearned model and classify the forgetting regime. Then ``results.json`` (schema
``lacuna-bench/run`` v1), ``report.md`` and ``plots/*.png`` in ``OUT``.

The default (``preset: mini``) is the README's first command: the mini testbed, the email field, GradDiff,
SimNPO, JensUn, RMU, FRP and OracleGrad.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lacuna_unlearn.publish import building

__all__ = ["DEFAULT_RUN", "RUN_SCHEMA", "load_run_config", "run_benchmark"]

RUN_SCHEMA = {"name": "lacuna-bench/run", "version": 1}

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
    "eval": {"batch_size": 32, "tasks": None},  # tasks: null = the field group lacuna_<field>; or suffixes
    "score": {"enabled": True, "composite_samples": 200_000, "frag": True},
    "attack": {"enabled": True, "protocol": "relearn", "attempts": 200, "overrides": []},
    "regime": {"tau_rev": 0.5, "tau_cat": 0.2, "relative": False},
    "seed": 42,
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
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{file}: cannot read the run config: {exc}") from None
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
        node[leaf] = _typed(node.get(leaf), value, f"--set {key}")
    _validate(cfg)
    return cfg


def _merge(base: dict[str, Any], update: Mapping[str, Any], where: str) -> None:
    for key, value in update.items():
        if key not in base:
            raise ValueError(f"{where}: unknown run setting {key!r}; known: {sorted(base)}")
        if isinstance(base[key], dict) and isinstance(value, dict) and key != "methods":
            _merge(base[key], value, f"{where}:{key}")
        else:
            base[key] = _typed(base[key], value, f"{where}:{key}")


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


def _validate(cfg: Mapping[str, Any]) -> None:
    from lacuna_tasks.schema import FIELDS

    fields = cfg["fields"]
    if not isinstance(fields, list) or not fields or any(f not in FIELDS for f in fields):
        raise ValueError(f"run config: fields must be a non-empty list from {sorted(FIELDS)}, got {fields!r}")
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
    if cfg["testbed"] is not None and not (Path(cfg["testbed"]) / "manifest.json").is_file():
        raise ValueError(f"run config: testbed {cfg['testbed']}: not a testbed (no manifest.json)")
    protocols = sorted(f.stem for f in (Path(__file__).with_name("configs") / "attack").glob("*.yaml"))
    if cfg["attack"]["protocol"] not in protocols:
        raise ValueError(f"run config: attack.protocol {cfg['attack']['protocol']!r} is not one of {protocols}")


# --------------------------------------------------------------------------- stage cache


def _key(inputs: Mapping[str, Any]) -> str:
    """A stage's cache key: its inputs and the package version (a new release recomputes, never reuses)."""
    from lacuna_metrics.manifest import package_versions

    version = package_versions(("lacuna-bench",)).get("lacuna-bench")
    payload = json.dumps({"lacuna-bench": version, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``OUT/.lock`` for the run: a second ``lacuna run`` into the same ``--out`` fails at once instead of
    racing the first one's stages."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise FileExistsError(
                f"{out}: another lacuna run is writing here (pid {holder}); use another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Stages:
    """Content-addressed stage directories: ``build(tmp_dir)`` runs only if the key's directory is missing."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root, self.log, self.timings = root, log, {}
        root.mkdir(parents=True, exist_ok=True)

    def get(self, kind: str, label: str, inputs: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
        key = _key({"kind": kind, **inputs})
        final = self.root / f"{kind}-{key}"
        if (final / "stage.json").is_file():
            self.log(f"{label}: cached ({final.name})")
            self.timings[label] = 0.0
            return final
        started = time.time()
        self.log(f"{label}: running ...")
        with building(final) as partial:
            build(partial)
            (partial / "stage.json").write_text(json.dumps({"kind": kind, "inputs": inputs}, indent=2, default=str))
        self.timings[label] = round(time.time() - started, 1)
        self.log(f"{label}: done in {self.timings[label]:.0f} s")
        return final


# --------------------------------------------------------------------------- the pipeline


def _testbed_fingerprint(testbed: Path) -> str:
    manifest = testbed / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{testbed}: not a testbed (no manifest.json)")
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]


def _behaviour(results: Mapping[str, Mapping[str, float]], field: str, data: Path | None = None) -> dict[str, Any]:
    """The run's behavioural metrics of one evaluation, and with ``data`` (the testbed's LACUNA splits) ``n``: per
    metric, the persons behind it (the forget or retain people of ``field``; every task builds its documents from
    their QA rows, several per person for the paraphrase and worst-case probes). lm-eval's ``n-samples`` counts
    documents, not persons, so it is not used. ``n`` is None where the task did not run."""

    def get(task: str, metric: str) -> float | None:
        return results.get(f"lacuna_{field}_{task}", {}).get(metric)

    out: dict[str, Any] = {
        "forget_leak": get("forget_qa", "leak_rate"),
        "retain_accuracy": get("retain_qa", "accuracy"),
        "j_w": get("forget_worstcase", "j_w"),
        "j_p": get("forget_worstcase", "j_p"),
        "j_icr": get("forget_worstcase", "j_icr"),
        "retain_j_avg": get("retain_paraphrase", "j_avg"),
        "em": get("forget_memorization", "em"),
        "es": get("forget_memorization", "es"),
        "prob": get("forget_memorization", "prob"),
    }
    if data is not None:
        from lacuna_tasks.loader import load_data

        loaded = load_data(data)  # cached per path: one read per run
        persons: dict[str, int] = {}  # side: distinct people of the field in that split
        n: dict[str, int | None] = {}
        for metric, value in list(out.items()):
            side = "retain" if metric.startswith("retain") else "forget"
            if value is not None and side not in persons:
                persons[side] = len({row["ID"] for row in loaded.rows(side, field)})
            n[metric] = None if value is None else persons[side]
        out["n"] = n
    return out


def _eval_stage(stages: _Stages, label: str, model: Path, key: Mapping[str, Any], tasks: list[str], data: Path, cfg):
    from lacuna_tasks.evaluate import evaluate

    def build(tmp: Path) -> None:
        out = evaluate(model, tasks, data=data, batch_size=int(cfg["eval"]["batch_size"]))
        (tmp / "results.json").write_text(json.dumps(out["results"], indent=2))

    stage = stages.get("eval", label, {**key, "tasks": tasks}, build)
    return json.loads((stage / "results.json").read_text())


def run_benchmark(
    out_dir: str | os.PathLike[str],
    cfg: Mapping[str, Any] | None = None,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume from cache) the benchmark described by ``cfg`` into ``out_dir``; return ``results.json``.
    One run at a time per ``out_dir`` (a lock file)."""
    cfg = copy.deepcopy(dict(cfg or DEFAULT_RUN))
    _validate(cfg)
    with _locked(Path(out_dir)):
        return _run_locked(Path(out_dir), cfg, log)


def _run_locked(out: Path, cfg: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    from hydra import compose, initialize_config_module

    from lacuna_metrics.checkpoints import Checkpoint
    from lacuna_metrics.localization import LocalizationConfig
    from lacuna_metrics.manifest import hardware, package_versions, publish_together, write_json
    from lacuna_metrics.report import write_run_report
    from lacuna_metrics.reversibility import classify_regime
    from lacuna_metrics.score import SCHEMA_VERSION as SCORE_SCHEMA_VERSION
    from lacuna_metrics.score import score_to_dir
    from lacuna_unlearn.attacks import resurfacing_attack
    from lacuna_unlearn.train import EDITORS
    from lacuna_unlearn.train import run as unlearn_run

    started = time.time()
    stages = _Stages(out / "stages", log)
    seed = int(cfg["seed"])

    # testbed
    if cfg["testbed"]:
        testbed = Path(cfg["testbed"])
        tb_key = _testbed_fingerprint(testbed)
    else:
        from lacuna_unlearn.testbed import build_testbed

        inputs = {"preset": cfg["preset"], "seed": cfg["testbed_seed"]}
        stage = stages.get(
            "testbed",
            f"testbed ({cfg['preset']})",
            inputs,
            lambda tmp: build_testbed(tmp / "testbed", preset=cfg["preset"], seed=cfg["testbed_seed"]),
        )
        testbed = stage / "testbed"
        tb_key = _testbed_fingerprint(testbed)
    data = testbed / "data"
    before = testbed / "model"

    results: dict[str, Any] = {"schema": RUN_SCHEMA, "preset": cfg["preset"], "testbed": str(testbed)}
    by_field: dict[str, Any] = {}
    for field in cfg["fields"]:
        suffixes = cfg["eval"].get("tasks")
        group = [f"lacuna_{field}_{t}" for t in suffixes] if suffixes else [f"lacuna_{field}"]
        base_eval = _eval_stage(stages, f"[{field}] evaluate before", before, {"testbed": tb_key}, group, data, cfg)
        field_out: dict[str, Any] = {"baseline": {"behaviour": _behaviour(base_eval, field, data)}, "methods": {}}
        for name, extra in cfg["methods"].items():
            extra = list(extra or [])
            overrides = [f"method={name}", f"testbed={testbed}", f"field={field}", f"seed={seed}", *extra]
            if cfg["experiment"] and name not in EDITORS:  # training-free: the schedule does not apply
                overrides.insert(0, f"experiment={cfg['experiment']}")
            u_inputs = {"testbed": tb_key, "overrides": [o for o in overrides if not o.startswith("testbed=")]}

            def build_unlearn(tmp: Path, overrides: list[str] = overrides) -> None:
                with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
                    hcfg = compose(config_name="unlearn", overrides=[*overrides, f"output_dir={tmp / 'model'}"])
                unlearn_run(hcfg)

            u_stage = stages.get("unlearn", f"[{field}] unlearn {name}", u_inputs, build_unlearn)
            model = u_stage / "model"
            u_key = u_stage.name
            entry: dict[str, Any] = {"overrides": extra, "model": str(model)}
            # the checkpoint this entry describes; lacuna gate checks it against the score's `after`
            entry["checkpoint"] = {"path": str(model.resolve()), "fingerprint": Checkpoint(model).fingerprint()}
            manifest = json.loads((model / "unlearn_manifest.json").read_text())
            entry["unlearn_seconds"] = manifest.get("wall_seconds")
            entry["behaviour"] = _behaviour(
                _eval_stage(stages, f"[{field}] evaluate {name}", model, {"model": u_key}, group, data, cfg),
                field,
                data,
            )
            if cfg["score"]["enabled"]:
                scfg = cfg["score"]
                loc = LocalizationConfig(
                    composite=int(scfg["composite_samples"]) > 0,
                    composite_samples=max(1, int(scfg["composite_samples"])),
                    seed=seed,
                )
                s_stage = stages.get(
                    "score",
                    f"[{field}] score {name}",
                    {"model": u_key, "testbed": tb_key, "score": scfg, "schema": SCORE_SCHEMA_VERSION},
                    lambda tmp, model=model, loc=loc, scfg=scfg: score_to_dir(
                        tmp / "score",
                        plots=False,
                        after=model,
                        testbed=testbed,
                        frag=bool(scfg["frag"]),
                        config=loc,
                        progress=False,
                    ),  # fmt: skip
                )
                score = json.loads((s_stage / "score" / "score.json").read_text())
                entry["score_checkpoint"] = score["manifest"]["inputs"]["after"]
                entry["auc"] = {
                    target: {"best": score["auc"][target].get("best"), "raw": score["auc"][target].get("raw")}
                    for target in score["auc"]
                }
                entry["frag"] = (score.get("frag") or {}).get("frag")
                entry["l2"] = (score.get("distance") or {}).get("l2")
                entry["per_layer"] = [
                    {k: row[k] for k in ("layer", "component", "update_mass", "auc")} for row in score["per_layer"]
                ]
                results.setdefault("baseline_auc", score.get("baselines"))
            if cfg["attack"]["enabled"]:
                acfg = cfg["attack"]
                a_stage = stages.get(
                    "attack",
                    f"[{field}] attack {name}",
                    {"model": u_key, "attack": acfg, "field": field},
                    lambda tmp, model=model, acfg=acfg, field=field: resurfacing_attack(
                        model,
                        tmp / "attack",
                        testbed=testbed,
                        field=field,
                        protocol=acfg["protocol"],
                        overrides=list(acfg.get("overrides") or []),
                        attempts=int(acfg["attempts"]),
                        batch_size=int(cfg["eval"]["batch_size"]),
                        seed=seed,
                    ),  # fmt: skip
                )
                attack = json.loads((a_stage / "attack" / "attack.json").read_text())
                entry["attack"] = {
                    k: attack[k]
                    for k in (
                        "protocol", "attempts", "persons", "success_at_n_unlearned", "success_at_n_relearned",
                        "leak_rate_unlearned", "leak_rate_relearned", "pct_resurfaced_of_forgotten",
                    )
                }  # fmt: skip
                entry["attack"]["forgotten"] = len(attack["forgotten"])
                entry["attack"]["resurfaced"] = len(attack["resurfaced"])
                qa = [f"lacuna_{field}_forget_qa", f"lacuna_{field}_retain_qa"]
                rel = _behaviour(
                    _eval_stage(
                        stages,
                        f"[{field}] evaluate relearned {name}",
                        a_stage / "attack" / "relearned",
                        {"attack": a_stage.name},
                        qa,
                        data,
                        cfg,
                    ),  # fmt: skip
                    field,
                    data,
                )
                entry["relearned_behaviour"] = {
                    "forget_leak": rel["forget_leak"],
                    "retain_accuracy": rel["retain_accuracy"],
                }
                base_b, unl_b = field_out["baseline"]["behaviour"], entry["behaviour"]
                rcfg = cfg["regime"]
                entry["regime"] = classify_regime(
                    base_b["forget_leak"], unl_b["forget_leak"], rel["forget_leak"],
                    base_b["retain_accuracy"], unl_b["retain_accuracy"],
                    tau_rev=float(rcfg["tau_rev"]), tau_cat=float(rcfg["tau_cat"]), relative=bool(rcfg["relative"]),
                )  # fmt: skip
            field_out["methods"][name] = entry
        by_field[field] = field_out

    first = by_field[cfg["fields"][0]]
    results.update(
        {
            "field": cfg["fields"][0],
            "baseline": {**first["baseline"], "auc": results.pop("baseline_auc", None)},
            "methods": first["methods"],
            "by_field": by_field,
            "manifest": {
                "config": cfg,
                "seed": seed,
                "stage_seconds": stages.timings,
                "wall_seconds": round(time.time() - started, 1),
                "versions": package_versions(("lacuna-bench", "torch", "transformers", "lm_eval", "peft")),
                "hardware": hardware(),
            },
        }
    )
    with publish_together(out) as staging:  # results.json, report.md and plots/ appear together
        write_run_report(staging, results)
        write_json(staging / "results.json", results)
    return results
