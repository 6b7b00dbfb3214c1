"""Per-channel input activation norms x_j of the scored projections (FRAG,
docs/definitions.md#frag-activation-statistics).

FRAG weighs each weight W_ij by how much its input channel j fires on forget text versus retain text.
That needs one vector per scored layer: the L2 norm of channel j over the tokens of one calibration
sequence, averaged over sequences, measured on the ORIGINAL model. Computing it costs two passes of
128 sequences through a possibly 7B model, so :func:`activation_stats` caches the vectors on disk,
keyed by a content fingerprint of the model files, the texts and the settings.

Which weights are scored comes from :mod:`lacuna_metrics.anatomy` (every projection of every block by default:
separate or fused q/k/v, fused gate/up, GPT-2 ``Conv1D``, MoE experts stored as modules or as fused 3-D
parameters). A fused ``[num_experts, d_out, d_in]`` parameter gets one vector per expert (``[num_experts, d_in]``),
measured on the tokens routed to that expert; see ``docs/anatomy.md`` ("FRAG"). :func:`activation_stats` keys the
vectors by the checkpoint's tensor names and reports what share of the block weights they cover.

Definitions: ``docs/definitions.md#frag-activation-statistics`` (x_j), ``#frag-score`` (which layers are scored).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.anatomy import Anatomy, Weight, checkpoint_anatomy, classify_name, layer_of, model_anatomy
from lacuna_metrics.checkpoints import Checkpoint
from lacuna_metrics.manifest import save_tensors

__all__ = [
    "ALL_PROJECTIONS",
    "DEFAULT_MIN_COVERAGE",
    "FORMAT_VERSION",
    "FRAG_TARGETS",
    "MLP_PROJECTIONS",
    "TARGETS",
    "ActivationStats",
    "NormTable",
    "activation_stats",
    "calibration_fields",
    "calibration_texts",
    "check_target",
    "collect_input_norms",
    "coverage_verdict",
    "eval_mode",
    "frag_preflight",
    "frag_weights",
    "linear_weight_names",
    "model_device",
    "transposed_weight_names",
]

#: Bumped whenever the cached vectors would change for the same inputs. 2: every block projection (anatomy),
#: per-expert vectors of fused experts, checkpoint tensor names, coverage in the metadata.
FORMAT_VERSION = 2
#: The seven projections of a Llama-style block: what ``all`` selects there (docs/definitions.md#frag-score).
ALL_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: What ``mlp`` (FRP's scope) selects in a Llama-style block.
MLP_PROJECTIONS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
#: FRAG targets: ``all``: every projection of every block (attention, MLP, experts, routers); ``attention``;
#: ``mlp``: MLP and expert projections; ``expert``: MoE experts only; ``linear``: every ``nn.Linear`` / ``Conv1D``
#: except ``lm_head`` and embeddings. Also ``regex:PATTERN``: the projections whose tensor name ``re.search``
#: matches (checkpoint names in :func:`activation_stats`, parameter names elsewhere). See docs/anatomy.md.
FRAG_TARGETS: tuple[str, ...] = ("all", "attention", "mlp", "expert", "linear")
#: The targets of the FRAG code (docs/definitions.md#frag-score), which FRP also accepts.
TARGETS: tuple[str, ...] = ("all", "mlp", "linear")
#: Below this share of the block weights, FRAG's result carries a coverage warning.
DEFAULT_MIN_COVERAGE = 0.9

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


def check_target(target: str) -> str:
    """Validate a FRAG target (see :data:`FRAG_TARGETS`); ValueError naming it otherwise."""
    if not isinstance(target, str):
        raise ValueError(f"unknown target {target!r}; expected one of {list(FRAG_TARGETS)} or regex:PATTERN")
    if target.startswith("regex:"):
        try:
            re.compile(target.removeprefix("regex:"))
        except re.error as exc:
            raise ValueError(f"target {target!r}: invalid regular expression: {exc}") from None
        return target
    if target not in FRAG_TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {list(FRAG_TARGETS)} or regex:PATTERN")
    return target


def _is_linear(module: torch.nn.Module, conv1d: type | None) -> bool:
    return isinstance(module, torch.nn.Linear) or (conv1d is not None and isinstance(module, conv1d))


def _linear_target(model: torch.nn.Module) -> list[Weight]:
    """``target='linear'``: every nn.Linear / Conv1D with a 2-D weight except embeddings and ``lm_head``."""
    conv1d = _conv1d_type()
    excluded: set[int] = set()
    for getter in ("get_output_embeddings", "get_input_embeddings"):
        fn = getattr(model, getter, None)
        module = fn() if callable(fn) else None
        if isinstance(module, torch.nn.Module):
            excluded.add(id(module))
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor):
                excluded.add(id(weight))
    found: list[Weight] = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not _is_linear(module, conv1d) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if id(module) in excluded or id(weight) in excluded or leaf == "lm_head" or "embed" in name:
            continue
        named = classify_name(f"{name}.weight")
        found.append(
            Weight(
                name=f"{name}.weight",
                layer=layer_of(f"{name}.weight"),
                component=named.component if named else "other",
                role=named.role if named else leaf,
                shape=tuple(weight.shape),
                transposed=conv1d is not None and isinstance(module, conv1d),
                module=name,
                hook="linear",
            )
        )
    return found


def _can_compute_mid(module: torch.nn.Module) -> bool:
    """Whether a fused experts module exposes what :func:`_expert_mid` needs to rebuild the down input."""
    params = dict(module.named_parameters(recurse=False))
    has_up = "gate_up_proj" in params or "up_proj" in params
    return has_up and callable(getattr(module, "act_fn", None))


def _frag_plan(model: torch.nn.Module, target: str) -> tuple[list[Weight], dict[str, str]]:
    """The weights to measure for ``target`` and the block weights left out (name -> reason)."""
    check_target(target)
    if target == "linear":
        return _linear_target(model), {}
    anatomy = model_anatomy(model)
    chosen: list[Weight] = []
    skipped: dict[str, str] = {}
    modules = dict(model.named_modules())
    for weight in anatomy.select(target):
        if (
            weight.hook == "experts"
            and weight.role in ("down", "fc_out")
            and not _can_compute_mid(modules[weight.module])
        ):
            skipped[weight.name] = "fused experts module without gate_up_proj/up_proj and act_fn (input not computable)"
        elif weight.hook in ("linear", "experts"):
            chosen.append(weight)
        else:
            skipped[weight.name] = "no module whose input can be observed"
    return chosen, skipped


def frag_weights(model: torch.nn.Module, target: str = "all") -> list[Weight]:
    """The weights FRAG scores in a loaded ``model`` for ``target``, in model order (see :data:`FRAG_TARGETS`).

    Raises ValueError when the target is unknown, the model's blocks cannot be found
    (:func:`lacuna_metrics.anatomy.model_anatomy`) or the target selects nothing.
    """
    chosen, _ = _frag_plan(model, target)
    if not chosen:
        who = type(model).__name__
        if target == "linear":
            raise ValueError(f"target='linear' found no nn.Linear / Conv1D modules in {who}")
        raise ValueError(f"target={target!r} matches no projection weight of {who} ({model_anatomy(model).summary()})")
    return chosen


def linear_weight_names(model: torch.nn.Module, target: str = "all") -> dict[str, str]:
    """Map each scored ``nn.Linear`` / ``Conv1D`` module to its weight's parameter name, in model order.

    ``all``: every linear projection of every block (the seven q/k/v/o/gate/up/down on Llama-style models,
    docs/definitions.md#frag-score; fused ``qkv`` / ``gate_up``, GPT-2 ``Conv1D``, per-expert modules elsewhere);
    ``attention``; ``mlp``: MLP and expert projections; ``linear``: every ``nn.Linear`` and transformers ``Conv1D``
    except ``lm_head`` and embeddings. Fused 3-D expert parameters and non-linear router modules are not modules with a
    2-D weight and are left out here (:func:`frag_weights` has them). Raises ValueError when nothing matches.
    """
    conv1d = _conv1d_type()
    modules = dict(model.named_modules())
    names = {
        w.module: w.name
        for w in frag_weights(model, target)
        if w.hook == "linear" and w.name.endswith(".weight") and _is_linear(modules[w.module], conv1d)
    }
    if not names:
        raise ValueError(f"target={target!r} matches no nn.Linear / Conv1D projection of {type(model).__name__}")
    return names


def transposed_weight_names(model: torch.nn.Module, target: str = "all") -> set[str]:
    """Names of the scored weights stored with the input axis first: transformers ``Conv1D`` (GPT-2),
    ``(d_in, d_out)``, and fused experts stored ``[E, d_in, d_out]``.

    FRAG broadcasts x over the input axis, which for these weights is the row axis, not the column axis.
    """
    return {w.name for w in frag_weights(model, target) if w.transposed}


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
    """x_j = (1/N) sum_n ||X^(n)_{:,j}||_2 for every scored weight, keyed by parameter name
    (docs/definitions.md#frag-activation-statistics).

    Each text is tokenized on its own (truncation at ``max_length``, batch size 1, no padding, the tokenizer's
    special tokens) and run through ``model`` under ``torch.no_grad``; forward pre-hooks capture each scored
    layer's input X (T x d_in). Norms are taken in float32 and summed in float64, so only the forward pass runs in
    ``dtype``. If the model is not already in ``dtype`` it is converted IN PLACE (``model.to(dtype)``); pass
    ``dtype=None`` to run it as loaded. Returns float32 vectors of length d_in; a fused ``[E, ., .]`` expert
    parameter gets ``[E, d_in]``: row e from the tokens the router sent to expert e (docs/anatomy.md, "FRAG").
    """
    chosen = frag_weights(model, target)
    return _collect(model, tokenizer, texts, chosen, max_length=max_length, dtype=dtype)


def _routed(args: tuple[Any, ...], kwargs: dict[str, Any], who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states [T, H], expert indices [T, k]) of a fused experts module's call."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    hidden = next((t for t in tensors if t.is_floating_point()), None)
    index = next((t for t in tensors if not t.is_floating_point() and t.dtype != torch.bool), None)
    if hidden is None or index is None:
        raise ValueError(f"experts module {who!r}: expected (hidden_states, expert indices, ...) as inputs")
    hidden = hidden.reshape(-1, hidden.shape[-1])
    return hidden, index.reshape(hidden.shape[0], -1)


def _expert_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    out = x @ weight if transposed else x @ weight.t()
    return out + bias if bias is not None else out


def _expert_mid(module: torch.nn.Module, x: torch.Tensor, e: int, transposed: bool) -> torch.Tensor:
    """The input of expert ``e``'s down projection for its routed tokens ``x``, computed as the module does."""
    params = dict(module.named_parameters(recurse=False))

    def proj(name: str) -> torch.Tensor:
        bias = params.get(f"{name}_bias")
        return _expert_linear(x, params[name][e], bias[e] if bias is not None else None, transposed)

    if "gate_up_proj" in params:
        h = proj("gate_up_proj")
        apply_gate = getattr(module, "_apply_gate", None)
        if callable(apply_gate):  # transformers' gating of this experts class (concatenated or interleaved)
            return apply_gate(h)
        gate, up = h.chunk(2, dim=-1)
        return module.act_fn(gate) * up
    if "gate_proj" in params:
        return module.act_fn(proj("gate_proj")) * proj("up_proj")
    return module.act_fn(proj("up_proj"))


def _collect(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    chosen: Sequence[Weight],
    *,
    max_length: int,
    dtype: torch.dtype | None,
) -> dict[str, torch.Tensor]:
    from tqdm.auto import tqdm

    texts = list(texts)
    if not texts:
        raise ValueError("collect_input_norms: no calibration texts given")
    if max_length < 1:
        raise ValueError(f"collect_input_norms: max_length must be >= 1, got {max_length}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"collect_input_norms: calibration text #{i} is {type(text).__name__}, not str")
    if dtype is not None and _model_dtype(model) != dtype:
        model.to(dtype)
    device = model_device(model)
    modules = dict(model.named_modules())

    totals: dict[str, torch.Tensor] = {}  # sum over sequences of per-sequence norms (float64)
    current: dict[str, torch.Tensor] = {}  # per-sequence sum of squares over tokens (float64)
    linear: dict[str, Weight] = {}  # module -> its scored weight
    experts: dict[str, list[Weight]] = {}  # fused experts module -> its scored 3-D parameters
    for w in chosen:
        d_in = int(w.input_dim or 0)
        if w.hook == "experts":
            experts.setdefault(w.module, []).append(w)
            totals[w.name] = torch.zeros(w.shape[0], d_in, dtype=torch.float64)
        else:
            linear[w.module] = w
            totals[w.name] = torch.zeros(d_in, dtype=torch.float64)

    def add(name: str, sq: torch.Tensor) -> None:
        current[name] = current[name] + sq if name in current else sq

    def linear_hook(w: Weight):
        d_in = int(w.input_dim or 0)

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            x = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
            if x.shape[-1] != d_in:
                raise ValueError(f"module {w.module!r}: input has {x.shape[-1]} channels, weight expects {d_in}")
            add(w.name, x.pow(2).sum(dim=0, dtype=torch.float64).cpu())

        return hook

    def experts_hook(module_name: str, weights: list[Weight]):
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden, index = _routed(args, kwargs, module_name)
            hidden = hidden.detach()
            for w in weights:
                sq = torch.zeros(w.shape[0], int(w.input_dim or 0), dtype=torch.float64)
                for e in range(w.shape[0]):
                    rows = (index == e).any(dim=-1).nonzero().squeeze(-1)
                    if rows.numel() == 0:
                        continue
                    x = hidden[rows]
                    if w.role in ("down", "fc_out"):
                        x = _expert_mid(module, x, e, w.transposed)
                    if x.shape[-1] != sq.shape[1]:
                        raise ValueError(
                            f"experts {w.name!r}: expert {e} input has {x.shape[-1]} channels, weight expects "
                            f"{sq.shape[1]}"
                        )
                    sq[e] = x.to(torch.float32).pow(2).sum(dim=0, dtype=torch.float64).cpu()
                add(w.name, sq)

        return hook

    handles = [modules[m].register_forward_pre_hook(linear_hook(w), with_kwargs=True) for m, w in linear.items()] + [
        modules[m].register_forward_pre_hook(experts_hook(m, ws), with_kwargs=True) for m, ws in experts.items()
    ]
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
    return {name: (total / n).to(torch.float32) for name, total in totals.items()}


# -- calibration text ---------------------------------------------------------------------------------------


def calibration_fields(fields: str | Sequence[str] | None) -> list[str] | None:
    """Field keys (``email``, ...) of ``fields`` (keys or PANORAMA columns), in order, each once; None and ``all``
    (every field, no selection) give None.

    ValueError naming the known fields for an unknown one, and for an empty selection.
    """
    if fields is None or fields == "all":
        return None
    from lacuna_tasks.schema import get_field

    if isinstance(fields, str):
        fields = [fields]
    if "all" in fields:
        return None
    keys: list[str] = []
    for name in fields:
        key = get_field(str(name)).key  # LacunaDataError (a ValueError) naming the known fields
        if key not in keys:
            keys.append(key)
    if not keys:
        raise ValueError("calibration fields: an empty selection (give None for every field)")
    return keys


def calibration_texts(
    source: str | os.PathLike[str] | None, split: str, n: int = 128, *, fields: Sequence[str] | None = None
) -> list[str]:
    """The first ``n`` calibration texts, formatted as LACUNA QA text (``Q: q\\nA: a\\n``).

    ``source`` is a LACUNA data source (anything :func:`lacuna_tasks.loader.load_data` accepts: a data or
    testbed directory; None = bundled data), whose ``split`` rows are formatted with ``qa_text``; or a text file:
    ``.jsonl`` (field ``text``, or ``question`` + ``answer``) or ``.txt`` (one text per non-empty line), for which
    ``split`` is ignored. FRAG's authors use the first 128 rows (docs/definitions.md#frag-activation-statistics).

    ``fields`` (keys like ``email`` or PANORAMA columns; None = every row): only rows of those fields, the first
    ``n`` of them, so FRAG is calibrated on the field(s) a run actually unlearned (docs/scoring.md, "FRAG
    calibration fields"). A ``.jsonl`` file is filtered on its rows' ``field`` column; a ``.txt`` file has none.
    ValueError naming the field(s) and the file when the selection is empty.
    """
    from lacuna_tasks.prompts import qa_text
    from lacuna_tasks.schema import get_field

    if n < 1:
        raise ValueError(f"calibration_texts: n must be >= 1, got {n}")
    keys = calibration_fields(fields)
    columns = {get_field(k).column for k in keys} if keys is not None else None
    path = Path(source) if source is not None else None
    if path is not None and path.is_file():
        texts = _texts_from_file(path, n, columns)
        if not texts:
            if keys is not None:
                raise ValueError(f"calibration file {path} holds no rows of field(s) {', '.join(keys)}")
            raise ValueError(f"calibration file {path} holds no texts")
        return texts
    from lacuna_tasks.loader import load_data

    data = load_data(source)
    if split not in data.splits:
        raise ValueError(f"{data.source}: no split {split!r} for calibration (found: {sorted(data.splits)})")
    rows = data.splits[split]
    if columns is not None:
        rows = [r for r in rows if r["field"] in columns]
        if not rows:
            assert keys is not None
            raise ValueError(
                f"{data.files.get(split, data.source)}: split {split!r} has no rows of field(s) {', '.join(keys)} "
                "for FRAG calibration"
            )
    texts = [qa_text(str(r["question"]), str(r["answer"])) for r in rows[:n]]
    if not texts:
        raise ValueError(f"{data.source}: split {split!r} is empty, no calibration texts")
    return texts


def _texts_from_file(path: Path, n: int, columns: set[str] | None = None) -> list[str]:
    from lacuna_tasks.loader import read_rows
    from lacuna_tasks.prompts import qa_text
    from lacuna_tasks.schema import get_field

    suffix = path.suffix.lower()
    if suffix == ".txt":
        if columns is not None:
            raise ValueError(f"calibration file {path}: a .txt file has no field column to select fields by")
        with path.open(encoding="utf-8") as fh:
            return [line.rstrip("\r\n") for line in fh if line.strip()][:n]
    if suffix != ".jsonl":
        raise ValueError(f"calibration file {path}: expected a .jsonl or .txt file")
    rows = read_rows(path)
    if columns is not None:
        kept = []
        for lineno, row in enumerate(rows, 1):
            if not isinstance(row.get("field"), str):
                raise ValueError(f"{path}: row {lineno}: no string 'field' column to select calibration fields by")
            if get_field(row["field"]).column in columns:
                kept.append((lineno, row))
    else:
        kept = list(enumerate(rows, 1))
    texts: list[str] = []
    for lineno, row in kept[:n]:
        if isinstance(row.get("text"), str):
            texts.append(row["text"])
        elif isinstance(row.get("question"), str) and isinstance(row.get("answer"), str):
            texts.append(qa_text(row["question"], row["answer"]))
        else:
            raise ValueError(f"{path}: row {lineno}: expected a string field 'text', or 'question' and 'answer'")
    return texts


# -- cached statistics --------------------------------------------------------------------------------------


class NormTable(dict):
    """Weight name -> activation norms, carrying ``coverage``: what the scored weights cover of the checkpoint.

    :func:`activation_stats` returns its vectors in these, so a :class:`lacuna_metrics.frag.FragAccumulator` built
    from ``stats.forget`` reports the coverage even when its caller does not pass it on.
    """

    def __init__(self, *args: Any, coverage: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.coverage = coverage


@dataclass
class ActivationStats:
    """Forget and retain activation norms of one model (weight name -> float32 vector), with provenance.

    Vectors of fused 3-D expert tensors are ``[num_experts, d_in]``. ``coverage`` (see :func:`activation_stats`)
    says what share of the checkpoint's block weights the names cover and what was left out.
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


def _dtype_kwarg() -> str:
    """``dtype`` on transformers >= 4.56, ``torch_dtype`` before (the old name warns on 5.x)."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


# -- checkpoint side: preflight, names, coverage -------------------------------------------------------------


def _checkpoint_anatomy(checkpoint: Checkpoint, source: str) -> Anatomy:
    shapes = {n: checkpoint.shape(n) for n in checkpoint.names if not checkpoint.is_alias(n)}
    return checkpoint_anatomy(shapes, checkpoint.config(), source)


def frag_preflight(model_dir: str | os.PathLike[str], target: str = "all") -> Anatomy:
    """Check that FRAG can score ``model_dir`` for ``target`` from its tensor header and ``config.json`` alone.

    One-line ValueError naming the checkpoint when the target is unknown, the config has no
    ``num_hidden_layers``, no tensor name has a block index, or the target matches none of its block weights.
    Returns the checkpoint's anatomy. Reads no weights, so it costs milliseconds.
    """
    check_target(target)
    checkpoint = Checkpoint(model_dir)
    return _preflight(checkpoint, str(model_dir), target)


def _preflight(checkpoint: Checkpoint, source: str, target: str) -> Anatomy:
    anatomy = _checkpoint_anatomy(checkpoint, source)
    matrices = anatomy.block_matrix_names()
    if not matrices:
        raise ValueError(f"{source}: its transformer blocks hold no weight matrix (only 1-D tensors): nothing for FRAG")
    if target.startswith("regex:"):
        regex = re.compile(target.removeprefix("regex:"))
        hits = [n for n in matrices if regex.search(n)]
    elif target in ("attention", "mlp", "expert"):
        hits = [w.name for w in anatomy.select(target)]
    else:  # all, linear: the loaded model's structure decides
        hits = matrices
    if not hits:
        raise ValueError(
            f"{source}: --frag-target {target!r} matches none of its block weights ({anatomy.summary()}; "
            f"e.g. {', '.join(matrices[:3])})"
        )
    return anatomy


def _to_checkpoint(
    chosen: Sequence[Weight],
    skipped_model: dict[str, str],
    forget: dict[str, torch.Tensor],
    retain: dict[str, torch.Tensor],
    disk: Anatomy,
    checkpoint: Checkpoint,
    target: str,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], set[str], dict[str, Any]]:
    """Key the model's vectors by the checkpoint's tensor names and measure what they cover.

    A checkpoint tensor takes the vector of the model weight with its name; failing that (transformers 5 saves
    fused experts as per-expert matrices, and routers under other names), the vector of the model weight with the
    same :attr:`Weight.input_key` (row e of a fused expert vector for expert e), when the input widths agree.
    """
    by_name = {w.name: w for w in chosen}
    by_key: dict[tuple[Any, ...], tuple[Weight, int | None]] = {}
    for w in chosen:
        if w.fused_experts:
            for e in range(w.shape[0]):
                by_key.setdefault((w.layer, "expert", e, w.input_key[3]), (w, e))
        else:
            by_key.setdefault(w.input_key, (w, None))
    regex = re.compile(target.removeprefix("regex:")) if target.startswith("regex:") else None
    allowed = None if target in ("all", "linear") or regex else {w.name for w in disk.select(target)}
    blocks = set(disk.block_matrix_names())
    out_f: dict[str, torch.Tensor] = {}
    out_r: dict[str, torch.Tensor] = {}
    transposed: set[str] = set()
    skipped: dict[str, str] = {}
    for name in checkpoint.names:
        if checkpoint.is_alias(name) or (name not in blocks and name not in by_name):
            continue
        shape = checkpoint.shape(name)
        if regex is not None and not regex.search(name):
            skipped[name] = f"not matched by target {target!r}"
            continue
        if allowed is not None and name not in allowed and name not in by_name:
            skipped[name] = f"outside target {target!r}"
            continue
        w = by_name.get(name)
        if w is not None and tuple(w.shape) == tuple(shape):
            out_f[name], out_r[name] = forget[name], retain[name]
            if w.transposed:
                transposed.add(name)
            continue
        dw = disk.weights.get(name)
        match = by_key.get(dw.input_key) if dw is not None and dw.is_matrix and not dw.fused_experts else None
        if match is not None and dw is not None:
            mw, e = match
            xf, xr = (forget[mw.name], retain[mw.name]) if e is None else (forget[mw.name][e], retain[mw.name][e])
            if xf.dim() == 1 and xf.numel() == dw.input_dim:
                out_f[name], out_r[name] = xf.clone(), xr.clone()
                if dw.transposed:
                    transposed.add(name)
                continue
        if name in skipped_model:
            skipped[name] = skipped_model[name]
        elif dw is None:
            skipped[name] = "not a projection the name rules or the model structure recognise"
        elif target == "linear":
            skipped[name] = "not an nn.Linear / Conv1D module weight (target 'linear')"
        else:
            skipped[name] = "no module of the loaded model computes it"
    coverage = _coverage(out_f, skipped, blocks, disk, checkpoint, target)
    return out_f, out_r, transposed, coverage


def _coverage(
    scored: dict[str, torch.Tensor],
    skipped: dict[str, str],
    blocks: set[str],
    disk: Anatomy,
    checkpoint: Checkpoint,
    target: str,
) -> dict[str, Any]:
    def numel(name: str) -> int:
        return int(checkpoint.info(name).numel)

    block_scalars = sum(numel(n) for n in blocks)
    included = [n for n in scored if n in blocks]
    scalars = sum(numel(n) for n in included)
    by_component: dict[str, dict[str, int]] = {}
    for n in blocks:
        w = disk.weights.get(n)
        entry = by_component.setdefault(w.component if w is not None else "other", {"tensors": 0, "scalars": 0})
        entry["tensors"] += 1
        entry["scalars"] += numel(n)
    for n in included:
        w = disk.weights.get(n)
        entry = by_component[w.component if w is not None else "other"]
        entry["scored_tensors"] = entry.get("scored_tensors", 0) + 1
        entry["scored_scalars"] = entry.get("scored_scalars", 0) + numel(n)
    reasons: dict[str, dict[str, Any]] = {}
    for n, reason in skipped.items():
        if n not in blocks:
            continue
        entry = reasons.setdefault(reason, {"tensors": 0, "scalars": 0, "examples": []})
        entry["tensors"] += 1
        entry["scalars"] += numel(n)
        if len(entry["examples"]) < 3:
            entry["examples"].append(n)
    return {
        "target": target,
        "modules": len(scored),
        "block_modules": len(included),
        "block_weights": len(blocks),
        "scalars": scalars,
        "block_scalars": block_scalars,
        "share": scalars / block_scalars if block_scalars else 0.0,
        "outside_blocks": len(scored) - len(included),
        "by_component": {c: by_component[c] for c in sorted(by_component)},
        "skipped": reasons,
        "definition": "share = scalars of the scored block weights / scalars of every tensor with 2+ dimensions "
        "inside a transformer block except biases (docs/anatomy.md)",
    }


def coverage_verdict(coverage: dict[str, Any], min_coverage: float = DEFAULT_MIN_COVERAGE) -> dict[str, Any]:
    """``coverage`` plus ``threshold``, ``below_threshold`` and a one-line ``warning`` (None when covered)."""
    if not 0.0 <= float(min_coverage) <= 1.0:
        raise ValueError(f"min_coverage must be in [0, 1], got {min_coverage}")
    out = dict(coverage)
    share = float(out.get("share", 0.0))
    below = share < float(min_coverage)
    out["threshold"] = float(min_coverage)
    out["below_threshold"] = below
    warning = None
    if below:
        left = sorted(out.get("skipped", {}).items(), key=lambda kv: -kv[1]["scalars"])
        why = "; ".join(f"{v['tensors']} skipped: {reason}" for reason, v in left[:2]) or "nothing skipped"
        warning = (
            f"FRAG covers only {share:.1%} of the block weights ({out.get('block_modules', 0)} of "
            f"{out.get('block_weights', 0)} tensors, target {out.get('target')!r}; threshold {min_coverage:.0%}): {why}"
        )
    out["warning"] = warning
    return out


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
    calib_fields: Sequence[str] | None = None,
    calib_retain_fields: Sequence[str] | None = None,
) -> ActivationStats:
    """x^f and x^r of the ORIGINAL model in ``model_dir`` (docs/definitions.md#frag-activation-statistics), cached in
    ``cache_dir`` if given.

    Keys are the checkpoint's tensor names (what the scorer reads), which for transformers 5 MoE checkpoints differ
    from the loaded model's parameter names (see :func:`_to_checkpoint`). ``coverage`` reports the share of the
    block weights scored and what was skipped and why (docs/anatomy.md). Before any work (no weights read),
    :func:`frag_preflight` checks the target, the config's ``num_hidden_layers`` and the blocks.

    The cache file ``<cache_dir>/<hex digest>.safetensors`` (keys ``forget/<weight>`` and ``retain/<weight>``) is
    keyed by a SHA-256 fingerprint of the weights, config and tokenizer files, the texts, ``target``,
    ``max_length``, ``dtype`` and :data:`FORMAT_VERSION`, and the fields the texts were selected by
    (``calib_fields`` for the forget texts, ``calib_retain_fields`` for the retain texts; provenance of the texts,
    see :func:`calibration_texts`; None = every field, the key of earlier versions). A hit does not load the model. The model is loaded from
    local files only, without remote code, and freed before returning.
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
    check_target(target)
    checkpoint = Checkpoint(model_path)
    disk = _preflight(checkpoint, str(model_path), target)
    fields = {"forget": calibration_fields(calib_fields), "retain": calibration_fields(calib_retain_fields)}
    fingerprint = _fingerprint(
        checkpoint, model_path, tok_path, forget_texts, retain_texts, target, max_length, dtype, fields
    )
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
        model_target = "all" if target.startswith("regex:") else target
        try:
            chosen, skipped_model = _frag_plan(model, model_target)
        except ValueError as exc:
            raise ValueError(f"{model_path}: {exc}") from None
        if not chosen:
            raise ValueError(f"{model_path}: --frag-target {target!r} selects no projection the model computes")
        forget = _collect(model, tokenizer, forget_texts, chosen, max_length=max_length, dtype=dtype)
        retain = _collect(model, tokenizer, retain_texts, chosen, max_length=max_length, dtype=dtype)
    finally:
        del model
        gc.collect()
    forget, retain, transposed, coverage = _to_checkpoint(
        chosen, skipped_model, forget, retain, disk, checkpoint, target
    )
    if not forget:
        raise ValueError(f"{model_path}: --frag-target {target!r}: no checkpoint tensor matches a measured projection")
    stats = ActivationStats(
        forget, retain, fingerprint, cached=False, conv1d_transposed=frozenset(transposed), coverage=coverage
    )
    if cache_file is not None:
        _save_cache(cache_file, stats)
    return stats
