"""``lacuna-unlearn`` (also ``python -m lacuna_unlearn.train``): the Hydra entry point of the trainer.

Config groups ship in ``lacuna_unlearn/configs``: ``method/`` (one file per method, ``method.args.*``),
``trainer/`` (``trainer.args.*`` = HF ``TrainingArguments`` names) and ``experiment/`` presets, overridden
on the command line as in OpenUnlearning::

    lacuna-unlearn experiment=mini method=simnpo testbed=runs/mini field=email \\
        output_dir=runs/mini/unlearn/simnpo_email method.args.beta=3 trainer.args.learning_rate=1e-5
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["main", "run"]


def _rows(data: Any, split: str, field: str) -> list[dict[str, Any]]:
    from lacuna_tasks.schema import FIELDS

    if split not in data.splits:
        raise ValueError(f"{data.source}: no split {split!r} (found: {sorted(data.splits)})")
    rows = data.splits[split]
    if field != "all":
        if field not in FIELDS:
            raise ValueError(f"field={field!r}: choose from {sorted(FIELDS)} or 'all'")
        rows = [r for r in rows if r["field"] == FIELDS[field].column]
    if not rows:
        raise ValueError(f"{data.source}: split {split!r} has no rows for field={field!r}")
    return rows


def run(cfg: Any) -> Path:
    """Resolve inputs from the config (testbed or explicit paths) and run :func:`lacuna_unlearn.trainer.unlearn`."""
    from omegaconf import OmegaConf

    from lacuna_metrics.masks import load_masks
    from lacuna_tasks.loader import load_data
    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.trainer import TrainConfig, unlearn

    testbed = Path(cfg.testbed) if cfg.testbed else None
    model = cfg.model or (testbed / "model" if testbed else None)
    data_source = cfg.data or (testbed if testbed else None)
    if model is None or data_source is None:
        raise ValueError("give testbed=DIR, or model=CHECKPOINT and data=DATA")
    masks_path = cfg.masks or (testbed / "masks.safetensors" if testbed else None)
    restrict = cfg.restrict or cfg.method.get("restrict") or "none"
    needs_masks = restrict != "none" and not restrict.startswith("regex:")
    if needs_masks and masks_path is None:
        raise ValueError(f"restrict={restrict!r} needs masks=PATH (or testbed=DIR)")
    masks = load_masks(masks_path) if needs_masks else None

    data = load_data(data_source)
    args = OmegaConf.to_container(cfg.trainer.args, resolve=True)
    known = set(TrainConfig.__dataclass_fields__) - {"extra", "seed"}
    train = TrainConfig(
        **{k: v for k, v in args.items() if k in known},
        seed=int(cfg.seed),
        extra={k: v for k, v in args.items() if k not in known},
    )
    method = make_method(cfg.method.name, **OmegaConf.to_container(cfg.method.args, resolve=True))
    return unlearn(
        model,
        _rows(data, cfg.forget_split, cfg.field),
        _rows(data, cfg.retain_split, cfg.field),
        method,
        cfg.output_dir,
        train=train,
        restrict=restrict,
        masks=masks,
        method_name=cfg.method.name if restrict == "none" else f"{cfg.method.name}+{restrict}",
        data_fingerprint=data.fingerprint,
        force=bool(cfg.force),
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def main() -> None:
    """Console entry point; errors that name the bad input exit with status 2 and one line."""
    import sys

    import hydra

    @hydra.main(config_path="configs", config_name="unlearn", version_base="1.3")
    def _app(cfg: Any) -> None:
        try:
            out = run(cfg)
        except (ValueError, FileNotFoundError, FileExistsError) as exc:
            print(f"lacuna-unlearn: error: {exc}", file=sys.stderr)
            sys.exit(2)
        print(f"unlearned model written to {out}")

    _app()


if __name__ == "__main__":
    main()
