"""FRP -- Forget-Retain Pruning, training-free (docs/definitions.md#frp, the authors' code path).

Follows what the authors' code ran for Table 1 (``frp/prune.py --scoring rank_combo``), not paper Eq. (6):

1. r_j = x^f_j / (x^r_j + 1e-6) from the input activation norms of the ORIGINAL model
   (docs/definitions.md#frag-activation-statistics; the statistics come from :mod:`lacuna_metrics.frag.activations`, cached).
2. Per output row i, ascending ranks over the d_in columns via ``argsort().argsort()`` (0 = smallest):
   rank(r)_j (the same for every row) and rank(|W|)_ij; S_ij = rank(r)_j + lam * rank(|W|)_ij, lam = 0.05
   (the paper's λ, code ``--beta``).
3. Retain veto (the paper's β, code ``--protect_p``): if beta > 0, per row the top ``int(beta * d_in)`` entries by
   P_ij = |W_ij| x^r_j / (x^f_j + 1e-6) get S_ij = -inf.
4. Per row the top ``k = int(rho * d_in)`` entries by S (``torch.topk``, largest), rho = 0.03, are multiplied by
   ``shrink`` (0.0: set to zero; code ``--prune_mode shrink --shrink_factor 0.0``).
5. Scope: ``mlp`` (gate/up/down, Table 1) by default; ``all`` = the seven projections; ``linear`` = every
   ``nn.Linear`` / ``Conv1D`` but embeddings and ``lm_head`` (other architectures). transformers ``Conv1D``
   weights are stored (d_in, d_out): "row" and "column" keep their (d_out, d_in) meaning (``transposed=True``).

Implementation choices the sources leave open: both argsorts are *stable* (equal values rank by column index, so
results are deterministic; bf16 weights have many ties); ranks are combined in float64; a vetoed entry is never
pruned, so a row prunes ``min(k, d_in - int(beta * d_in))`` entries when ``beta + rho > 1``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics import FRP_TARGETS, activation_stats, linear_weight_names, transposed_weight_names
from lacuna_unlearn.methods.settings import FRPSettings

__all__ = [
    "EPS",
    "FRPConfig",
    "apply_frp",
    "editor_paths",
    "frp_prune_mask",
    "frp_scores",
    "load_stored",
    "prune_from_activations",
    "publish_edit",
    "run_frp",
    "run_from_config",
]

#: The 1e-6 of r_j = x^f_j / (x^r_j + 1e-6) and of the veto score P (docs/definitions.md#frp).
EPS = 1e-6
#: Rows are scored in chunks of at most this many entries, to bound the argsort memory on 7B-14B layers.
_CHUNK_ENTRIES = 1 << 24
#: Forward dtype of the calibration passes (bf16, as the authors' Table 1 run; docs/definitions.md#frp).
_CALIB_DTYPE = torch.bfloat16


@dataclass
class FRPConfig(FRPSettings):
    """FRP's settings (:class:`lacuna_unlearn.methods.settings.FRPSettings`) plus the run's ``seed``, checked."""

    seed: int = 42

    def validate(self) -> FRPConfig:
        """Raise ValueError naming the offending field; return self."""
        if not _is_real(self.rho) or not 0.0 <= self.rho < 1.0:
            raise ValueError(f"FRPConfig.rho must be in [0, 1), got {self.rho!r}")
        if not _is_real(self.lam) or not math.isfinite(self.lam) or self.lam < 0:
            raise ValueError(f"FRPConfig.lam must be a finite number >= 0, got {self.lam!r}")
        if not _is_real(self.beta) or not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"FRPConfig.beta must be in [0, 1], got {self.beta!r}")
        if not _is_real(self.shrink) or not math.isfinite(self.shrink):
            raise ValueError(f"FRPConfig.shrink must be a finite number, got {self.shrink!r}")
        if self.target not in FRP_TARGETS:
            raise ValueError(f"FRPConfig.target: unknown target {self.target!r}; expected one of {list(FRP_TARGETS)}")
        for name in ("calib_samples", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FRPConfig.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"FRPConfig.seed must be an integer, got {self.seed!r}")
        return self


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


# -- scoring ---------------------------------------------------------------------------------------------------


def _rows_view(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The (d_out, d_in) view of ``weight`` (``Conv1D`` stores (d_in, d_out))."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
    return weight.t() if transposed else weight


def _check_x(x: torch.Tensor, d_in: int, field: str, where: str = "") -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.dim() != 1 or x.numel() != d_in:
        raise ValueError(f"{field}{where}: expected a vector of length d_in={d_in}, got shape {tuple(x.shape)}")
    x = x.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{field}{where}: activation norms must be finite")
    return x


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Ascending ranks along the last axis via ``argsort().argsort()`` (0 = smallest; stable: ties by index)."""
    return values.argsort(dim=-1, stable=True).argsort(dim=-1, stable=True)


def _chunk_scores(
    w_rows: torch.Tensor, rank_r: torch.Tensor, protect_ratio: torch.Tensor | None, lam: float, n_protect: int
) -> torch.Tensor:
    """S for a block of rows (float64): rank(r) + lam * rank(|W|), vetoed entries -inf
    (docs/definitions.md#frp, steps 2-4)."""
    absw = w_rows.detach().to(device="cpu", dtype=torch.float64).abs()
    scores = rank_r.to(torch.float64).unsqueeze(0) + lam * _ranks(absw).to(torch.float64)
    if protect_ratio is not None and n_protect > 0:
        protect = torch.topk(absw * protect_ratio.unsqueeze(0), n_protect, dim=1, largest=True).indices
        scores.scatter_(1, protect, float("-inf"))
    return scores


def _prepare(
    weight: torch.Tensor, x_forget: torch.Tensor, x_retain: torch.Tensor, beta: float, transposed: bool, where: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    rows = _rows_view(weight, transposed)
    d_in = rows.shape[1]
    xf = _check_x(x_forget, d_in, "x_forget", where)
    xr = _check_x(x_retain, d_in, "x_retain", where)
    rank_r = _ranks(xf / (xr + EPS))  # step 1-2: the same for every row
    n_protect = int(beta * d_in)
    protect_ratio = xr / (xf + EPS) if n_protect > 0 else None
    return rows, rank_r, protect_ratio, n_protect


def frp_scores(
    weight: torch.Tensor,
    x_forget: torch.Tensor,
    x_retain: torch.Tensor,
    lam: float = 0.05,
    beta: float = 0.0,
    transposed: bool = False,
) -> torch.Tensor:
    """The FRP score matrix S (float64, shape of ``weight``), docs/definitions.md#frp steps 1-4 (``rank_combo``).

    S_ij = rank(r)_j + lam * rank(|W_i:|)_j with ascending ``argsort().argsort()`` ranks over the d_in columns of row
    i; if ``beta`` > 0 the top ``int(beta * d_in)`` entries of each row by P_ij = |W_ij| x^r_j / (x^f_j + 1e-6) are
    -inf. ``transposed=True`` for ``Conv1D`` weights stored (d_in, d_out): rows/columns keep the (d_out, d_in)
    meaning and S comes back in the stored layout.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    rows, rank_r, protect_ratio, n_protect = _prepare(weight, x_forget, x_retain, beta, transposed, "")
    scores = _chunk_scores(rows, rank_r, protect_ratio, lam, n_protect)
    return scores.t() if transposed else scores


def _prune_rows(
    rows: torch.Tensor, rank_r: torch.Tensor, protect_ratio: torch.Tensor | None, lam: float, n_protect: int, k: int
) -> torch.Tensor:
    """Bool mask (rows' shape, on CPU) of the top-k entries per row by S, never a vetoed (-inf) one."""
    d_out, d_in = rows.shape
    mask = torch.zeros((d_out, d_in), dtype=torch.bool)
    if k == 0 or d_out == 0:
        return mask
    step = max(1, _CHUNK_ENTRIES // max(1, d_in))
    for start in range(0, d_out, step):
        scores = _chunk_scores(rows[start : start + step], rank_r, protect_ratio, lam, n_protect)
        top = torch.topk(scores, k, dim=1, largest=True)
        mask[start : start + step].scatter_(1, top.indices, top.values > float("-inf"))
    return mask


def frp_prune_mask(
    weight: torch.Tensor,
    x_forget: torch.Tensor,
    x_retain: torch.Tensor,
    cfg: FRPConfig,
    transposed: bool = False,
) -> torch.Tensor:
    """Bool mask (True = pruned, stored layout of ``weight``): per row the top ``int(rho * d_in)`` by S
    (docs/definitions.md#frp).

    Vetoed entries are never selected, so a row prunes fewer than k only when ``int(beta*d_in) + k > d_in``.
    """
    cfg.validate()
    rows, rank_r, protect_ratio, n_protect = _prepare(weight, x_forget, x_retain, cfg.beta, transposed, "")
    mask = _prune_rows(rows, rank_r, protect_ratio, cfg.lam, n_protect, int(cfg.rho * rows.shape[1]))
    mask = mask.t() if transposed else mask
    return mask.to(weight.device)


# -- models ----------------------------------------------------------------------------------------------------


def apply_frp(
    model: torch.nn.Module,
    x_forget: Mapping[str, torch.Tensor],
    x_retain: Mapping[str, torch.Tensor],
    cfg: FRPConfig,
) -> dict[str, Any]:
    """Prune ``model`` in place (docs/definitions.md#frp): every ``cfg.target`` weight's selected entries are multiplied
    by ``cfg.shrink``. ``x_forget`` / ``x_retain`` map weight names (``<module>.weight``, as
    :func:`lacuna_metrics.frag.activations.collect_input_norms` returns them) to input norm vectors; extra keys are ignored.
    Returns ``{"pruned": {weight name: count}, "pruned_total", "scored_total", "modules"}``.
    """
    cfg.validate()
    names = linear_weight_names(model, cfg.target)
    transposed = transposed_weight_names(model, cfg.target)
    params = dict(model.named_parameters(remove_duplicate=False))
    for weight_name in names.values():
        for side, xs in (("x_forget", x_forget), ("x_retain", x_retain)):
            if weight_name not in xs:
                raise ValueError(f"{side}: no activation norms for {weight_name!r} (target={cfg.target!r})")
    pruned: dict[str, int] = {}
    scored = 0
    with torch.no_grad():
        for weight_name in names.values():
            weight = params[weight_name]
            is_t = weight_name in transposed
            rows, rank_r, protect_ratio, n_protect = _prepare(
                weight, x_forget[weight_name], x_retain[weight_name], cfg.beta, is_t, f"[{weight_name!r}]"
            )
            mask = _prune_rows(rows, rank_r, protect_ratio, cfg.lam, n_protect, int(cfg.rho * rows.shape[1]))
            mask = (mask.t() if is_t else mask).to(weight.device)
            if cfg.shrink == 0.0:
                weight.masked_fill_(mask, 0.0)
            else:
                weight[mask] = weight[mask] * cfg.shrink
            pruned[weight_name] = int(mask.sum())
            scored += weight.numel()
    total = sum(pruned.values())
    return {"pruned": pruned, "pruned_total": total, "scored_total": scored, "modules": len(pruned)}


def _load_kwargs() -> dict[str, Any]:
    """Load in the stored dtype: ``dtype`` on transformers >= 4.56, ``torch_dtype`` before."""
    import transformers
    from packaging.version import Version

    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {key: "auto", "local_files_only": True, "trust_remote_code": False}


def run_frp(
    model_dir: str | os.PathLike[str],
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    out_dir: str | os.PathLike[str],
    cfg: FRPConfig | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """FRP end to end (docs/definitions.md#frp): x^f / x^r of the original model on the first ``cfg.calib_samples``
    texts per side (bf16 forward, cached in ``cache_dir``), prune, and save model + tokenizer +
    ``unlearn_manifest.json`` to ``out_dir``. Built in ``<out_dir>.partial`` and renamed at the end; an existing
    ``out_dir`` is an error.
    """
    cfg = (cfg or FRPConfig()).validate()
    return prune_from_activations(
        model_dir,
        forget_texts,
        retain_texts,
        out_dir,
        cfg,
        target=cfg.target,
        apply=apply_frp,
        result_keys=("pruned", "pruned_total", "scored_total"),
        describe={"method": "frp", "spec": "docs/definitions.md#frp (code path --scoring rank_combo)"},
        cache_dir=cache_dir,
    )


def prune_from_activations(
    model_dir: str | os.PathLike[str],
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    out_dir: str | os.PathLike[str],
    cfg: Any,
    *,
    target: str,
    apply: Callable[..., Mapping[str, Any]],
    result_keys: Sequence[str],
    describe: Mapping[str, Any],
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """The job shared by the activation-statistics pruners (FRP, Selective Pruning): x^f / x^r of the original
    model on the first ``cfg.calib_samples`` texts per side (cached), ``apply(model, x_f, x_r, cfg)``, then the
    checkpoint + manifest (``describe`` + the ``result_keys`` of the apply result) published atomically.

    ``cfg`` is a validated config with ``calib_samples``, ``max_length`` and ``seed``.
    """
    started = time.perf_counter()
    model_path, out = editor_paths(model_dir, out_dir)
    forget = list(forget_texts)[: cfg.calib_samples]
    retain = list(retain_texts)[: cfg.calib_samples]
    torch.manual_seed(cfg.seed)  # the pruners are deterministic; seeded anyway for the record

    stats = activation_stats(
        model_path, forget, retain, cache_dir=cache_dir, target=target, max_length=cfg.max_length, dtype=_CALIB_DTYPE
    )
    model, tokenizer = load_stored(model_path)
    result = apply(model, stats.forget, stats.retain, cfg)
    manifest = {
        **describe,
        "config": asdict(cfg),
        "model_dir": str(model_path),
        "calibration": {
            "forget_texts": len(forget),
            "retain_texts": len(retain),
            "dtype": str(_CALIB_DTYPE).removeprefix("torch."),
            "activation_fingerprint": stats.fingerprint,
            "activation_cache_hit": stats.cached,
        },
        **{key: result[key] for key in result_keys},
    }
    return publish_edit(model, tokenizer, out, manifest, seed=cfg.seed, started=started)


def editor_paths(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``(model_dir, out_dir)`` of a training-free editor as paths: the model directory must exist and the output
    must not (:func:`publish_edit` builds it in ``<out_dir>.partial`` and renames it at the end)."""
    model_path, out = Path(model_dir), Path(out_dir)
    if not model_path.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_path}")
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or choose another out_dir")
    return model_path, out


def load_stored(model_path: Path) -> tuple[Any, Any]:
    """The model of ``model_path`` in its stored dtype, and its tokenizer (local files only, no remote code)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, **_load_kwargs())
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True, trust_remote_code=False)
    return model, tokenizer


def publish_edit(
    model: Any, tokenizer: Any, out: Path, manifest: Mapping[str, Any], *, seed: int, started: float
) -> Path:
    """Save an editor's ``model`` + ``tokenizer`` and ``manifest`` (plus the run's ``seed`` and the wall seconds since
    ``started``, a ``time.perf_counter()``) to ``out`` atomically; the manifest gets versions + hardware
    (:func:`lacuna_unlearn.publish.publish_checkpoint`)."""
    from lacuna_unlearn.publish import publish_checkpoint

    manifest = {**manifest, "seed": seed, "wall_seconds": round(time.perf_counter() - started, 3)}
    return publish_checkpoint(model, tokenizer, out, manifest)


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
    """``lacuna-unlearn method=frp``: the forget/retain QA text is the calibration text (``method.args`` = FRPConfig)."""
    return run_on_qa_rows("frp", FRPConfig, run_frp, model, forget_rows, retain_rows, out, args, seed=seed)


def run_on_qa_rows(
    method: str,
    config_type: Callable[..., Any],
    job: Callable[..., Path],
    model: str | os.PathLike[str],
    forget_rows: Sequence[Mapping[str, Any]],
    retain_rows: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    args: Mapping[str, Any],
    *,
    seed: int,
) -> Path:
    """The Hydra adapter of the activation-statistics pruners (FRP, Selective Pruning): ``method.args`` build
    ``config_type``, and the forget/retain QA text is the calibration text, so both share cached statistics."""
    from lacuna_metrics import default_cache_dir
    from lacuna_tasks import qa_text

    try:
        config = config_type(**{"seed": seed, **args})
    except TypeError as exc:
        raise ValueError(f"method {method!r}: {exc}") from None
    forget = [qa_text(r["question"], r["answer"]) for r in forget_rows]
    retain = [qa_text(r["question"], r["answer"]) for r in retain_rows]
    return job(model, forget, retain, out, config, cache_dir=default_cache_dir())
