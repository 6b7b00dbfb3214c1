"""Where a testbed keeps its parts: a lacuna-bench testbed directory, or one regime directory of the authors'
LACUNA release as ``scripts/download_artifacts.py`` lays it out (docs/release.md, "The release as a testbed").

Every command that takes a testbed (``lacuna score --testbed``, ``lacuna-unlearn testbed=``, ``lacuna attack
--testbed``, ``lacuna run --set testbed=``) resolves it here, so both layouts are found the same way everywhere.

The release's regime directory ``<root>/<size>/<regime>/`` holds the model after (masked) continual pretraining,
``mask.pt`` (masked regime only), ``intruction_tuned/`` (sic: the model to unlearn; a user-corrected
``instruction_tuned/`` works too) and, once methods ran, ``unlearned_models/<Field>/<Method>/``. Its data is the
sibling ``<root>/<size>/data-<regime>/``, and the unmasked twin ``<root>/<size>/unmasked/`` is the control of the
contrast scores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: The release's folder of the model to unlearn: as published (misspelt), then the spelling a user may correct it to.
RELEASE_TUNED_DIRS: tuple[str, ...] = ("intruction_tuned", "instruction_tuned")
RELEASE_MASK_FILE = "mask.pt"
RELEASE_UNLEARNED_DIR = "unlearned_models"
TESTBED_MASK_FILE = "masks.safetensors"


@dataclass(frozen=True)
class Layout:
    """The parts of one testbed, by role. ``kind`` is ``testbed`` (lacuna-bench's) or ``release`` (LACUNA's)."""

    root: Path
    kind: str
    before: Path  # the model to unlearn
    data: Path | None
    masks: Path | None  # None: the layout has none (the release's unmasked regime)
    base: Path | None  # reference checkpoint of the reversal scores
    control_before: Path | None = None  # the unmasked control model before unlearning (contrast scores)
    regime: str | None = None
    size: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def is_release(self) -> bool:
        return self.kind == "release"

    def unlearned_dir(self, field_config: str, method_dir: str) -> Path:
        """Where LACUNA's scripts look for an unlearned model: ``<regime>/unlearned_models/<Field>/<Method>``."""
        return self.root / RELEASE_UNLEARNED_DIR / field_config / method_dir

    def control_after_for(self, after: str | os.PathLike[str]) -> Path | None:
        """The same method's run on the unmasked twin, when ``after`` sits at ``unlearned_models/<Field>/<Method>``
        of this regime and the twin's ``unmasked/unlearned_models/<Field>/<Method>`` exists (else None)."""
        if self.control_before is None:
            return None
        try:
            rel = Path(after).resolve().relative_to((self.root / RELEASE_UNLEARNED_DIR).resolve())
        except ValueError:
            return None
        twin = self.control_before.parent / RELEASE_UNLEARNED_DIR / rel
        return twin if twin.is_dir() else None


class LayoutError(FileNotFoundError):
    """A directory given as a testbed is neither layout; the message names it, what it holds and what was expected."""


def release_tuned_dir(regime_dir: str | os.PathLike[str]) -> Path | None:
    """The release's model to unlearn under ``regime_dir``: ``intruction_tuned/`` as published, else
    ``instruction_tuned/``; None when neither is a directory."""
    for name in RELEASE_TUNED_DIRS:
        candidate = Path(regime_dir) / name
        if candidate.is_dir():
            return candidate
    return None


def is_release_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regime directory of the LACUNA release (it holds the instruction-tuned model)."""
    return release_tuned_dir(path) is not None


def resolve_testbed(path: str | os.PathLike[str], *, name: str | None = None) -> Layout:
    """Resolve a testbed directory of either layout; :class:`LayoutError` naming what was found otherwise.
    ``name`` is how the message names the input (default ``testbed PATH``; e.g. ``--testbed PATH``)."""
    root = Path(path).expanduser()
    name = name or f"testbed {root}"
    if not root.is_dir():
        raise LayoutError(f"{name}: not a testbed (not a directory)")
    if (root / "manifest.json").is_file() and (root / "model").is_dir():
        return Layout(
            root=root,
            kind="testbed",
            before=root / "model",
            data=root / "data" if (root / "data").is_dir() else None,
            masks=root / TESTBED_MASK_FILE,  # where it belongs; reading a missing one fails naming it
            base=root / "base" if (root / "base").is_dir() else None,
        )
    tuned = release_tuned_dir(root)
    if tuned is None:
        found = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
        shown = (", ".join(found[:12]) + (", ..." if len(found) > 12 else "")) if found else "nothing"
        raise LayoutError(
            f"{name}: not a testbed: expected lacuna-bench's (manifest.json and model/) or a LACUNA release regime "
            f"directory (intruction_tuned/ or instruction_tuned/, mask.pt, sibling data-<regime>/); found: {shown}"
        )
    return _release_layout(root, tuned)


def _release_layout(root: Path, tuned: Path) -> Layout:
    regime, size = root.name, root.parent.name
    notes: list[str] = []
    data = root.parent / f"data-{regime}"
    if not data.is_dir():
        notes.append(f"no data directory {data}: give the data separately")
        data_dir: Path | None = None
    else:
        data_dir = data
    masks = root / RELEASE_MASK_FILE
    if not masks.is_file():
        notes.append(
            f"no {RELEASE_MASK_FILE} in {root} ({regime} regime): no ground truth, so no localization AUC; "
            "distances, FRAG and behaviour only"
        )
    # The authors' precision_metrics.py takes the regime's own model (after continual pretraining) as the reversal
    # scores' reference; the release does not ship the original OLMo checkpoint (docs/release.md).
    has_weights = any(root.glob("*.safetensors")) or any(root.glob("*.bin"))
    control = None
    if regime != "unmasked":
        twin = root.parent / "unmasked"
        control = release_tuned_dir(twin) if twin.is_dir() else None
        if control is None:
            notes.append(f"no unmasked twin {twin}/intruction_tuned: contrast scores fall back as without a control")
    if tuned.name != RELEASE_TUNED_DIRS[0]:
        notes.append(f"model to unlearn read from {tuned.name}/ (the release publishes it as {RELEASE_TUNED_DIRS[0]}/)")
    return Layout(
        root=root,
        kind="release",
        before=tuned,
        data=data_dir,
        masks=masks if masks.is_file() else None,
        base=root if has_weights else None,
        control_before=control,
        regime=regime,
        size=size,
        notes=tuple(notes),
    )
