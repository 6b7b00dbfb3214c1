"""Leak audit of a testbed: how well do detectors that need no unlearning method find the masks?

A localization AUC means something only if it beats what a detector that knows nothing of the forget facts
gets on the same testbed. This module scores such detectors through the same scorer as ``lacuna score``
(:class:`lacuna_metrics.localization.precision.Localization`: every scoring family, the composite, every target):

* the trivial detectors of the scorer's ``baselines``: ``before_magnitude`` (|θ_before|) and
  ``injection_magnitude`` (|θ_before − θ_base|), and ``trace_classifier``, a classifier on both
  (:mod:`lacuna_metrics.localization.trace_classifier`);
* **null updates**, "unlearning" updates that know nothing of the masks, scored as if a method had made
  them: ``gaussian`` (θ_before + N(0, (scale · RMS of the tensor)²) on every scalar) and ``adam_sign``
  (θ_before ± lr on every scalar with random signs: the shape of Adam's first steps). Both are generated
  block by block on read (:class:`NullUpdate`, seeded per tensor and row chunk, seeds recorded), so the
  audit streams like ``lacuna score``: no second model in memory, nothing written.

A testbed whose null detectors reach a high AUC rewards any update whose magnitude or direction correlates
with the injection, whatever it erased (docs/testbeds.md, "Leak audit"). :func:`audit_testbed` is the
testbed builder's gate; :func:`leak_audit` takes the checkpoints themselves. These fixed-size null updates
describe the testbed; ``lacuna score`` calibrates each update against nulls at its own scale instead
(:mod:`lacuna_metrics.localization.null_calibration`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.localization.auc import TARGETS
from lacuna_metrics.localization.nulls import ROUNDED_DTYPES
from lacuna_metrics.localization.precision import BASELINES, Localization, LocalizationConfig
from lacuna_metrics.localization.trace_classifier import TRACE_CLASSIFIER, trace_classifier_aucs
from lacuna_metrics.masks import MaskReader
from lacuna_metrics.weights.checkpoints import Checkpoint, Scratch
from lacuna_tasks import stable_seed

__all__ = [
    "AUC_SETTINGS",
    "NULL_KINDS",
    "ROUNDED_DTYPES",
    "LeakAuditError",
    "NullUpdate",
    "audit_testbed",
    "auc_settings",
    "leak_audit",
    "rounding_of",
    "score_null_updates",
    "stored_as",
]

#: The null updates, in report order.
NULL_KINDS: tuple[str, ...] = ("gaussian", "adam_sign")
#: Noise is drawn per chunk of about this many scalars (whole rows), so a block's noise does not depend on
#: how the scorer cuts tensors into blocks.
CHUNK_SCALARS = 1 << 16

PathLike = str | os.PathLike[str]


class LeakAuditError(ValueError):
    """A detector that needs no unlearning method scored above the allowed AUC (the message names it)."""


class NullUpdate(Checkpoint):
    """``before`` plus a null update, generated on read: a checkpoint the scorer reads like any other.

    ``kind="gaussian"``: every scalar gets ``scale · rms(tensor) · N(0, 1)`` (rms of the ``before`` tensor);
    ``kind="adam_sign"``: every scalar gets ``±scale`` with a random sign. Noise of rows ``[r0, r1)`` of
    chunk ``c`` comes from a generator seeded with ``(seed, kind, tensor name, c)``: reproducible, and
    independent of the scorer's block size and thread count.

    The updated values are rounded to the dtype ``stored_like`` (default ``before``) stores each tensor in, as a
    saved method-free checkpoint would be: on a bf16 pair most of a small update rounds away, and which scalars
    keep theirs depends on |θ| (docs/scoring.md, "Null calibration"). float32 and float64 tensors are not rounded.
    """

    def __init__(
        self, before: Checkpoint, kind: str, *, seed: int, scale: float, stored_like: Checkpoint | None = None
    ) -> None:
        if kind not in NULL_KINDS:
            raise ValueError(f"unknown null update {kind!r}; choose from {list(NULL_KINDS)}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"null update {kind}: scale must be a positive number, got {scale!r}")
        # ``before``'s layout (names, shapes, aliases, config.json); only the values differ
        self.path = before.path
        self._infos, self._aliases, self._files = before._infos, before._aliases, before._files
        self._pickle_cache = None
        self._fingerprint = None
        self._source = before
        self._stored_like = stored_like if stored_like is not None else before
        self.kind, self.seed, self.scale = kind, int(seed), float(scale)
        self._rms: dict[str, float] = {}
        self._lock = threading.Lock()

    def fingerprint(self) -> str:
        return f"null:{self.kind}:seed={self.seed}:scale={self.scale}:{self._source.fingerprint()}"

    def read_stored(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        check_finite: bool = True,
        scratch: Scratch | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[start, stop)`` of ``before`` plus the null update, as float32 (stored as nothing else: the pair
        is that tensor twice). A fresh tensor; ``scratch`` unused (the scorer reads ``before`` into it). Every read
        of the scorer comes here (``Checkpoint.read`` too)."""
        values = self._source.read(name, start, stop, check_finite=check_finite).clone()
        stop = self.info(name).rows if stop is None else stop
        if values.numel():
            values += self.noise(name, start, stop).reshape(values.shape)
            dtype = rounding_of(self._stored_like, name)
            if dtype is not None:  # what saving it in that dtype keeps
                values = values.to(dtype).to(torch.float32)
        return values, values

    def read_raw(
        self, name: str, start: int = 0, stop: int | None = None, *, scratch: Scratch | None = None
    ) -> torch.Tensor:
        return self.read(name, start, stop, check_finite=False)

    def noise(self, name: str, start: int, stop: int) -> torch.Tensor:
        """The null update of rows ``[start, stop)`` of ``name``, flat float32."""
        info = self.info(name)
        row = max(1, math.prod(info.shape[1:]))
        chunk_rows = max(1, CHUNK_SCALARS // row)
        amplitude = self.scale * (self._tensor_rms(name) if self.kind == "gaussian" else 1.0)
        parts = []
        for chunk in range(start // chunk_rows, (max(stop, start + 1) - 1) // chunk_rows + 1):
            lo, hi = chunk * chunk_rows, min(info.rows, (chunk + 1) * chunk_rows)
            gen = torch.Generator().manual_seed(stable_seed("null-update", self.kind, self.seed, name, chunk))
            count = (hi - lo) * row if info.shape else 1
            if self.kind == "gaussian":
                draw = torch.randn(count, generator=gen)
            else:
                draw = torch.randint(0, 2, (count,), generator=gen).to(torch.float32).mul_(2).sub_(1)
            a, b = (max(start, lo) - lo) * row, (min(stop, hi) - lo) * row
            parts.append(draw[a:b] if info.shape else draw)
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out.mul_(amplitude)

    def _tensor_rms(self, name: str) -> float:
        with self._lock:
            cached = self._rms.get(name)
        if cached is not None:
            return cached
        total, count = 0.0, 0
        for lo, hi in self._source.iter_blocks(name, 1 << 20):
            block = self._source.read(name, lo, hi, check_finite=False).double()
            total += float((block * block).sum())
            count += block.numel()
        rms = math.sqrt(total / count) if count else 0.0
        with self._lock:
            self._rms[name] = rms
        return rms


def leak_audit(
    before: PathLike,
    masks: PathLike,
    *,
    base: PathLike | None = None,
    seed: int = 0,
    gaussian_scale: float = 1e-3,
    adam_lr: float = 1e-5,
    composite_samples: int = 200_000,
    max_auc: float = 0.60,
    target: str = "all",
    null_max_auc: float | None = None,
    null_target: str | None = None,
    trace_samples: int = 200_000,
    raise_on_leak: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """AUCs of the trivial detectors (``before_magnitude``, ``injection_magnitude`` and the
    :mod:`~lacuna_metrics.localization.trace_classifier` on both, ``trace_classifier``) and of both null updates under
    every scoring family and target.

    ``before`` is the model a method would unlearn, ``base`` the reference before injection (the reversal
    family, ``injection_magnitude`` and the classifier's second feature need it). ``passed`` says whether every
    trivial detector stays at or below ``max_auc`` on ``target`` (``"all"``: every target) and every null-update
    detector at or below ``null_max_auc`` on ``null_target`` (default: the same as the trivial ones); with
    ``raise_on_leak`` a failure raises :class:`LeakAuditError` (one line, naming the detectors above the line).
    """
    gates = {"trivial": (target, max_auc), "null": (null_target or target, null_max_auc or max_auc)}
    for which, (name, _) in gates.items():
        if name != "all" and name not in TARGETS:
            raise ValueError(f"leak audit {which} target {name!r}: choose from {['all', *TARGETS]}")
    started = time.perf_counter()
    before_ck = Checkpoint(before)
    base_ck = Checkpoint(base) if base is not None else None
    config = LocalizationConfig(
        composite_samples=composite_samples,
        seed=seed,
        **({"threads": threads} if threads is not None else {}),
    )
    scales = {"gaussian": gaussian_scale, "adam_sign": adam_lr}
    aucs, first = score_null_updates(before_ck, masks, base=base_ck, config=config, scales=scales)
    trivial = {b: {t: _round(first["baselines"][t].get(b)) for t in TARGETS} for b in BASELINES}
    classifier = trace_classifier_aucs(before, masks, base=base, samples=trace_samples, seed=seed)
    trivial[TRACE_CLASSIFIER] = {t: _round(classifier["auc"].get(t)) for t in TARGETS}
    not_applicable = dict(first["not_applicable"])
    universe = {k: v for k, v in first["universe"].items() if k != "names"}
    null = {
        kind: {s: {t: _round(v) for t, v in by_target.items()} for s, by_target in table.items()}
        for kind, table in aucs.items()
    }
    detectors = {
        "trivial": trivial,
        "null": {f"null_{k}.{s}": v for k, table in null.items() for s, v in table.items()},
    }
    ranked, offenders = [], []
    for which, (name, limit) in gates.items():
        for detector, by_target in detectors[which].items():
            for t in TARGETS if name == "all" else (name,):
                if by_target.get(t) is not None:
                    ranked.append((detector, t, by_target[t]))
                    if by_target[t] > limit:
                        offenders.append((detector, t, by_target[t]))
    ranked.sort(key=lambda item: -item[2])
    offenders.sort(key=lambda item: -item[2])
    worst = {"detector": ranked[0][0], "target": ranked[0][1], "auc": ranked[0][2]} if ranked else None
    out = {
        "target": gates["trivial"][0],
        "max_auc": gates["trivial"][1],
        "null_target": gates["null"][0],
        "null_max_auc": gates["null"][1],
        "passed": not offenders,
        "worst": worst,
        "trivial": trivial,
        "trace_classifier": {k: v for k, v in classifier.items() if k not in ("auc", "inputs")},
        "null": null,
        "null_updates": {
            "gaussian": {"seed": seed, "scale": gaussian_scale, "of": "each tensor's RMS in the before model"},
            "adam_sign": {"seed": seed, "lr": adam_lr, "of": "+-lr on every scalar, random signs"},
        },
        "not_applicable": not_applicable,
        "universe": universe,
        "inputs": {
            "before": str(Path(before)),
            "base": str(Path(base)) if base is not None else None,
            "masks": str(Path(masks)),
        },
        "composite_samples": composite_samples,
        "settings": auc_settings(config),
        "seconds": round(time.perf_counter() - started, 1),
    }
    dtypes = stored_as(before_ck)
    for entry in out["null_updates"].values():
        entry["stored_as"] = dtypes
    if offenders and raise_on_leak:
        listed = ", ".join(f"{name} {auc:.3f} on {t}" for name, t, auc in offenders[:4])
        more = f" and {len(offenders) - 4} more" if len(offenders) > 4 else ""
        rules = " / ".join(
            dict.fromkeys(f"above {limit} AUC on {'every target' if t == 'all' else t}" for t, limit in gates.values())
        )
        raise LeakAuditError(
            f"detectors that need no unlearning method score {rules}: {listed}{more} "
            "(the masks are visible without any method; docs/testbeds.md, 'Leak audit')"
        )
    return out


def score_null_updates(
    before: Checkpoint,
    masks: PathLike,
    *,
    base: Checkpoint | None,
    config: LocalizationConfig,
    scales: Mapping[str, float],
    stored_like: Checkpoint | None = None,
    control: tuple[Checkpoint, Checkpoint] | None = None,
    crossfield: Sequence[Checkpoint] = (),
) -> tuple[dict[str, dict[str, dict[str, float | None]]], dict[str, Any]]:
    """Score every null update of :data:`NULL_KINDS` (seeded with ``config.seed``, at ``scales[kind]``, stored like
    ``stored_like``, default ``before``) through the scorer, under every family and target: ``({kind: {family:
    {target: AUC}}}, the first update's localization section)``. The one loop behind the leak audit and ``lacuna
    score``'s null calibration. ``control`` and ``crossfield`` are the scored method's own control and per-field
    runs, so the contrast and crossfield families are calibrated on what they read besides the update."""
    null: dict[str, dict[str, dict[str, float | None]]] = {}
    first: dict[str, Any] = {}
    for kind in NULL_KINDS:
        after = NullUpdate(before, kind, seed=config.seed, scale=scales[kind], stored_like=stored_like)
        loc = Localization(
            before, after, MaskReader(masks), base=base, control=control, crossfield=crossfield, config=config
        )
        result = loc.run()
        first = first or result
        families = [s for s in result["auc"][next(iter(TARGETS))] if s != "best"]
        null[kind] = {s: {t: result["auc"][t].get(s) for t in TARGETS} for s in families}
    return null, first


#: The scorer settings that change an AUC (ties, the composite's sample, histogram resolution), recorded with an
#: audit so its figures can be compared with a score's.
AUC_SETTINGS = ("qtile_ties", "composite", "composite_samples", "bins_bits", "exact_limit")


def auc_settings(config: LocalizationConfig) -> dict[str, Any]:
    """The :data:`AUC_SETTINGS` of ``config``, as an audit records them. A composite that is off (``composite``
    false or no samples) is recorded as off whatever its sample size, since no AUC depends on it then."""
    out = {name: getattr(config, name) for name in AUC_SETTINGS}
    out["composite"] = bool(config.composite and config.composite_samples > 0)
    if not out["composite"]:
        out["composite_samples"] = 0
    return out


def stored_as(ckpt: Checkpoint) -> list[str]:
    """The floating dtypes ``ckpt`` stores its tensors in (``["bfloat16"]``): null updates stored like it are
    rounded to them (:data:`ROUNDED_DTYPES`); recorded beside their AUCs."""
    dtypes = {ckpt.info(n).dtype for n in ckpt.names if not ckpt.is_alias(n)}
    return sorted(str(d).removeprefix("torch.") for d in dtypes if d.is_floating_point)


def rounding_of(ckpt: Checkpoint, name: str) -> torch.dtype | None:
    """The dtype a null update stored like ``ckpt`` is rounded to in tensor ``name`` (None: not rounded)."""
    dtype = ckpt.info(name).dtype
    return dtype if dtype in ROUNDED_DTYPES else None


def audit_testbed(testbed: PathLike, **kwargs: Any) -> dict[str, Any]:
    """:func:`leak_audit` of a testbed directory: ``model/`` (before), ``base/`` and ``masks.safetensors``."""
    root = Path(testbed)
    for need in ("model", "masks.safetensors"):
        if not (root / need).exists():
            raise FileNotFoundError(f"{root} is not a testbed: {need} is missing")
    base = root / "base" if (root / "base").is_dir() else None
    return leak_audit(root / "model", root / "masks.safetensors", base=base, **kwargs)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)
