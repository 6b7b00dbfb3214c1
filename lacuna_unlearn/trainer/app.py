"""``lacuna-unlearn`` (also ``python -m lacuna_unlearn.trainer``): the Hydra entry point of the trainer.

Config groups ship in ``lacuna_unlearn/configs``: ``method/`` (one file per method, ``method.args.*``; the defaults
are the method dataclass's, registered in Hydra's ConfigStore by :mod:`lacuna_unlearn.methods.registry`),
``trainer/`` (``trainer.args.*`` = HF ``TrainingArguments`` names), ``experiment/`` presets and ``attack/``
relearning protocols, overridden on the command line as in OpenUnlearning::

    lacuna-unlearn experiment=mini method=simnpo testbed=runs/mini field=email \\
        output_dir=runs/mini/unlearn/simnpo_email method.args.beta=3 trainer.args.learning_rate=1e-5
    lacuna-unlearn method=grad_diff testbed=runs/mini field=email retain_field=crossfield output_dir=...
    lacuna-unlearn method=grad_diff lora.enabled=true lora.r=16 testbed=runs/mini output_dir=...
    lacuna-unlearn method=npo testbed=runs/mini output_dir=... trainer.args.eval_every=5 \\
        trainer.args.best_by=validation_leak trainer.args.report_to=tensorboard
    lacuna-unlearn attack=relearn source=forget budget=forget testbed=runs/mini \\
        model=runs/mini/unlearn/simnpo_email output_dir=runs/mini/relearn/simnpo_email
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lacuna_unlearn.dataclass_config import check_value, path_override
from lacuna_unlearn.methods.registry import EDITORS, config_defaults, resolve, store_method_configs

__all__ = ["EDITORS", "main", "preflight", "run", "run_overrides"]


def run(cfg: Any) -> Path:
    """Resolve inputs from the config (testbed or explicit paths) and run the method, FRP or an attack."""
    preflight(cfg)  # before the heavy imports below: a bad input fails in about a second
    from lacuna_metrics import exclusive_writer, naming_outputs, writing

    out = Path(str(cfg.output_dir))
    with exclusive_writer(out, "lacuna-unlearn", flag="output_dir"):
        # every method builds OUT.partial and renames it: a full disk names the file at its place in OUT
        with naming_outputs(out.with_name(out.name + ".partial"), out), writing(out):
            return _run(cfg)


def run_overrides(overrides: Sequence[str], output_dir: Path) -> Path:
    """Compose the ``unlearn`` config from ``overrides`` (as ``lacuna-unlearn`` takes them on its command line) with
    ``output_dir`` and :func:`run` it: how the benchmark's stages unlearn, relearn and perturb."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(config_name="unlearn", overrides=[*overrides, path_override("output_dir", output_dir)])
    return run(cfg)


def _run(cfg: Any) -> Path:
    from omegaconf import OmegaConf

    from lacuna_metrics import load_masks, resolve_testbed
    from lacuna_tasks import load_data
    from lacuna_unlearn.lora import LoraSettings
    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.qa.unlearn_data import unlearning_rows
    from lacuna_unlearn.trainer.loop import TrainConfig, unlearn
    from lacuna_unlearn.trainer.selection import validation_rows

    attack = cfg.get("attack")
    # either layout: a lacuna-bench testbed or a regime directory of the LACUNA release (docs/release.md)
    layout = resolve_testbed(cfg.testbed) if cfg.testbed else None
    if attack and not cfg.model:
        raise ValueError(f"attack={attack}: give model=UNLEARNED_CHECKPOINT (the model to relearn)")
    model = cfg.model or (layout.before if layout else None)
    data_source = cfg.data or (layout.data if layout else None)
    if layout is not None and data_source is None:
        raise ValueError(f"testbed={cfg.testbed}: {'; '.join(layout.notes)}: give data=DATA")
    if model is None or data_source is None:
        raise ValueError("give testbed=DIR, or model=CHECKPOINT and data=DATA")
    data = load_data(data_source)
    forget_rows, retain_rows, retain_from = unlearning_rows(
        data,
        field=cfg.field,
        retain_field=cfg.get("retain_field", "same"),
        forget_split=cfg.forget_split,
        retain_split=cfg.retain_split,
    )
    resolved_cfg = OmegaConf.to_container(cfg, resolve=True)
    resolved_cfg["retain_from"] = [{"split": split, "field": fld} for split, fld in retain_from]  # into the manifest
    method_args = OmegaConf.to_container(cfg.method.args, resolve=True)
    lora_cfg = OmegaConf.to_container(cfg.lora, resolve=True) if cfg.get("lora") else {}
    lora = LoraSettings(**{k: v for k, v in lora_cfg.items() if k != "enabled"}) if lora_cfg.get("enabled") else None

    if cfg.method.name in EDITORS:
        return _run_editor(cfg, model, data, forget_rows, retain_rows, method_args, lora)

    restrict = cfg.restrict or cfg.method.get("restrict") or "none"
    needs_masks = restrict != "none" and not restrict.startswith("regex:")
    masks_path = cfg.masks or (layout.masks if layout else None)
    if needs_masks and masks_path is None:
        where = f" (testbed={cfg.testbed} has none)" if layout else " (or testbed=DIR)"
        raise ValueError(f"restrict={restrict!r} needs masks=PATH{where}")
    masks = load_masks(masks_path) if needs_masks else None

    eval_rows = None
    if attack:
        from lacuna_unlearn.trainer.relearn_rows import attack_rows, holdout

        rows = attack_rows(
            data,
            cfg.source,
            cfg.field,
            budget=cfg.budget,
            seed=int(cfg.seed),
            forget_split=cfg.forget_split,
            retain_split=cfg.retain_split,
            relearn_split=cfg.relearn_split,
            unrelated_file=cfg.get("unrelated_file"),
        )
        forget_rows, eval_rows = holdout(rows, float(cfg.eval_fraction), int(cfg.seed))
        retain_rows = []

    args = OmegaConf.to_container(cfg.trainer.args, resolve=True)
    known = set(TrainConfig.__dataclass_fields__) - {"extra", "seed"}
    train = TrainConfig(
        **{k: v for k, v in args.items() if k in known},
        seed=int(cfg.seed),
        extra={k: v for k, v in args.items() if k not in known},
    )
    method = make_method(cfg.method.name, **method_args)
    name = cfg.method.name if restrict == "none" else f"{cfg.method.name}+{restrict}"
    return unlearn(
        model,
        forget_rows,
        retain_rows,
        method,
        cfg.output_dir,
        train=train,
        restrict=restrict,
        masks=masks,
        method_name=f"attack:{attack}:{cfg.source}" if attack else name,
        data_fingerprint=data.fingerprint,
        force=bool(cfg.force),
        config=resolved_cfg,
        lora=lora,
        eval_rows=eval_rows or None,
        eval_steps=int(cfg.get("eval_steps") or 25),
        freeze_embeddings=bool(cfg.get("freeze_embeddings", False)),
        append_eos=bool(cfg.get("append_eos", True)),
        validation_rows=validation_rows(data, cfg.field, train.best_by) if train.eval_every else None,
    )


#: ``trainer.args`` that count things (the others that default to numbers accept any number).
_INTEGER_ARGS = frozenset(
    {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_steps",
        "max_length",
        "snapshots",
        "stop_at_step",
        "eval_every",
    }
)


def preflight(cfg: Any) -> None:
    """Check every input that can be checked without loading a model: paths exist, the output can be written,
    ``trainer.args.*`` are known ``TrainingArguments`` with values of the right type. A bad override then fails
    in a second, not after the model has loaded."""
    import dataclasses
    import os

    from omegaconf import OmegaConf

    from lacuna_metrics import symlink_loop_error

    if OmegaConf.is_missing(cfg, "output_dir") or not cfg.output_dir:
        raise ValueError("output_dir is required: add output_dir=DIR (the unlearned checkpoint is written there)")
    out = Path(str(cfg.output_dir))
    if (loop := symlink_loop_error(f"output_dir={out}", out)) is not None:
        raise OSError(loop)
    if out.exists() and not cfg.force:
        raise FileExistsError(f"output_dir={out} exists; pass force=true to overwrite")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"output_dir={out}: {parent} is not writable")
    for key in ("testbed", "model", "data", "masks"):
        value = cfg.get(key)
        if value and (loop := symlink_loop_error(f"{key}={value}", str(value))) is not None:
            raise OSError(loop)
        if value and not Path(str(value)).exists():
            raise FileNotFoundError(f"{key}={value}: no such file or directory (only local paths are read)")
    layout = None
    if cfg.get("testbed"):
        from lacuna_metrics import LayoutError, resolve_testbed

        try:  # a lacuna-bench testbed or a LACUNA release regime directory (docs/release.md)
            layout = resolve_testbed(str(cfg.testbed), name=f"testbed={cfg.testbed}")
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
    check_value("seed", int, cfg.get("seed"))
    for key in ("freeze_embeddings", "append_eos"):
        check_value(key, bool | None, cfg.get(key))
    from lacuna_tasks import FIELDS

    if cfg.get("field") != "all" and cfg.get("field") not in FIELDS:
        raise ValueError(f"field={cfg.get('field')!r}: choose from {sorted(FIELDS)} or 'all'")
    _check_typed("method.args", OmegaConf.to_container(cfg.method.args, resolve=True), _method_defaults(cfg))
    if cfg.get("lora"):
        lora = OmegaConf.to_container(cfg.lora, resolve=True)
        _check_typed("lora", {k: v for k, v in lora.items() if k in ("r", "lora_alpha", "lora_dropout", "enabled")},
                     {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "enabled": False})  # fmt: skip
    if cfg.get("attack"):
        from lacuna_unlearn.trainer.relearn_rows import check_attack_settings

        check_attack_settings(cfg)
    args = OmegaConf.to_container(cfg.trainer.args, resolve=True)
    # Types from the shipped trainer defaults (no transformers import: that alone takes seconds).
    defaults = OmegaConf.to_container(
        OmegaConf.load(Path(__file__).parent.parent / "configs" / "trainer" / "default.yaml")
    )
    defaults = dict(defaults["args"])
    unknown = [key for key in args if key not in defaults]
    if unknown:  # rare: only then pay for importing transformers (seconds) to learn TrainingArguments' fields
        from transformers import TrainingArguments

        theirs = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
        for key in unknown:
            if key not in theirs:
                raise ValueError(f"trainer.args.{key}: not a TrainingArguments setting")
            defaults[key] = theirs[key]
    from lacuna_unlearn.trainer.schedule import check_min_lr_ratio

    check_min_lr_ratio(args.get("min_lr_ratio"), args.get("lr_scheduler_type"))
    for key, value in args.items():
        default = defaults[key]
        if isinstance(default, bool):
            check_value(f"trainer.args.{key}", bool, value)
        elif key in _INTEGER_ARGS:
            check_value(f"trainer.args.{key}", int, value)
        elif isinstance(default, (int, float)):
            check_value(f"trainer.args.{key}", float, value)
    _check_reporting_and_evaluation(cfg, args)
    # Last: the data selection's keys (lacuna_unlearn.qa.unlearn_data imports torch, which run() needs next anyway).
    from lacuna_unlearn.qa.unlearn_data import check_unlearning_splits, validate_retain_field

    validate_retain_field(cfg.get("retain_field", "same"))
    check_unlearning_splits(forget_split=cfg.get("forget_split"), retain_split=cfg.get("retain_split"))
    source = cfg.get("data") or (layout.data if layout is not None else None)
    if source:  # bad data (unreadable, not UTF-8, invalid) fails here, before transformers is imported
        from lacuna_tasks import load_data

        data = load_data(str(source))  # cached: run() reads the same object
        if args.get("eval_every"):  # the criterion needs the run's field's validation people
            from lacuna_unlearn.trainer.selection import validation_rows

            validation_rows(data, cfg.get("field"), args.get("best_by"))


def _check_reporting_and_evaluation(cfg: Any, args: dict[str, Any]) -> None:
    """``trainer.args.report_to`` / ``logging_dir`` / ``eval_every`` / ``best_by`` checked without loading anything:
    known and installed integrations (``all`` warns in the run, not twice), a known criterion, and no evaluation
    where nothing trains (an editor) or the run already keeps its best checkpoint (an attack's held-out rows)."""
    import warnings

    from lacuna_unlearn.trainer.reporting import resolve_report_to
    from lacuna_unlearn.trainer.selection import check_evaluation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # report_to=all with nothing local installed: the run itself warns once
        resolve_report_to(args.get("report_to", "none"), args.get("logging_dir"))
    every = check_evaluation(args.get("eval_every", 0), args.get("best_by", "validation_leak"))
    if every and str(cfg.method.get("name")) in EDITORS:
        raise ValueError(
            f"trainer.args.eval_every: method={cfg.method.name} edits weights directly (no training steps)"
        )
    if every and cfg.get("attack"):
        raise ValueError(
            f"trainer.args.eval_every: attack={cfg.attack} already keeps its best checkpoint by eval loss on held-out "
            "rows (eval_fraction); set trainer.args.eval_every=0"
        )


def _method_defaults(cfg: Any) -> dict[str, Any]:
    """``method.args`` defaults of the configured method: its registered dataclass's
    (:func:`lacuna_unlearn.methods.registry.config_defaults`); none for an unknown name (refused later)."""
    try:
        return config_defaults(str(cfg.method.get("name")))
    except ValueError:
        return {}


def _check_typed(prefix: str, values: dict[str, Any], defaults: dict[str, Any]) -> None:
    """A value whose shipped default is a bool, an int or a float must have that type (an int is a number), checked by
    the one type check of every setting (:func:`lacuna_unlearn.dataclass_config.check_value`); keys without such a default
    are left to the method."""
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(default, (bool, int, float)):
            check_value(f"{prefix}.{key}", type(default), value)


def _run_editor(
    cfg: Any, model: Path | str, data: Any, forget_rows: list, retain_rows: list, args: dict, lora: Any
) -> Path:
    """A training-free method (an ``editor`` of :mod:`lacuna_unlearn.methods.registry`): no optimizer, so ``lora=``
    and ``restrict=`` do not apply (refused, not ignored)."""
    name = cfg.method.name
    if lora is not None or (cfg.restrict or cfg.method.get("restrict") or "none") != "none":
        raise ValueError(f"method={name} edits weights directly (no training): lora and restrict do not apply")
    if cfg.get("attack"):
        raise ValueError(f"attack=... fine-tunes with method=finetune; do not combine it with method={name}")
    out = Path(cfg.output_dir)
    if out.exists():
        if not cfg.force:
            raise FileExistsError(f"{out} exists; pass force=true to overwrite")
        shutil.rmtree(out)
    run_editor = resolve(name, "editor")
    return run_editor(model, forget_rows, retain_rows, out, args, seed=int(cfg.seed), data=data)


def main() -> None:
    """Console entry point; errors that name the bad input exit with status 2 and one line."""
    import sys

    import hydra

    from lacuna_metrics import configure_threads
    from lacuna_tasks import configure_logging

    configure_logging()  # the methods' progress lines (e.g. MemFlex's localisation) go to stderr
    store_method_configs()  # the method defaults configs/method/*.yaml extend (Hydra may read the files directly)
    try:
        configure_threads()
    except ValueError as exc:
        print(f"lacuna-unlearn: error: {exc}", file=sys.stderr)
        sys.exit(2)

    @hydra.main(config_path="pkg://lacuna_unlearn.configs", config_name="unlearn", version_base="1.3")
    def _app(cfg: Any) -> None:
        from lacuna_metrics import error_line

        try:
            out = run(cfg)
        except Exception as exc:  # a bad input or a file-system fault: one line naming it; anything else: a bug
            line = error_line(exc)
            if line is None:
                raise
            print(f"lacuna-unlearn: error: {line}", file=sys.stderr)
            sys.exit(2)
        print(f"model written to {out}")

    _app()


if __name__ == "__main__":
    main()
