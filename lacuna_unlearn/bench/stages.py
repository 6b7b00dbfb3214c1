"""``lacuna run``'s stage cache: content-addressed stage directories and the one-run-per-``--out`` lock.

A stage lives in ``OUT/stages/<kind>-<key>/``, where the key is the SHA-256 of its inputs and the package
version, so a rerun redoes only what changed and a new release never reuses an old result (docs/measurements.md,
"What `lacuna run` produces").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from lacuna_metrics import exclusive_writer, tree_fingerprint
from lacuna_unlearn.publish import building

__all__ = ["Stages", "locked", "output_key", "stage_key", "testbed_fingerprint", "testbed_preset"]

logger = logging.getLogger(__name__)

#: The package whose version is part of every stage key (a cache key, not a manifest's package list).
_KEYED_PACKAGE = ("lacuna-bench",)


def stage_key(inputs: Mapping[str, Any]) -> str:
    """A stage's cache key: its inputs and the package version (a new release recomputes, never reuses)."""
    from lacuna_metrics import package_versions

    version = package_versions(_KEYED_PACKAGE).get("lacuna-bench")
    payload = json.dumps({"lacuna-bench": version, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold ``OUT/.lock`` for the run: a second ``lacuna run`` into the same ``--out`` fails at once instead of
    racing the first one's stages. An ``OUT`` this call created is removed again if the run left it empty (it
    failed before its first stage)."""
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive_writer(out, "lacuna run", lock=out / ".lock"):
            yield
    finally:
        if created:
            with suppress(OSError):
                out.rmdir()  # only when empty


class Stages:
    """Content-addressed stage directories: ``build(tmp_dir)`` runs only if the key's directory is missing.

    ``log`` receives one status line per stage (cached, running, done); ``timings`` maps each stage's label to
    its wall seconds (0 when cached) for the results manifest.
    """

    def __init__(self, root: Path, log: Callable[[str], None] = logger.info) -> None:
        self.root, self.log, self.timings = root, log, {}
        root.mkdir(parents=True, exist_ok=True)

    def get(self, kind: str, label: str, inputs: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
        """The directory of the stage ``kind`` with ``inputs``, built by ``build`` into a partial directory first
        (a failed build leaves nothing behind) unless a finished one exists."""
        key = stage_key({"kind": kind, **inputs})
        final = self.root / f"{kind}-{key}"
        if (final / "stage.json").is_file():
            problem = _changed_outputs(final)
            if problem is None:
                self.log(f"{label}: cached ({final.name})")
                self.timings[label] = 0.0
                return final
            self.log(f"{label}: cached outputs {problem}; rerunning")
        started = time.time()
        self.log(f"{label}: running ...")
        with building(final) as partial:
            build(partial)
            record = {"kind": kind, "inputs": inputs, "outputs": tree_fingerprint(partial, exclude=["stage.json"])}
            (partial / "stage.json").write_text(json.dumps(record, indent=2, default=str))
        self.timings[label] = round(time.time() - started, 1)
        self.log(f"{label}: done in {self.timings[label]:.0f} s")
        return final


def output_key(stage: Path) -> str:
    """The content fingerprint of a finished stage's outputs (recorded in its ``stage.json``): what the stages
    that read them key on, so a rebuilt stage whose outputs differ invalidates everything downstream."""
    return str(json.loads((stage / "stage.json").read_text())["outputs"])


def _changed_outputs(stage: Path) -> str | None:
    """Why a cached stage's outputs cannot be reused (None: they are the ones its ``stage.json`` recorded)."""
    try:
        recorded = json.loads((stage / "stage.json").read_text()).get("outputs")
    except (OSError, ValueError, AttributeError):
        return "have an unreadable stage.json"
    if not recorded:
        return "were recorded without a fingerprint"
    if tree_fingerprint(stage, exclude=["stage.json"]) != recorded:
        return "changed since they were written"
    return None


def testbed_preset(testbed: Path) -> str | None:
    """The preset a testbed was built from, as its ``manifest.json`` records it (None: it records none). A run
    given ``testbed:`` reports this, not its config's ``preset``, which names only what it builds without one. A
    LACUNA release regime directory reports ``lacuna-release:<size>/<regime>``."""
    from lacuna_metrics import is_release_dir

    if is_release_dir(testbed):
        return f"lacuna-release:{testbed.parent.name}/{testbed.name}"
    manifest = testbed / "manifest.json"
    try:
        preset = json.loads(manifest.read_text()).get("preset")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{manifest}: not a readable testbed manifest ({exc})") from exc
    return preset if isinstance(preset, str) else None


def testbed_fingerprint(testbed: Path) -> str:
    """The cache key of a testbed: the content of every file in it (models, masks, data, manifest), so editing or
    replacing any of them in place invalidates exactly the stages that read the testbed. On a LACUNA release, the
    parts a run reads (the model to unlearn, mask.pt, the data, the unmasked control), not the regime directory's
    ``unlearned_models/``, which runs write into."""
    from lacuna_metrics import resolve_testbed

    layout = resolve_testbed(testbed)
    if not layout.is_release:
        return tree_fingerprint(testbed, exclude=["stage.json"]).removeprefix("sha256:")[:16]
    parts = [layout.before, layout.masks, layout.data, layout.control_before]
    digest = hashlib.sha256()
    for part in parts:
        if part is None:
            digest.update(b"-\n")
        elif part.is_dir():
            digest.update(tree_fingerprint(part).encode() + b"\n")
        else:
            digest.update(hashlib.sha256(part.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()[:16]
