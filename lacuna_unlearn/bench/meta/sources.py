"""Models that enter ``lacuna meta``'s pool from outside the run's chosen stopping points (docs/meta.md, "The pool"):

* checkpoints given with ``--checkpoints``: the LACUNA release's ``unlearned_models/<Field>/<Method>/`` tree (or a
  regime directory holding one), a YAML list of ``{path, method, field}``, or one checkpoint directory written by
  ``lacuna-unlearn`` (its ``unlearn_manifest.json`` names method and field);
* other stopping points of the run's own methods (``--points``): the end of the schedule where the run stopped
  earlier on validation people, and the snapshots along the schedule (``trajectory``).

Everything is resolved and checked before any stage runs: a path that is no checkpoint, a field the run did not
evaluate or a duplicate is refused in one line naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["POINTS", "ExtraModel", "check_points", "other_points", "read_checkpoints", "unlearn_manifest"]

#: Stopping points ``--points`` can add beside the chosen one (always in the pool).
POINTS = ("chosen", "end", "snapshots")


def check_points(points: Sequence[str], where: str) -> tuple[str, ...]:
    """``points`` as a tuple if they are distinct values of :data:`POINTS` including ``chosen``; else refused
    naming ``where`` (the setting or flag)."""
    points = tuple(points)
    if not points or any(p not in POINTS for p in points) or len(set(points)) != len(points) or "chosen" not in points:
        raise ValueError(f"{where}: distinct values of {','.join(POINTS)} including chosen, got {','.join(points)!r}")
    return points


@dataclass(frozen=True)
class ExtraModel:
    """A checkpoint for the pool beyond the run's entries: where it is, what it is labelled, where it came from."""

    path: Path
    method: str
    field: str
    point: str  #: ``end``, ``step N`` (a run's stopping points) or ``checkpoint`` (listed)
    origin: str  #: the file or directory that listed it, for messages and ``meta.json``
    seed: int | None = None  #: the run seed of a stopping point; None: the run's first seed


def unlearn_manifest(path: Path) -> dict[str, Any]:
    """The ``unlearn_manifest.json`` lacuna-unlearn wrote beside a checkpoint, or {} where it has none (a LACUNA
    release checkpoint): it names the retain fields FRAG is calibrated on."""
    try:
        manifest = json.loads((Path(path) / "unlearn_manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file()


def _from_manifest(path: Path) -> tuple[str | None, str | None]:
    """(method, field) as lacuna-unlearn's manifest of ``path`` names them (None where it does not)."""
    manifest = unlearn_manifest(path)
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    method = manifest.get("method")
    return (str(method) if method else None), (str(config["field"]) if config.get("field") else None)


def _tree(root: Path, skipped: list[str]) -> list[ExtraModel]:
    """The checkpoints of a LACUNA ``unlearned_models/<Field>/<Method>/`` tree, in sorted order; a method directory
    without ``config.json`` (LACUNA's JSON results only) is listed in ``skipped``."""
    from lacuna_unlearn.bench.report.lacuna_keys import bench_field, bench_method

    out = []
    for field_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        field = bench_field(field_dir.name)
        if field is None:
            raise ValueError(f"{field_dir}: not a LACUNA field directory (expected e.g. Email_Address, Phone_Number)")
        for method_dir in sorted(p for p in field_dir.iterdir() if p.is_dir()):
            if _is_checkpoint(method_dir):
                out.append(ExtraModel(method_dir, bench_method(method_dir.name), field, "checkpoint", str(root)))
            else:
                skipped.append(f"{method_dir}: no config.json (results only)")
    return out


def _listed(path: Path) -> list[ExtraModel]:
    """The checkpoints of a YAML list file: ``- {path: DIR, method: NAME, field: FIELD}`` (method and field may be
    left out where the checkpoint's ``unlearn_manifest.json`` names them; a relative path is read from the file)."""
    import yaml

    from lacuna_unlearn.bench.report.lacuna_keys import bench_field

    try:
        rows = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty YAML list of {{path, method, field}}")
    out = []
    for i, row in enumerate(rows):
        where = f"{path}: item {i}"
        if not isinstance(row, Mapping) or "path" not in row:
            raise ValueError(f"{where}: expected a mapping with `path` (and `method`, `field`)")
        unknown = sorted(set(row) - {"path", "method", "field"})
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected path, method, field)")
        ckpt = Path(str(row["path"])).expanduser()
        ckpt = ckpt if ckpt.is_absolute() else path.parent / ckpt
        if not _is_checkpoint(ckpt):
            raise FileNotFoundError(f"{where}: path {ckpt}: no config.json (not an HF checkpoint directory)")
        method, field = _from_manifest(ckpt)
        method, field = row.get("method") or method, row.get("field") or field
        if not method or not field:
            missing = "method" if not method else "field"
            raise ValueError(f"{where}: `{missing}` not given and {ckpt}/unlearn_manifest.json does not name it")
        known = bench_field(str(field))
        if known is None:
            raise ValueError(f"{where}: field {field!r}: not a LACUNA field")
        out.append(ExtraModel(ckpt, str(method), known, "checkpoint", str(path)))
    return out


def read_checkpoints(specs: Sequence[str | Path], fields: Sequence[str]) -> tuple[list[ExtraModel], list[str]]:
    """The checkpoints of every ``--checkpoints`` argument (module docstring) and the tree entries skipped, checked:
    each field is one the run evaluated (``fields``), no checkpoint is listed twice, at least one is found."""
    from lacuna_metrics import RELEASE_UNLEARNED_DIR

    models: list[ExtraModel] = []
    skipped: list[str] = []
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_file():
            found = _listed(path)
        elif _is_checkpoint(path):
            method, field = _from_manifest(path)
            if not method or not field:
                raise ValueError(
                    f"{path}: a checkpoint whose unlearn_manifest.json names no method and field; list it in a "
                    "YAML file as {path, method, field}"
                )
            found = [ExtraModel(path, method, field, "checkpoint", str(path))]
        elif path.is_dir():
            root = path / RELEASE_UNLEARNED_DIR if (path / RELEASE_UNLEARNED_DIR).is_dir() else path
            found = _tree(root, skipped)
            if not found:
                raise ValueError(f"{root}: no checkpoint under <Field>/<Method>/ (config.json): nothing to pool")
        else:
            raise FileNotFoundError(f"--checkpoints {path}: not found")
        models += found
    seen: dict[Path, str] = {}
    for m in models:
        if m.field not in fields:
            raise ValueError(f"{m.path}: field {m.field!r} is not one the run evaluated ({', '.join(fields)})")
        key = m.path.resolve()
        if key in seen:
            raise ValueError(f"{m.path}: listed twice ({seen[key]} and {m.origin})")
        seen[key] = m.origin
    return models, skipped


def other_points(
    entry: Mapping[str, Any], method: str, field: str, seed: int, points: Sequence[str]
) -> list[ExtraModel]:
    """The stopping points of one run entry other than its chosen one: ``end`` (the end of the schedule, where the
    run stopped earlier) and ``snapshots`` (every snapshot the trajectory evaluated, by step)."""
    out = []
    end = (entry.get("end_of_schedule") or {}).get("model")
    if "end" in points and end:
        out.append(ExtraModel(Path(end), method, field, "end", "run", seed))
    if "snapshots" in points and entry.get("trajectory"):
        snapshots = Path(end or entry["model"]) / "snapshots"
        by_step = {int(p.name.split("-", 1)[1]): p for p in snapshots.glob("step-*")}  # step-000010
        for point in entry["trajectory"].get("points") or []:
            snap = by_step.get(int(point["step"]))
            if snap is None or not _is_checkpoint(snap):
                raise FileNotFoundError(
                    f"{snapshots}: the snapshot at step {point['step']} is gone (the run's stage cache was cleared?)"
                )
            out.append(ExtraModel(snap, method, field, f"step {int(point['step'])}", "run", seed))
    return out
