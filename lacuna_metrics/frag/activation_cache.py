"""The activation statistics of one model (:class:`ActivationStats`) and their on-disk cache.

Measuring x^f and x^r costs two passes of 128 sequences through a possibly 7B model, so they are cached by a
content fingerprint of the model files, the texts and the settings: a hit never loads the model
(docs/definitions.md#frag-activation-statistics).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.manifest import save_tensors
from lacuna_metrics.weights.checkpoints import Checkpoint

__all__ = ["FORMAT_VERSION", "ActivationStats", "NormTable"]

#: Bumped whenever the cached vectors would change for the same inputs. 2: every block projection (anatomy),
#: per-expert vectors of fused experts, checkpoint tensor names, coverage in the metadata.
FORMAT_VERSION = 2

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)


class NormTable(dict):
    """Weight name -> activation norms, carrying ``coverage``: what the scored weights cover of the checkpoint.

    :func:`lacuna_metrics.frag.activations.activation_stats` returns its vectors in these, so a
    :class:`lacuna_metrics.frag.alignment.FragAccumulator` built from ``stats.forget`` reports the coverage even when its
    caller does not pass it on.
    """

    def __init__(self, *args: Any, coverage: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.coverage = coverage


@dataclass
class ActivationStats:
    """Forget and retain activation norms of one model (weight name -> float32 vector), with provenance.

    Vectors of fused 3-D expert tensors are ``[num_experts, d_in]``. ``coverage`` (see
    :func:`lacuna_metrics.frag.activations.activation_stats`) says what share of the checkpoint's block weights the names
    cover and what was left out.
    """

    forget: dict[str, torch.Tensor]
    retain: dict[str, torch.Tensor]
    fingerprint: str
    cached: bool = False
    #: Weight names stored with the input axis first (transformers ``Conv1D`` ``(d_in, d_out)``, fused experts
    #: ``[E, d_in, d_out]``): x indexes their rows.
    conv1d_transposed: frozenset[str] = field(default_factory=frozenset)
    coverage: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.coverage is not None:
            if not isinstance(self.forget, NormTable):
                self.forget = NormTable(self.forget)
            self.forget.coverage = self.coverage


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fingerprint(
    checkpoint: Checkpoint,
    model_dir: Path,
    tokenizer_dir: Path,
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    target: str,
    max_length: int,
    dtype: torch.dtype,
    fields: dict[str, list[str] | None] | None = None,
) -> str:
    extra = [model_dir / "config.json"] + [tokenizer_dir / f for f in _TOKENIZER_FILES]
    payload = {
        "format": FORMAT_VERSION,
        "weights": checkpoint.fingerprint(),
        "config_and_tokenizer": {p.name: _sha256(p.read_bytes()) for p in extra if p.is_file()},
        "forget_texts": [_sha256(t.encode("utf-8")) for t in forget_texts],
        "retain_texts": [_sha256(t.encode("utf-8")) for t in retain_texts],
        "target": target,
        "max_length": int(max_length),
        "dtype": str(dtype).removeprefix("torch."),
    }
    if fields and any(v is not None for v in fields.values()):  # absent for every field: earlier caches stay valid
        payload["calib_fields"] = fields
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + _sha256(canonical.encode("ascii"))


def _cache_path(cache_dir: Path, fingerprint: str) -> Path:
    # The file is named by the hex digest: ``sha256:`` would put a colon in the name (invalid on Windows).
    return cache_dir / f"{fingerprint.split(':', 1)[-1]}.safetensors"


def _load_cache(path: Path, fingerprint: str) -> ActivationStats | None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        if meta.get("fingerprint") != fingerprint or meta.get("format") != str(FORMAT_VERSION):
            raise ValueError("fingerprint or format mismatch")
        transposed = frozenset(json.loads(meta.get("conv1d_transposed", "[]")))
        coverage = json.loads(meta["coverage"]) if meta.get("coverage") else None
    except (OSError, SafetensorError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable activation cache {path}: {exc}", stacklevel=3)
        return None
    forget = {k.removeprefix("forget/"): v.to(torch.float32) for k, v in tensors.items() if k.startswith("forget/")}
    retain = {k.removeprefix("retain/"): v.to(torch.float32) for k, v in tensors.items() if k.startswith("retain/")}
    if not forget or set(forget) != set(retain):
        warnings.warn(f"ignoring activation cache {path}: forget/retain entries do not match", stacklevel=3)
        return None
    return ActivationStats(forget, retain, fingerprint, cached=True, conv1d_transposed=transposed, coverage=coverage)


def _save_cache(path: Path, stats: ActivationStats) -> None:
    tensors = {f"forget/{k}": v for k, v in stats.forget.items()}
    tensors.update({f"retain/{k}": v for k, v in stats.retain.items()})
    meta = {
        "format": str(FORMAT_VERSION),
        "fingerprint": stats.fingerprint,
        "conv1d_transposed": json.dumps(sorted(stats.conv1d_transposed)),
    }
    if stats.coverage is not None:
        meta["coverage"] = json.dumps(stats.coverage, sort_keys=True)
    save_tensors(path, tensors, meta)
