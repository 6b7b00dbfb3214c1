"""Method-free updates of a given size: the noise controls ``null_gaussian`` and ``null_weight_decay``.

These are NOT unlearning methods. They know nothing of the forget or retain data (the rows are ignored), so a
meta-evaluation can put them in its pool of unlearned models and check that no predictor ranks them as robust
forgetting (docs/unlearning.md, "Noise controls"). Training-free editors of :mod:`lacuna_unlearn.methods.registry`.

For every tensor θ in ``scope`` (default ``all``: the 2-D projection weights of the transformer blocks, the set
FRAG scores, named by :func:`lacuna_metrics.linear_weight_names`; embeddings, ``lm_head``, norms and biases are left
unchanged), in float32:

* ``gaussian``: δ = N(0, 1) per scalar, scaled so that ‖δ‖₂ = ``size`` × ‖θ‖₂;
* ``weight_decay``: δ = −``size`` × θ (decoupled weight decay; ‖δ‖₂ = ``size`` × ‖θ‖₂, no draws).

θ + δ is rounded to the dtype the tensor is stored in, as a saved checkpoint would be, so the stored update is not
exactly ``size`` where the dtype's resolution is coarse against it (bfloat16 below about 1e-2: its relative spacing is
2^-8 to 2^-7, and a weight decay of 1e-3 rounds back to θ everywhere). The manifest records the measured relative L2
of every stored tensor, and a warning names the tensors more than 10% off ``size``.

The draws come from a ``torch.Generator`` seeded per tensor with ``stable_seed(seed, "method-free", name)``: the same
seed gives byte-identical weights, and a tensor's draw does not depend on which other tensors are updated or in what
order.

The definitions are those of the scorer's null kinds of the same names (:data:`lacuna_metrics.localization.nulls.
NULL_KINDS`), but sized relative to θ instead of to a scored update. Their code is not reused:
:func:`~lacuna_metrics.localization.nulls.null_deltas` works on a :class:`~lacuna_metrics.localization.nulls.
NullSample` (a sample of scalars, one numpy generator per kind and draw, the size taken from the method's update), not
on whole tensors; each formula here is one line.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics import check_target, linear_weight_names
from lacuna_tasks import stable_seed
from lacuna_unlearn.methods.frp import _is_real, editor_paths, load_stored, publish_edit
from lacuna_unlearn.methods.settings import MethodFreeSettings

__all__ = ["KINDS", "MethodFreeConfig", "apply_method_free", "method_free_delta", "run_from_config", "run_method_free"]

logger = logging.getLogger(__name__)

#: The update kinds: what each adds to a tensor θ (recorded in the manifest).
KINDS: dict[str, str] = {
    "gaussian": "N(0, 1) per scalar, scaled per tensor so that ||delta||_2 = size x ||theta||_2",
    "weight_decay": "-size x theta (decoupled weight decay; no draws)",
}
#: A stored tensor whose relative L2 is further than this fraction from ``size`` is reported (rounding).
_OFF_SIZE = 0.1


@dataclass
class MethodFreeConfig(MethodFreeSettings):
    """The settings (:class:`lacuna_unlearn.methods.settings.MethodFreeSettings`) plus the run's ``seed``, checked."""

    seed: int = 42

    def validate(self) -> MethodFreeConfig:
        """Raise ValueError naming the offending ``method.args`` key; return self."""
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise ValueError(f"method.args.kind: unknown kind {self.kind!r}; expected one of {list(KINDS)}")
        if not _is_real(self.size) or not math.isfinite(self.size) or self.size <= 0:
            raise ValueError(f"method.args.size must be a finite number > 0, got {self.size!r}")
        try:
            check_target(self.scope)
        except ValueError as exc:
            raise ValueError(f"method.args.scope: {exc}") from None
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        return self


def method_free_delta(theta: torch.Tensor, kind: str, size: float, generator: torch.Generator | None) -> torch.Tensor:
    """δ (float32, ``theta``'s shape) of ``kind`` for the float32 tensor ``theta`` (module docstring): ‖δ‖₂ =
    ``size`` × ‖θ‖₂. ``generator`` (a CPU one: the same draw on every device) is used by ``gaussian`` only; a zero θ
    gets a zero δ."""
    if kind == "weight_decay":
        return theta * (-size)
    if kind != "gaussian":
        raise ValueError(f"unknown kind {kind!r}; expected one of {list(KINDS)}")
    noise = torch.randn(theta.shape, generator=generator, dtype=torch.float32).to(theta.device)  # drawn on the CPU
    norm_theta, norm_noise = float(theta.double().norm()), float(noise.double().norm())
    return noise * (size * norm_theta / norm_noise if norm_noise > 0 else 0.0)


def apply_method_free(model: torch.nn.Module, cfg: MethodFreeConfig) -> dict[str, Any]:
    """Add the update to every ``cfg.scope`` weight of ``model`` in place, rounded to the weight's dtype. Returns
    ``{"relative_l2": {name: ||theta' - theta|| / ||theta|| of the stored tensor (None for a zero theta)}, ...}``."""
    cfg.validate()
    try:
        names = list(linear_weight_names(model, cfg.scope).values())
    except ValueError as exc:
        raise ValueError(f"method.args.scope={cfg.scope!r}: {exc}") from None
    params = dict(model.named_parameters(remove_duplicate=False))
    measured: dict[str, float | None] = {}
    dtypes: set[str] = set()
    seen: set[int] = set()
    with torch.no_grad():
        for name in names:
            weight = params[name]
            if weight.data_ptr() in seen:  # a weight shared by two modules is updated once
                continue
            seen.add(weight.data_ptr())
            theta = weight.detach().to(torch.float32)
            generator = torch.Generator().manual_seed(stable_seed(cfg.seed, "method-free", name))
            stored = (theta + method_free_delta(theta, cfg.kind, cfg.size, generator)).to(weight.dtype)
            norm = float(theta.double().norm())
            measured[name] = float((stored.double() - theta.double()).norm()) / norm if norm > 0 else None
            weight.copy_(stored)
            dtypes.add(str(weight.dtype).removeprefix("torch."))
    values = [v for v in measured.values() if v is not None]
    off = [n for n, v in measured.items() if v is not None and abs(v - cfg.size) > _OFF_SIZE * cfg.size]
    if off:
        logger.warning(
            "[method-free] %d of %d tensors store a relative L2 more than %d%% from size=%g (%.3g .. %.3g): the "
            "stored dtype (%s) rounds an update this small; the manifest records each tensor's",
            len(off), len(measured), round(100 * _OFF_SIZE), cfg.size, min(values), max(values), ", ".join(sorted(dtypes)),
        )  # fmt: skip
    return {
        "tensors": len(measured),
        "scalars": sum(params[n].numel() for n in measured),
        "dtypes": sorted(dtypes),
        "relative_l2": measured,
        "relative_l2_range": [min(values), max(values)] if values else None,
        "tensors_off_size": off,
    }


def run_method_free(
    model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], cfg: MethodFreeConfig | None = None
) -> Path:
    """Load ``model_dir`` in its stored dtype, apply the update and save model + tokenizer +
    ``unlearn_manifest.json`` to ``out_dir`` (built in ``<out_dir>.partial``, renamed at the end; an existing
    ``out_dir`` is an error)."""
    cfg = (cfg or MethodFreeConfig()).validate()
    started = time.perf_counter()
    model_path, out = editor_paths(model_dir, out_dir)
    model, tokenizer = load_stored(model_path)
    manifest = {
        "method": f"null_{cfg.kind}",
        "spec": "lacuna_unlearn/methods/method_free.py: a method-free update (noise control), not an unlearning method",
        "update_kind": KINDS[cfg.kind],
        "config": asdict(cfg),
        "model_dir": str(model_path),
        "data": "none: the forget and retain rows are ignored",
        "update": apply_method_free(model, cfg),
    }
    return publish_edit(model, tokenizer, out, manifest, seed=cfg.seed, started=started)


def run_from_config(
    model: str | os.PathLike[str],
    forget_rows: Sequence[Mapping[str, Any]],
    retain_rows: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    args: Mapping[str, Any],
    *,
    seed: int = 42,
    data: Any = None,
) -> Path:
    """``lacuna-unlearn method=null_gaussian`` / ``method=null_weight_decay``: ``method.args`` =
    :class:`MethodFreeConfig`; ``forget_rows``, ``retain_rows`` and ``data`` are ignored (method-free)."""
    del forget_rows, retain_rows, data  # a noise control: the update knows nothing of the data
    try:
        cfg = MethodFreeConfig(**{"seed": seed, **args})
    except TypeError as exc:
        raise ValueError(f"method.args: {exc}") from None
    return run_method_free(model, out, cfg.validate())
