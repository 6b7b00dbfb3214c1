"""Per-channel input activation norms x_j of the scored linear layers (FRAG, spec §3.2).

FRAG weighs each weight W_ij by how much its input channel j fires on forget text versus retain text.
That needs one vector per scored layer: the L2 norm of channel j over the tokens of one calibration
sequence, averaged over sequences, measured on the ORIGINAL model. Computing it costs two passes of
128 sequences through a possibly 7B model, so :func:`activation_stats` caches the vectors on disk,
keyed by a content fingerprint of the model files, the texts and the settings.

Spec: ``../shared/spec/papers.md`` §3.2 (x_j), §3.3 (which layers are scored).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.checkpoints import Checkpoint
from lacuna_metrics.manifest import save_tensors

__all__ = [
    "ALL_PROJECTIONS",
    "FORMAT_VERSION",
    "MLP_PROJECTIONS",
    "TARGETS",
    "ActivationStats",
    "activation_stats",
    "calibration_texts",
    "collect_input_norms",
    "eval_mode",
    "linear_weight_names",
    "model_device",
    "transposed_weight_names",
]

#: Bumped whenever the cached vectors would change for the same inputs.
FORMAT_VERSION = 1
#: ``--target all`` of the FRAG code: the seven projections of every transformer block.
ALL_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: ``--target mlp`` (FRP's scope).
MLP_PROJECTIONS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
TARGETS: tuple[str, ...] = ("all", "mlp", "linear")

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


def _conv1d_type() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    return Conv1D


def _scored_modules(model: torch.nn.Module, target: str) -> dict[str, torch.nn.Module]:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {list(TARGETS)}")
    conv1d = _conv1d_type()
    kinds: tuple[type, ...] = (torch.nn.Linear,) if conv1d is None else (torch.nn.Linear, conv1d)
    excluded: set[int] = set()
    for getter in ("get_output_embeddings", "get_input_embeddings"):
        fn = getattr(model, getter, None)
        module = fn() if callable(fn) else None
        if isinstance(module, torch.nn.Module):
            excluded.add(id(module))
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor):
                excluded.add(id(weight))
    wanted = ALL_PROJECTIONS if target == "all" else MLP_PROJECTIONS
    found: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if not isinstance(module, kinds):
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        if target == "linear":
            leaf = name.rsplit(".", 1)[-1]
            if id(module) in excluded or id(weight) in excluded or leaf == "lm_head" or "embed" in name:
                continue
        elif name.rsplit(".", 1)[-1] not in wanted:
            continue
        found[name] = module
    if not found:
        if target in ("all", "mlp"):
            raise ValueError(
                f"target={target!r} found no linear modules named {list(wanted)} in "
                f"{type(model).__name__}; for other architectures use target='linear'"
            )
        raise ValueError(f"target='linear' found no nn.Linear / Conv1D modules in {type(model).__name__}")
    return found


def linear_weight_names(model: torch.nn.Module, target: str = "all") -> dict[str, str]:
    """Map each scored module name to its weight's parameter name (``<module>.weight``), in model order.

    ``all``: the seven q/k/v/o/gate/up/down projections (spec §3.3); ``mlp``: gate/up/down; ``linear``: every
    ``nn.Linear`` and transformers ``Conv1D`` except ``lm_head`` and embeddings, for other architectures.
    Raises ValueError when nothing matches (with ``all`` this suggests ``target='linear'``).
    """
    return {name: f"{name}.weight" for name in _scored_modules(model, target)}


def transposed_weight_names(model: torch.nn.Module, target: str = "all") -> set[str]:
    """Weight names of scored transformers ``Conv1D`` modules (GPT-2), stored ``(d_in, d_out)``.

    FRAG broadcasts x over the input axis, which for these weights is the row axis, not the column axis.
    """
    conv1d = _conv1d_type()
    if conv1d is None:  # pragma: no cover
        return set()
    return {f"{name}.weight" for name, m in _scored_modules(model, target).items() if isinstance(m, conv1d)}


def _model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a parameterless module)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Evaluation mode inside the block, the previous train/eval mode restored after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def collect_input_norms(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    target: str = "all",
    max_length: int = 256,
    dtype: torch.dtype | None = torch.bfloat16,
) -> dict[str, torch.Tensor]:
    """x_j = (1/N) sum_n ||X^(n)_{:,j}||_2 for every scored layer, keyed by weight name (spec §3.2).

    Each text is tokenized on its own (truncation at ``max_length``, batch size 1, no padding, the tokenizer's
    special tokens) and run through ``model`` under ``torch.no_grad``; forward pre-hooks capture each scored
    layer's input X (T x d_in). Norms are taken in float32 and summed in float64, so only the forward pass runs in
    ``dtype``. If the model is not already in ``dtype`` it is converted IN PLACE (``model.to(dtype)``); pass
    ``dtype=None`` to run it as loaded. Returns float32 vectors of length d_in.
    """
    from tqdm.auto import tqdm

    texts = list(texts)
    if not texts:
        raise ValueError("collect_input_norms: no calibration texts given")
    if max_length < 1:
        raise ValueError(f"collect_input_norms: max_length must be >= 1, got {max_length}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"collect_input_norms: calibration text #{i} is {type(text).__name__}, not str")
    modules = _scored_modules(model, target)
    conv1d = _conv1d_type()
    if dtype is not None and _model_dtype(model) != dtype:
        model.to(dtype)
    device = model_device(model)

    totals: dict[str, torch.Tensor] = {}  # sum over sequences of per-sequence norms (float64)
    current: dict[str, torch.Tensor] = {}  # per-sequence sum of squares over tokens (float64)
    d_in: dict[str, int] = {}
    for name, module in modules.items():
        n_in = module.weight.shape[0] if conv1d is not None and isinstance(module, conv1d) else module.weight.shape[1]
        d_in[name] = int(n_in)
        totals[name] = torch.zeros(n_in, dtype=torch.float64)

    def make_hook(name: str):
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            x = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
            if x.shape[-1] != d_in[name]:
                raise ValueError(f"module {name!r}: input has {x.shape[-1]} channels, weight expects {d_in[name]}")
            sq = x.pow(2).sum(dim=0, dtype=torch.float64).cpu()
            current[name] = current[name] + sq if name in current else sq

        return hook

    handles = [m.register_forward_pre_hook(make_hook(n), with_kwargs=True) for n, m in modules.items()]
    try:
        with torch.no_grad(), eval_mode(model):
            for i, text in enumerate(tqdm(texts, desc="activation norms", disable=None, leave=False)):
                enc = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
                if enc["input_ids"].numel() == 0:
                    raise ValueError(f"collect_input_norms: calibration text #{i} tokenizes to zero tokens: {text!r}")
                current.clear()
                model(**{k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")})
                for name, sq in current.items():
                    totals[name] += sq.sqrt()
    finally:
        for h in handles:
            h.remove()
        current.clear()
    n = len(texts)
    return {f"{name}.weight": (total / n).to(torch.float32) for name, total in totals.items()}


# -- calibration text ---------------------------------------------------------------------------------------


def calibration_texts(source: str | os.PathLike[str] | None, split: str, n: int = 128) -> list[str]:
    """The first ``n`` calibration texts, formatted as LACUNA QA text (``Q: q\\nA: a\\n``).

    ``source`` is a LACUNA data source (anything :func:`lacuna_tasks.loader.load_data` accepts: a data or
    testbed directory; None = bundled data), whose ``split`` rows are formatted with ``qa_text``; or a text file:
    ``.jsonl`` (field ``text``, or ``question`` + ``answer``) or ``.txt`` (one text per non-empty line), for which
    ``split`` is ignored. FRAG's authors use the first 128 rows (spec §3.2).
    """
    from lacuna_tasks.prompts import qa_text

    if n < 1:
        raise ValueError(f"calibration_texts: n must be >= 1, got {n}")
    path = Path(source) if source is not None else None
    if path is not None and path.is_file():
        texts = _texts_from_file(path, n)
        if not texts:
            raise ValueError(f"calibration file {path} holds no texts")
        return texts
    from lacuna_tasks.loader import load_data

    data = load_data(source)
    if split not in data.splits:
        raise ValueError(f"{data.source}: no split {split!r} for calibration (found: {sorted(data.splits)})")
    texts = [qa_text(str(r["question"]), str(r["answer"])) for r in data.splits[split][:n]]
    if not texts:
        raise ValueError(f"{data.source}: split {split!r} is empty, no calibration texts")
    return texts


def _texts_from_file(path: Path, n: int) -> list[str]:
    from lacuna_tasks.loader import read_rows
    from lacuna_tasks.prompts import qa_text

    suffix = path.suffix.lower()
    if suffix == ".txt":
        with path.open(encoding="utf-8") as fh:
            return [line.rstrip("\r\n") for line in fh if line.strip()][:n]
    if suffix != ".jsonl":
        raise ValueError(f"calibration file {path}: expected a .jsonl or .txt file")
    texts: list[str] = []
    for lineno, row in enumerate(read_rows(path)[:n], 1):
        if isinstance(row.get("text"), str):
            texts.append(row["text"])
        elif isinstance(row.get("question"), str) and isinstance(row.get("answer"), str):
            texts.append(qa_text(row["question"], row["answer"]))
        else:
            raise ValueError(f"{path}: row {lineno}: expected a string field 'text', or 'question' and 'answer'")
    return texts


# -- cached statistics --------------------------------------------------------------------------------------


@dataclass
class ActivationStats:
    """Forget and retain activation norms of one model (weight name -> float32 vector), with provenance."""

    forget: dict[str, torch.Tensor]
    retain: dict[str, torch.Tensor]
    fingerprint: str
    cached: bool = False
    #: Weight names stored ``(d_in, d_out)`` (transformers ``Conv1D``): x indexes their rows.
    conv1d_transposed: frozenset[str] = field(default_factory=frozenset)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fingerprint(
    model_dir: Path,
    tokenizer_dir: Path,
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    target: str,
    max_length: int,
    dtype: torch.dtype,
) -> str:
    extra = [model_dir / "config.json"] + [tokenizer_dir / f for f in _TOKENIZER_FILES]
    payload = {
        "format": FORMAT_VERSION,
        "weights": Checkpoint(model_dir).fingerprint(),
        "config_and_tokenizer": {p.name: _sha256(p.read_bytes()) for p in extra if p.is_file()},
        "forget_texts": [_sha256(t.encode("utf-8")) for t in forget_texts],
        "retain_texts": [_sha256(t.encode("utf-8")) for t in retain_texts],
        "target": target,
        "max_length": int(max_length),
        "dtype": str(dtype).removeprefix("torch."),
    }
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
    except (OSError, SafetensorError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable activation cache {path}: {exc}", stacklevel=3)
        return None
    forget = {k.removeprefix("forget/"): v.to(torch.float32) for k, v in tensors.items() if k.startswith("forget/")}
    retain = {k.removeprefix("retain/"): v.to(torch.float32) for k, v in tensors.items() if k.startswith("retain/")}
    if not forget or set(forget) != set(retain):
        warnings.warn(f"ignoring activation cache {path}: forget/retain entries do not match", stacklevel=3)
        return None
    return ActivationStats(forget, retain, fingerprint, cached=True, conv1d_transposed=transposed)


def _save_cache(path: Path, stats: ActivationStats) -> None:
    tensors = {f"forget/{k}": v for k, v in stats.forget.items()}
    tensors.update({f"retain/{k}": v for k, v in stats.retain.items()})
    meta = {
        "format": str(FORMAT_VERSION),
        "fingerprint": stats.fingerprint,
        "conv1d_transposed": json.dumps(sorted(stats.conv1d_transposed)),
    }
    save_tensors(path, tensors, meta)


def _dtype_kwarg() -> str:
    """``dtype`` on transformers >= 4.56, ``torch_dtype`` before (the old name warns on 5.x)."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def activation_stats(
    model_dir: str | os.PathLike[str],
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    target: str = "all",
    max_length: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    tokenizer_dir: str | os.PathLike[str] | None = None,
) -> ActivationStats:
    """x^f and x^r of the ORIGINAL model in ``model_dir`` (spec §3.2), cached in ``cache_dir`` if given.

    The cache file ``<cache_dir>/<hex digest>.safetensors`` (keys ``forget/<weight>`` and ``retain/<weight>``) is
    keyed by a SHA-256 fingerprint of the weight files (size, first/last MiB, safetensors header), config and
    tokenizer files, the texts, ``target``, ``max_length``, ``dtype`` and :data:`FORMAT_VERSION`. A hit does not load
    the model. The model is loaded from local files only, without remote code, and freed before returning.
    """
    model_path = Path(model_dir)
    if not model_path.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_path}")
    tok_path = Path(tokenizer_dir) if tokenizer_dir is not None else model_path
    forget_texts, retain_texts = list(forget_texts), list(retain_texts)
    if not forget_texts:
        raise ValueError(f"activation_stats({model_path}): no forget calibration texts")
    if not retain_texts:
        raise ValueError(f"activation_stats({model_path}): no retain calibration texts")
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {list(TARGETS)}")
    fingerprint = _fingerprint(model_path, tok_path, forget_texts, retain_texts, target, max_length, dtype)
    cache_file = _cache_path(Path(cache_dir), fingerprint) if cache_dir is not None else None
    if cache_file is not None and cache_file.is_file():
        hit = _load_cache(cache_file, fingerprint)
        if hit is not None:
            return hit

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_path, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, local_files_only=True, trust_remote_code=False, **{_dtype_kwarg(): dtype}
    )
    try:
        transposed = frozenset(transposed_weight_names(model, target))
        forget = collect_input_norms(model, tokenizer, forget_texts, target=target, max_length=max_length, dtype=dtype)
        retain = collect_input_norms(model, tokenizer, retain_texts, target=target, max_length=max_length, dtype=dtype)
    finally:
        del model
        gc.collect()
    stats = ActivationStats(forget, retain, fingerprint, cached=False, conv1d_transposed=transposed)
    if cache_file is not None:
        _save_cache(cache_file, stats)
    return stats
