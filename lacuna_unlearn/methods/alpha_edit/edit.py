"""AlphaEdit: null-space constrained locate-then-edit (docs/definitions.md#alphaedit).

Training-free (no optimizer over the weights); ``lacuna-unlearn method=alpha_edit`` dispatches here through the
``editor`` entry of :mod:`lacuna_unlearn.methods.registry`. One edit request per forget row: prompt = the row's
probe prompt ``Q: question\\nA:``, subject = the person's name (the text before the question's first comma), new
target = `` I don't know.`` in the answer format (`` target\\n``). Per batch of ``batch_size`` requests (sequential edits):

1. **Target values** (MEMIT ``compute_z``): a vector δ is added to the residual stream (output of block
   ``layers[-1]``) at the subject's last token and optimised (``v_num_grad_steps`` Adam steps, lr ``v_lr``) for
   NLL(target | prompt) + ``kl_factor`` · KL(p_orig ‖ p_edited) at the subject's last token of ``"{subject} is a"``
   + ``v_weight_decay`` · ‖δ‖ / ‖h‖² (MEMIT's form, h = the unedited hidden state); after each step ‖δ‖ is clamped
   to ``clamp_norm_factor`` · ‖h‖; early stop when the loss is below 0.05. z = h + δ.
2. **Keys** K₁ (d_in × n): the input of the edited module (``module``, the MLP down-projection) at the subject's
   last token, averaged over ``context_templates``.
3. **Update** for each edited layer l in order, with residual R = (z − current output at the subject) /
   (number of layers left) and P_l the projector onto the null space of the preserved-key second moment
   K₀K₀ᵀ/N (eigenvectors with eigenvalue < ``nullspace_threshold``)::

       Δ_lᵀ = solve(P_l (K₁K₁ᵀ + K_pK_pᵀ) + L2·I,  P_l K₁ Rᵀ)        (AlphaEdit's code; docs/definitions.md#alphaedit)

   so Δ_l K₀ ≈ 0: the outputs of the edited module on preserved keys do not change. After the batch,
   K_pK_pᵀ += K₁K₁ᵀ of the edited model (keys of earlier edits are preserved by later ones).

Preserved-knowledge keys K₀ come from local text (``cov_text``): ``retain`` = the QA text of the data's retain
split (every field), ``neutral`` = the neutral documents the testbed trained on (rebuilt deterministically from the
testbed manifest; only when the data lives inside a testbed), plus ``cov_files``. No preserved text is a document of
the testbed's held-out neutral slice, which the neutral-perplexity probe scores. LACUNA used Wikipedia + retain with
100k samples; there are no downloads here. The second moments are cached under ``$LACUNA_CACHE/alpha_edit``,
keyed by a SHA-256 fingerprint of weights, tokenizer, texts, module and layers
(:mod:`lacuna_unlearn.methods.alpha_edit.keys`).

Choices the sources leave open, all configurable: one context template (``"{}"``; MEMIT samples ten short random
prefixes from the model); the value loss is read at the model's final logits (LACUNA's ``v_loss_layer`` is the
last layer); the solve runs in float64; MEMIT's ``mom2_update_weight`` is not part of AlphaEdit's update and is
not used. The edited modules are ``nn.Linear`` (weight d_out × d_in) or transformers ``Conv1D`` (d_in × d_out, GPT-2:
the update is added transposed); ``module`` / ``block`` = ``auto`` (the default) take each layer's MLP output
projection and its block from the model anatomy (docs/anatomy.md). ``restrict=`` and LoRA are refused: the
closed form chooses which scalars move.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lacuna_metrics import is_transposed_module
from lacuna_unlearn.methods.alpha_edit.keys import (
    AUTO,
    cached_second_moments,
    edited_module,
    input_dim,
    key_second_moments,
    module_at,
    preserved_texts,
    with_templates,
)
from lacuna_unlearn.methods.settings import AlphaEditSettings
from lacuna_unlearn.qa.encoding import continuation_ids, leading_special_ids

__all__ = [
    "AlphaEditConfig",
    "EditRequest",
    "alpha_edit_update",
    "apply_alpha_edit",
    "edit_requests",
    "key_second_moments",
    "null_space_projector",
    "run_alpha_edit",
    "run_from_config",
]

#: MEMIT / AlphaEdit stop optimising δ once the value loss falls below this.
_EARLY_STOP_LOSS = 5e-2


@dataclass
class AlphaEditConfig(AlphaEditSettings):
    """AlphaEdit's settings (:class:`lacuna_unlearn.methods.settings.AlphaEditSettings`; defaults = LACUNA's 1B row)
    plus the run's ``seed``, checked."""

    seed: int = 42

    def validate(self) -> AlphaEditConfig:
        """Raise ValueError naming the offending field; return self."""
        if not self.layers or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in self.layers):
            raise ValueError(f"AlphaEditConfig.layers must be a non-empty list of layer indices, got {self.layers!r}")
        if sorted(set(self.layers)) != list(self.layers):
            raise ValueError(f"AlphaEditConfig.layers must be strictly increasing, got {self.layers!r}")
        for name in ("module", "block", "kl_prompt"):
            if "{}" not in getattr(self, name) and (name == "kl_prompt" or getattr(self, name) != AUTO):
                raise ValueError(f"AlphaEditConfig.{name} must contain '{{}}', got {getattr(self, name)!r}")
        if not self.context_templates or any("{}" not in t for t in self.context_templates):
            raise ValueError(f"AlphaEditConfig.context_templates must each contain '{{}}': {self.context_templates!r}")
        for name in ("v_num_grad_steps", "batch_size", "cov_samples", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AlphaEditConfig.{name} must be an integer >= 1, got {value!r}")
        for name in ("v_lr", "v_weight_decay", "clamp_norm_factor", "kl_factor", "l2", "nullspace_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"AlphaEditConfig.{name} must be a number >= 0, got {value!r}")
        if self.fact_token not in ("subject_last", "last"):
            raise ValueError(f"AlphaEditConfig.fact_token must be 'subject_last' or 'last', got {self.fact_token!r}")
        unknown = set(self.cov_text) - {"retain", "neutral"}
        if unknown:
            raise ValueError(f"AlphaEditConfig.cov_text: unknown source(s) {sorted(unknown)}; use 'retain', 'neutral'")
        if not self.target.strip():
            raise ValueError("AlphaEditConfig.target must be a non-empty string")
        return self


@dataclass(frozen=True)
class EditRequest:
    """One edit: after ``prompt`` the model should say ``target``; ``subject`` (inside ``prompt``) is located."""

    prompt: str
    subject: str
    target: str


# --------------------------------------------------------------------------------------------------
# Closed form (pure tensor functions)


def null_space_projector(second_moment: torch.Tensor, threshold: float) -> torch.Tensor:
    """P = Û Ûᵀ over the eigenvectors of the (symmetric PSD) ``second_moment`` with eigenvalue < ``threshold``."""
    if second_moment.ndim != 2 or second_moment.shape[0] != second_moment.shape[1]:
        raise ValueError(f"second moment must be a square matrix, got shape {tuple(second_moment.shape)}")
    if not torch.isfinite(second_moment).all():
        raise ValueError("second moment has NaN/inf entries")
    m = second_moment.to(torch.float64)
    eigenvalues, eigenvectors = torch.linalg.eigh((m + m.T) / 2)
    kept = eigenvectors[:, eigenvalues < threshold]
    return kept @ kept.T


def alpha_edit_update(
    keys: torch.Tensor,
    residual: torch.Tensor,
    projector: torch.Tensor,
    previous: torch.Tensor | None = None,
    l2: float = 1.0,
) -> torch.Tensor:
    """The weight update Δ (d_out × d_in) for keys K₁ (d_in × n) and residuals R (d_out × n).

    Δᵀ = solve(P (K₁K₁ᵀ + C_p) + l2·I, P K₁ Rᵀ) with C_p = ``previous`` (K_pK_pᵀ of earlier edits). The
    solution lies in the range of P, so Δ k = 0 for every preserved key k with P k = 0.
    """
    if keys.ndim != 2 or residual.ndim != 2 or keys.shape[1] != residual.shape[1]:
        raise ValueError(f"keys {tuple(keys.shape)} and residuals {tuple(residual.shape)} must be (d, n) with equal n")
    k = keys.to(torch.float64)
    p = projector.to(torch.float64)
    gram = k @ k.T
    if previous is not None:
        gram = gram + previous.to(torch.float64)
    eye = torch.eye(k.shape[0], dtype=torch.float64, device=k.device)
    solution = torch.linalg.solve(p @ gram + l2 * eye, p @ k @ residual.to(torch.float64).T)
    return solution.T


# --------------------------------------------------------------------------------------------------
# Model plumbing


def _hidden(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """A one-sequence batch's activations as (tokens, d): blocks pass (1, seq, d), but some modules see their
    input flattened to (seq, d) (OPT's MLP, Qwen2-MoE's shared expert)."""
    return x.reshape(-1, x.shape[-1])


@contextmanager
def _hook(module: torch.nn.Module, fn: Callable[..., Any], pre: bool = False) -> Iterator[None]:
    handle = module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn)
    try:
        yield
    finally:
        handle.remove()


def subject_last_token(tokenizer: Any, text: str, subject: str) -> int:
    """Index in :func:`encode` ``(text)`` of the last token of the last occurrence of ``subject`` (MEMIT's
    ``subject_last``)."""
    start = text.rfind(subject)
    if start < 0:
        raise ValueError(f"AlphaEdit: subject {subject!r} does not occur in prompt {text!r}")
    end = start + len(subject)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded.get("offset_mapping")
    if offsets is None:
        raise ValueError("AlphaEdit needs a fast tokenizer (offset mapping) to find the subject's last token")
    last = [i for i, (a, b) in enumerate(offsets) if a < end and b > a]
    if not last:
        raise ValueError(f"AlphaEdit: no token covers subject {subject!r} in {text!r}")
    return len(leading_special_ids(tokenizer, text)) + last[-1]


def lookup_token(tokenizer: Any, text: str, subject: str, fact_token: str = "subject_last") -> int:
    """Where keys and values are read in :func:`encode` ``(text)``: the subject's last token (LACUNA) or the prompt's
    last token (``last``)."""
    if fact_token == "last":
        return len(encode(tokenizer, text)) - 1
    return subject_last_token(tokenizer, text, subject)


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text`` as the model reads it: the special tokens the tokenizer puts first (BOS, as MEMIT/AlphaEdit's code and
    lm-eval tokenize), then the text's tokens (:func:`~lacuna_unlearn.qa.encoding.leading_special_ids`)."""
    return leading_special_ids(tokenizer, text) + list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _ids(tokenizer: Any, text: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([encode(tokenizer, text)], device=device)


def _target_ids(tokenizer: Any, request: EditRequest) -> list[int]:
    """`` target\n`` as it continues the request's prompt (:func:`~lacuna_unlearn.qa.encoding.continuation_ids`)."""
    target = request.target
    ids = continuation_ids(tokenizer, request.prompt, f" {target}\n")
    if not ids:
        raise ValueError(f"AlphaEdit: target {target!r} tokenizes to nothing")
    return ids


def _at_subject(
    model: torch.nn.Module,
    tokenizer: Any,
    module: torch.nn.Module,
    texts: Sequence[tuple[str, str]],
    pre: bool,
    fact_token: str = "subject_last",
) -> torch.Tensor:
    """Input (``pre``) or output of ``module`` at each (text, subject)'s subject-last token: (d, n)."""
    device = next(model.parameters()).device
    seen: list[torch.Tensor] = []

    def grab(_module: torch.nn.Module, *args: Any) -> None:
        seen.append(_tokens(args[0][0] if pre else _hidden(args[1])).detach())

    columns = []
    with _hook(module, grab, pre=pre), torch.no_grad():
        for text, subject in texts:
            seen.clear()
            model(input_ids=_ids(tokenizer, text, device))
            columns.append(seen[0][lookup_token(tokenizer, text, subject, fact_token)].to(torch.float64))
    return torch.stack(columns, dim=1)


def _contexts(request: EditRequest, templates: Sequence[str]) -> list[tuple[str, str]]:
    return [(t.format(request.prompt), request.subject) for t in templates]


def request_keys(
    model: torch.nn.Module, tokenizer: Any, requests: Sequence[EditRequest], cfg: AlphaEditConfig, layer: int
) -> torch.Tensor:
    """K₁ (d_in × n): the edited module's input at the subject's last token, averaged over context templates."""
    module = edited_module(model, cfg.module, layer)
    cols = [
        _at_subject(model, tokenizer, module, _contexts(r, cfg.context_templates), True, cfg.fact_token).mean(dim=1)
        for r in requests
    ]
    return torch.stack(cols, dim=1)


def _residual_stream(
    model: torch.nn.Module, tokenizer: Any, requests: Sequence[EditRequest], cfg: AlphaEditConfig
) -> torch.Tensor:
    block = module_at(model, cfg.block, cfg.layers[-1])
    texts = [(r.prompt, r.subject) for r in requests]  # AlphaEdit reads the current values on the bare prompt
    return _at_subject(model, tokenizer, block, texts, False, cfg.fact_token)


def compute_target_value(
    model: torch.nn.Module, tokenizer: Any, request: EditRequest, cfg: AlphaEditConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """z = h + δ at block ``layers[-1]``'s output, the subject's last token (MEMIT ``compute_z``); (d_model,)."""
    device = next(model.parameters()).device
    block = module_at(model, cfg.block, cfg.layers[-1])
    target = _target_ids(tokenizer, request)
    rewrites = []
    for text, subject in _contexts(request, cfg.context_templates):
        prompt = encode(tokenizer, text)
        ids = torch.tensor([prompt + target], device=device)
        rewrites.append((ids, lookup_token(tokenizer, text, subject, cfg.fact_token), len(prompt)))
    kl_text = cfg.kl_prompt.format(request.subject)
    kl_ids = _ids(tokenizer, kl_text, device)
    kl_idx = lookup_token(tokenizer, kl_text, request.subject, cfg.fact_token)

    delta = torch.zeros(model.config.hidden_size, device=device, requires_grad=True)
    state: dict[str, Any] = {"idx": 0, "init": None}

    def add_delta(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
        hidden = _hidden(output)
        flat = _tokens(hidden).clone()
        if state["init"] is None:
            state["init"] = flat[state["idx"]].detach().clone()
        flat[state["idx"]] = flat[state["idx"]] + delta.to(flat.dtype)
        hidden = flat.reshape(hidden.shape)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    optimizer = torch.optim.Adam([delta], lr=cfg.v_lr)
    kl_init: torch.Tensor | None = None
    logs: dict[str, float] = {}
    requires = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        with _hook(block, add_delta):
            for step in range(cfg.v_num_grad_steps):
                optimizer.zero_grad()
                nll = torch.zeros((), device=device)
                for ids, idx, prompt_len in rewrites:
                    state["idx"] = idx
                    logits = model(input_ids=ids).logits[0, prompt_len - 1 : -1].float()
                    nll = nll + F.cross_entropy(logits, ids[0, prompt_len:]) / len(rewrites)
                state["idx"] = kl_idx
                kl_log = torch.log_softmax(model(input_ids=kl_ids).logits[0, kl_idx].float(), dim=-1)
                if kl_init is None:
                    kl_init = kl_log.detach()
                kl = cfg.kl_factor * F.kl_div(kl_log[None], kl_init[None], log_target=True, reduction="batchmean")
                h_norm = state["init"].norm()
                decay = cfg.v_weight_decay * (delta.norm() / h_norm**2)
                loss = nll + kl + decay
                logs = {"steps": step + 1, "nll": nll.item(), "kl": kl.item(), "delta_norm": delta.norm().item()}
                if loss.item() < _EARLY_STOP_LOSS:
                    break
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    max_norm = cfg.clamp_norm_factor * h_norm
                    if delta.norm() > max_norm:
                        delta.mul_(max_norm / delta.norm())
    finally:
        for p, r in zip(model.parameters(), requires, strict=True):
            p.requires_grad_(r)
    return (state["init"] + delta.detach()).to(torch.float64), logs


def apply_alpha_edit(
    model: torch.nn.Module,
    tokenizer: Any,
    requests: Sequence[EditRequest],
    cfg: AlphaEditConfig,
    second_moments: Mapping[int, torch.Tensor],
) -> dict[str, Any]:
    """Edit ``model`` in place, batch by batch (sequential editing); return per-layer statistics for the manifest."""
    cfg = with_templates(model, cfg.validate())
    if not requests:
        raise ValueError("AlphaEdit: no edit requests (the forget split is empty)")
    projectors, stats = {}, {}
    for layer in cfg.layers:
        module = edited_module(model, cfg.module, layer)
        weight, d_in = module.weight, input_dim(module)
        moment = second_moments.get(layer)
        if moment is None or tuple(moment.shape) != (d_in, d_in):
            raise ValueError(f"AlphaEdit: no {d_in}x{d_in} key second moment for layer {layer}")
        threshold = cfg.nullspace_threshold
        if cfg.nullspace_relative:
            threshold *= float(torch.linalg.eigvalsh(moment.to(torch.float64))[-1])
        projectors[layer] = null_space_projector(moment, threshold).to(weight.device)
        null_dim = int(round(float(torch.trace(projectors[layer]))))
        if null_dim == 0:
            eigenvalues = torch.linalg.eigvalsh(moment.to(torch.float64))
            low, high = float(eigenvalues[0]), float(eigenvalues[-1])
            hint = (
                f"raise method.args.nullspace_threshold above {low / high:.3g} (the smallest eigenvalue relative "
                "to the largest)"
                if cfg.nullspace_relative
                else f"raise method.args.nullspace_threshold above {low:.3g}, or set method.args.nullspace_relative=true"
            )
            raise ValueError(
                f"AlphaEdit: layer {layer}: no eigenvalue of the preserved-key second moment is below the null-space "
                f"threshold {threshold:.3g} (nullspace_threshold={cfg.nullspace_threshold}, relative: "
                f"{cfg.nullspace_relative}; eigenvalues {low:.3g} .. {high:.3g}), so the edit would be zero: {hint}, "
                "or edit another layer (method.args.layers)"
            )
        stats[layer] = {
            "null_space_dim": null_dim,
            "d_in": d_in,
            "threshold": threshold,
            "update_fro": 0.0,
        }
    previous = {layer: None for layer in cfg.layers}
    value_logs, reached = [], []
    for start in range(0, len(requests), cfg.batch_size):
        batch = list(requests[start : start + cfg.batch_size])
        zs, logs = zip(*(compute_target_value(model, tokenizer, r, cfg) for r in batch), strict=True)
        value_logs += logs
        z = torch.stack(zs, dim=1)
        gap_before = float((z - _residual_stream(model, tokenizer, batch, cfg)).norm())
        for i, layer in enumerate(cfg.layers):
            keys = request_keys(model, tokenizer, batch, cfg, layer)
            residual = (z - _residual_stream(model, tokenizer, batch, cfg)) / (len(cfg.layers) - i)
            update = alpha_edit_update(keys, residual, projectors[layer], previous[layer], cfg.l2)
            module = edited_module(model, cfg.module, layer)
            with torch.no_grad():  # update is d_out x d_in; a Conv1D stores its weight d_in x d_out
                module.weight += (update.T if is_transposed_module(module) else update).to(module.weight)
            stats[layer]["update_fro"] += float(update.norm())
        gap_after = float((z - _residual_stream(model, tokenizer, batch, cfg)).norm())
        reached.append(1.0 - gap_after / gap_before if gap_before > 0 else 1.0)
        for layer in cfg.layers:
            keys = request_keys(model, tokenizer, batch, cfg, layer)
            gram = keys @ keys.T
            previous[layer] = gram if previous[layer] is None else previous[layer] + gram
    # reached: per batch, the share of the distance to the target values z the weight edit closed (1 = all)
    return {"layers": {str(k): v for k, v in stats.items()}, "values": value_logs, "reached": reached}


# --------------------------------------------------------------------------------------------------
# Data and jobs


def edit_requests(rows: Sequence[Mapping[str, Any]], target: str) -> list[EditRequest]:
    """One request per QA row: prompt = the probe prompt, subject = the person's name, target = ``target``."""
    from lacuna_tasks import person_from_question, probe_prompt

    return [EditRequest(probe_prompt(r["question"]), person_from_question(r["question"])[0], target) for r in rows]


def run_alpha_edit(
    model_dir: str | os.PathLike[str],
    requests: Sequence[EditRequest],
    preserved: Sequence[str],
    out: str | os.PathLike[str],
    cfg: AlphaEditConfig,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
) -> Path:
    """Load ``model_dir`` (float32, local files only), edit, write an HF checkpoint + ``unlearn_manifest.json``.

    The checkpoint is built in ``OUT.partial`` and renamed, so a failed run leaves nothing at ``out``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_unlearn.publish import publish_checkpoint

    cfg.validate()
    started = time.time()
    model_path, out = Path(model_dir), Path(out)
    if not model_path.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_path}")
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, trust_remote_code=False)
    model.eval()
    cfg = with_templates(model, cfg)  # the manifest and the moments' cache key name the modules edited
    for layer in cfg.layers:  # fail on a bad module/layer before the expensive statistics
        edited_module(model, cfg.module, layer)
        module_at(model, cfg.block, layer)
    timings = {}
    t = time.time()
    moments, cached = cached_second_moments(
        model, tokenizer, model_path, preserved, cfg, Path(cache_dir) if cache_dir else None
    )
    timings["second_moments"] = round(time.time() - t, 2)
    t = time.time()
    edit_stats = apply_alpha_edit(model, tokenizer, requests, cfg, moments)
    timings["edit"] = round(time.time() - t, 2)
    manifest = {
        "method": "alpha_edit",
        "method_args": asdict(cfg),
        "model": str(model_path),
        "requests": len(requests),
        "preserved_texts": len(preserved),
        "second_moments_cached": cached,
        "edit": edit_stats,
        **(dict(extra_manifest) if extra_manifest else {}),
        "seed": cfg.seed,
        "timings_seconds": timings,
        "wall_seconds": round(time.time() - started, 2),
    }
    try:
        return publish_checkpoint(model, tokenizer, out, manifest)
    finally:
        del model
        gc.collect()


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
    """``lacuna-unlearn method=alpha_edit``: one request per forget row; preserved keys from ``cov_text``."""
    from lacuna_metrics import default_cache_dir

    try:
        cfg = AlphaEditConfig(**{"seed": seed, **args}).validate()
    except TypeError as exc:
        raise ValueError(f"method 'alpha_edit': {exc}") from None
    texts, sources = preserved_texts(cfg, data)
    return run_alpha_edit(
        model,
        edit_requests(forget_rows, cfg.target),
        texts,
        out,
        cfg,
        cache_dir=default_cache_dir().parent / "alpha_edit",
        extra_manifest={"preserved_sources": sources, "data": str(getattr(data, "source", ""))},
    )
