"""Method-free updates of a testbed's model, written as real safetensors checkpoints: the battery every null
calibration must not reward (issue 34). Each update knows nothing of the masks or the forget data; one
mask-restricted update is the positive control that must keep its verdict.

Written in the tests themselves (not by the package's own null generator) so the check is independent of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

Update = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor]


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt())


def gaussian(scale: float) -> Update:
    """θ + scale · rms(θ) · N(0, 1) on every scalar."""
    return lambda _n, t, g: t + scale * _rms(t) * torch.randn(t.shape, generator=g, dtype=torch.float64)


def weight_decay(lam: float) -> Update:
    """θ ← (1 − λ) θ (decoupled weight decay)."""
    return lambda _n, t, _g: t * (1.0 - lam)


def theta_noise(scale: float) -> Update:
    """θ + scale · |θ| · N(0, 1): noise whose size follows |θ|."""
    return lambda _n, t, g: t + scale * t.abs() * torch.randn(t.shape, generator=g, dtype=torch.float64)


def sign_step(step: float) -> Update:
    """θ ± step with random signs on every scalar (Adam's first steps)."""
    return lambda _n, t, g: t + step * (torch.randint(0, 2, t.shape, generator=g, dtype=torch.float64) * 2 - 1)


#: The battery: name -> update (Gaussian at 1e-3 .. 1e-1 x RMS, weight decay, |θ|-proportional noise, sign steps).
BATTERY: dict[str, Update] = {
    "gaussian_1e-3": gaussian(1e-3),
    "gaussian_1e-2": gaussian(1e-2),
    "gaussian_1e-1": gaussian(1e-1),
    "weight_decay_1e-2": weight_decay(1e-2),
    "theta_noise_3e-2": theta_noise(3e-2),
    "sign_1e-4": sign_step(1e-4),
    "sign_1e-3": sign_step(1e-3),
}


def write_update(
    model_dir: Path,
    out: Path,
    update: Update,
    *,
    dtype: torch.dtype,
    seed: int = 0,
    only: Callable[[str], torch.Tensor | None] | None = None,
) -> Path:
    """``model_dir``'s checkpoint with ``update`` applied to every floating tensor (in float64), saved as
    ``dtype``; the before model saved in ``dtype`` too (``out/before``) so the pair differs only by the update.
    ``only(name)`` may return a boolean mask of scalars the update is restricted to (None: leave the tensor).
    Returns ``out`` (holding ``before/`` and ``after/``)."""
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensors[name] = f.get_tensor(name)
    before, after = {}, {}
    for i, (name, t) in enumerate(sorted(tensors.items())):
        if not t.is_floating_point():
            before[name] = after[name] = t
            continue
        base = t.to(dtype).double()
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        moved = update(name, base, g)
        if only is not None:
            keep = only(name)
            moved = base if keep is None else torch.where(keep.reshape(base.shape), moved, base)
        before[name] = base.to(dtype).contiguous()
        after[name] = moved.to(dtype).contiguous()
    for side, state in (("before", before), ("after", after)):
        d = out / side
        d.mkdir(parents=True, exist_ok=True)
        save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((model_dir / "config.json").read_text())
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
        (d / "config.json").write_text(json.dumps(config))
    return out


def forget_mask_of(masks: Path) -> Callable[[str], torch.Tensor | None]:
    """``only`` for :func:`write_update`: the scalars of a tensor in any forget group's mask (None: not masked)."""
    from lacuna_metrics.masks.files import MaskReader

    reader = MaskReader(masks)

    def only(name: str) -> torch.Tensor | None:
        if name not in reader.names:
            return None
        shape = reader.shape(name)
        return (reader.read(name, shape, 0, shape[0]).to(torch.int32) & reader.forget_bits) != 0

    return only
