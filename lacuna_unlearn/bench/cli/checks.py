"""Up-front checks of the ``lacuna`` command: argument types and the paths, outputs and numbers each command
checks before it imports torch or reads a weight.

A typo fails in well under a second with one line naming the culprit (``tests/unlearn/bench/cli/test_bad_input_cli.py``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Parser",
    "calib_fields",
    "check_attack",
    "check_diagnose",
    "check_reversibility",
    "check_score",
    "existing",
    "finite",
    "int_at_least",
    "one_value",
    "seed_list",
    "set_key",
    "testbed_dir",
    "writable",
]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``lacuna score: error: ... (see lacuna score --help)``, exit 2.

    ``help_defaults``: a function returning ``{dest: default}`` for the defaults ``--help`` shows but parsing
    leaves ``None``, because they live in a module too slow to import for every command (the scorer's, with
    torch); the command then passes on only the flags given."""

    help_defaults: Callable[[], dict[str, Any]] | None = None

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        if self.help_defaults is not None:
            defaults = self.help_defaults()
            for action in self._actions:
                if action.dest in defaults and action.default is None:
                    action.default = defaults[action.dest]
        return super().format_help()


def int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def finite(low: float | None = None, high: float | None = None, *, open_ends: bool = False):
    """An argparse type: a finite number in ``[low, high]`` (``(low, high)`` with ``open_ends``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        below = low is not None and (value <= low if open_ends else value < low)
        above = high is not None and (value >= high if open_ends else value > high)
        if below or above:
            left, right = ("(", ")") if open_ends else ("[", "]")
            bounds = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
            raise argparse.ArgumentTypeError(f"{value} is outside {bounds}")
        return value

    parse.__name__ = "number"
    return parse


def existing(flag: str, value: str | os.PathLike[str] | None, kind: str = "any") -> Path | None:
    """``value`` as a Path that exists (``kind``: ``dir``, ``file`` or ``any``); None stays None."""
    if value is None:
        return None
    path = Path(value)
    if not path.exists():
        _no_symlink_loop(flag, path)
        raise FileNotFoundError(f"{flag} {path}: no such file or directory")
    if kind == "dir" and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path}: not a directory")
    if kind == "file" and not path.is_file():
        raise IsADirectoryError(f"{flag} {path}: not a file")
    return path


def _no_symlink_loop(flag: str, path: Path) -> None:
    """``Path.exists`` says False for a path through a symlink loop: name the loop instead of "no such file" (an
    input) or of failing at the first write (an output)."""
    from lacuna_metrics import symlink_loop_error

    if (loop := symlink_loop_error(f"{flag} {path}", path)) is not None:
        raise OSError(loop)


def testbed_dir(flag: str, value: str | None) -> Path | None:
    """A testbed of either layout (lacuna-bench's, or a regime directory of the LACUNA release)."""
    path = existing(flag, value, "dir")
    if path is not None:
        from lacuna_metrics import LayoutError, resolve_testbed

        try:
            resolve_testbed(path, name=f"{flag} {path}")
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
    return path


def writable(flag: str, value: str | os.PathLike[str], *, directory: bool) -> Path:
    """``value`` can be created or replaced: a directory (``directory``) or a file whose first existing
    ancestor is a writable directory. Checked before any work, so a read-only disk fails at once."""
    path = Path(value)
    _no_symlink_loop(flag, path)
    if path.exists() and path.is_dir() != directory:
        raise ValueError(f"{flag} {path}: exists and is {'a file' if directory else 'a directory'}")
    ancestor = path if path.exists() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(f"{flag} {path}: {ancestor} is not writable")
    return path


def check_score(args: argparse.Namespace) -> None:
    existing("--after", args.after)
    testbed = testbed_dir("--testbed", args.testbed)
    for flag in ("before", "base", "control_before", "control_after", "calib_forget", "calib_retain"):
        existing("--" + flag.replace("_", "-"), getattr(args, flag))
    existing("--masks", args.masks, "file")
    for path in args.crossfield or ():
        existing("--crossfield", path)
    if (args.control_before is None) != (args.control_after is None):
        raise ValueError("give both --control-before and --control-after, or neither")
    if args.no_masks and args.masks:
        raise ValueError("--masks and --no-masks contradict each other")
    if testbed is None and (args.before is None or args.masks is None and not args.no_masks):
        raise ValueError("give --testbed DIR, or --before DIR with --masks FILE (or --no-masks for FRAG/distance only)")
    if testbed is not None and not args.no_masks and args.masks is None:
        from lacuna_metrics import resolve_testbed

        layout = resolve_testbed(testbed)
        if layout.masks is None or not layout.masks.is_file():
            wanted = (
                "mask.pt (an unmasked regime has none: it is the control run of the masked regime's contrast scores)"
                if layout.is_release
                else "masks.safetensors"
            )
            raise FileNotFoundError(f"--testbed {testbed}: no {wanted} (give --masks FILE or --no-masks)")
    calib_fields(args.calib_fields)
    if args.activation_cache:
        writable("--activation-cache", args.activation_cache, directory=True)
    writable("--out", args.out or Path(args.after) / "lacuna_score", directory=True)
    if args.lacuna_files:  # a {target} layout: its root must be writable
        from lacuna_unlearn.bench.report.lacuna_keys import split_layout

        writable("--lacuna-files", split_layout(args.lacuna_files)[0], directory=True)


def calib_fields(value: str | None) -> list[str] | None:
    """``--calib-fields a,b`` as field keys (None or ``all``: every field); ValueError naming the known fields."""
    if value is None or value.strip() == "all":
        return None
    from lacuna_tasks import get_field

    names = [part.strip() for part in value.split(",") if part.strip()]
    if not names:
        raise ValueError(f"--calib-fields {value!r}: name at least one field (email, phone, birth_city, ...)")
    keys: list[str] = []
    for name in names:
        try:
            key = get_field(name).key
        except ValueError as exc:
            raise ValueError(f"--calib-fields: {exc}") from None
        keys += [key] if key not in keys else []
    return keys


def check_attack(args: argparse.Namespace) -> Path:
    """The attack's inputs and output; returns ``--out`` (default: ``MODEL_attack_PROTOCOL``)."""
    model = existing("--model", args.model, "dir")
    assert model is not None
    testbed_dir("--testbed", args.testbed)
    existing("--data", args.data, "dir")
    if args.testbed is None and args.data is None:
        raise ValueError("give --testbed DIR or --data DIR (the LACUNA data the probe and the attack read)")
    if args.budget is not None and args.budget not in ("forget", "all"):
        try:
            ok = int(args.budget) >= 1
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"--budget {args.budget!r}: use 'forget' (= |D_f|), 'all' or a row count >= 1")
    out = Path(args.out) if args.out else model.with_name(model.name + f"_attack_{args.protocol}")
    if out.exists() and not args.force:
        raise FileExistsError(f"--out {out} exists; pass --force to overwrite")
    writable("--out", out, directory=True)
    return out


def check_diagnose(args: argparse.Namespace) -> Path:
    if args.queries in ("forget", "retain") and args.data is None and args.testbed is None:
        raise ValueError(f"--queries {args.queries} reads a LACUNA split: give --testbed DIR or --data DIR")
    existing("--reference", args.reference, "dir")
    for path in args.updated:
        existing("--updated", path, "dir")
    testbed_dir("--testbed", args.testbed)
    existing("--data", args.data, "dir")
    if args.queries not in ("forget", "retain"):
        existing("--queries", args.queries, "file")
    out = Path(args.out) if args.out else Path(args.updated[0]).with_name("lacuna_diagnose")
    writable("--out", out, directory=True)
    return out


def check_reversibility(args: argparse.Namespace) -> dict | None:
    """The three results paths, ``--out``; returns the parsed ``--diagnose`` JSON (None without it)."""
    import json

    for flag in ("original", "unlearned", "relearned"):
        existing("--" + flag, getattr(args, flag))
    if args.out:
        writable("--out", args.out, directory=False)
    if not args.diagnose:
        return None
    existing("--diagnose", args.diagnose, "file")
    try:
        diag = json.loads(Path(args.diagnose).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--diagnose {args.diagnose}: not a JSON file: {exc}") from None
    if not isinstance(diag, dict) or not isinstance(diag.get("updated", []), list):
        raise ValueError(f"--diagnose {args.diagnose}: not a lacuna diagnose.json (no 'updated' list)")
    return diag


def set_key(item: str) -> str:
    """The setting a ``--set`` item names (``+``/``++`` prefixes dropped): ``seeds`` of ``seeds=[1,2]``."""
    return item.partition("=")[0].strip().lstrip("+")


def one_value(
    given: Mapping[str, tuple[str, Any]], items: Sequence[str], *, owned: Collection[str], paths: Collection[str] = ()
) -> dict[str, Any]:
    """The rule between a command's flags and its ``--set`` (docs/guide.md, "Configuration: presets and overrides"):
    the command line gives each setting one value. ``given``: setting -> (the flag as typed, its value as that
    setting) for the flags on the command line; ``items``: the ``--set`` items; ``owned``: every setting the
    command has a flag for. A setting given both ways with different values is refused before any work, naming
    both: whichever won silently, the other would be ignored. The same value both ways is accepted (``paths``:
    settings compared as normalised paths). Returns the parsed ``--set`` values of the ``owned`` settings."""
    from lacuna_unlearn.dataclass_config import parse_overrides

    named = {}
    for item in items:
        if (key := set_key(item)) in owned:
            named[key] = (item, parse_overrides([item.lstrip("+")])[key])
    for key, (flag, value) in given.items():
        if key not in named:
            continue
        item, other = named[key]
        same = os.path.normpath(str(value)) == os.path.normpath(str(other)) if key in paths else value == other
        if not same:
            raise ValueError(
                f"{flag} and --set {item} set {key} to different values: give one of them "
                "(docs/guide.md, 'Configuration: presets and overrides')"
            )
    return {key: value for key, (_, value) in named.items()}


def seed_list(text: str) -> list[int]:
    """``--seeds 1,2,3``: distinct non-negative integers (argparse turns the ValueError into a one-line error)."""
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative integers, got {text!r}")
    seeds = [int(t) for t in items]
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct, got {text!r}")
    return seeds
