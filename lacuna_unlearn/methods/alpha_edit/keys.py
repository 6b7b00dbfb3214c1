"""AlphaEdit's preserved-knowledge keys K₀ (docs/definitions.md#alphaedit): the texts they are read from
(``cov_text`` / ``cov_files``), their per-layer second moment K₀K₀ᵀ/N and its on-disk cache. Split from
:mod:`lacuna_unlearn.methods.alpha_edit.edit` (the edit itself), which re-exports :func:`key_second_moments`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from lacuna_unlearn.methods.settings import AlphaEditSettings
from lacuna_unlearn.qa.encoding import leading_special_ids

AlphaEditSettingsT = TypeVar("AlphaEditSettingsT", bound=AlphaEditSettings)

__all__ = [
    "AUTO",
    "cached_second_moments",
    "edited_module",
    "held_out_neutral",
    "input_dim",
    "key_second_moments",
    "module_at",
    "preserved_texts",
    "with_templates",
]

#: Version of the cached second moments' fingerprint payload.
_FORMAT_VERSION = 2  # 2: the texts start with the tokenizer's BOS


#: ``module`` / ``block`` setting that asks the model anatomy (docs/anatomy.md): each layer's MLP output projection
#: and its transformer block.
AUTO = "auto"


def with_templates(model: torch.nn.Module, cfg: AlphaEditSettingsT) -> AlphaEditSettingsT:
    """``cfg`` with ``module`` / ``block`` = ``auto`` replaced by the anatomy's templates: ``model.layers.{}.mlp.
    down_proj`` and ``model.layers.{}`` on Llama-style models, ``transformer.h.{}.mlp.c_proj`` and
    ``transformer.h.{}`` on GPT-2, ``gpt_neox.layers.{}.mlp.dense_4h_to_h`` ... (a template the config gives is
    kept). ValueError naming the model when the layers' MLP output projections do not share one template."""
    if AUTO not in (cfg.module, cfg.block):
        return cfg
    from lacuna_metrics import MLP_OUTPUT_ROLES, find_blocks, model_anatomy

    blocks, _ = find_blocks(model)
    module, block = cfg.module, cfg.block if cfg.block != AUTO else f"{blocks}.{{}}"
    if module == AUTO:
        found = {
            w.module.replace(f"{blocks}.{w.layer}.", f"{blocks}.{{}}.", 1)
            for w in model_anatomy(model).matrices()
            if w.component == "mlp" and w.role in MLP_OUTPUT_ROLES and w.hook == "linear" and w.layer is not None
        }
        if len(found) != 1:
            raise ValueError(
                f"AlphaEdit: module=auto found {sorted(found) or 'no'} MLP output projection(s) per layer in "
                f"{type(model).__name__} (docs/anatomy.md); set method.args.module"
            )
        module = found.pop()
    return replace(cfg, module=module, block=block)


def module_at(model: torch.nn.Module, template: str, layer: int) -> torch.nn.Module:
    """The submodule ``template.format(layer)``; ValueError naming the setting when the model has none."""
    name = template.format(layer)
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"AlphaEdit: the model has no module {name!r} (set method.args.module / block)") from None


def edited_module(model: torch.nn.Module, template: str, layer: int) -> torch.nn.Module:
    """:func:`module_at`, which must be an ``nn.Linear`` or a transformers ``Conv1D`` (stored ``(d_in, d_out)``: the
    update is added transposed; see :func:`input_dim`)."""
    from lacuna_metrics import is_linear_module

    module = module_at(model, template, layer)
    if not is_linear_module(module):
        raise ValueError(
            f"AlphaEdit edits nn.Linear / Conv1D modules; {template.format(layer)!r} is {type(module).__name__}"
        )
    return module


def input_dim(module: torch.nn.Module) -> int:
    """d_in of the edited module: the length of its keys (a ``Conv1D`` stores its weight ``(d_in, d_out)``)."""
    from lacuna_metrics import is_transposed_module

    return int(module.weight.shape[0 if is_transposed_module(module) else 1])


def key_second_moments(
    model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], cfg: AlphaEditSettings, batch_size: int = 32
) -> dict[int, torch.Tensor]:
    """K₀K₀ᵀ/N per edited layer: the uncentered second moment of the module's inputs over every token of ``texts``.

    Texts run in right-padded batches; padding positions are left out. Each batch's Gram matrix is formed in
    float32 and accumulated in float64.
    """
    if not texts:
        raise ValueError("AlphaEdit: no preserved-knowledge text for the key covariance (cov_text / cov_files)")
    cfg = with_templates(model, cfg)
    device = next(model.parameters()).device
    lead = leading_special_ids(tokenizer, texts[0])  # BOS, as the edit's own prompts start (alpha_edit.encode)
    room = cfg.max_length - len(lead)
    plain = [tokenizer(t, add_special_tokens=False, truncation=True, max_length=room)["input_ids"] for t in texts]
    encoded = sorted((lead + ids for ids in plain if ids), key=len)  # similar lengths per batch: little padding
    if not encoded:
        raise ValueError("AlphaEdit: the preserved-knowledge texts tokenize to nothing")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sums: dict[int, torch.Tensor] = {}
    valid: dict[str, torch.Tensor] = {}

    def collect(layer: int) -> Callable[..., None]:
        def fn(_module: torch.nn.Module, args: Any) -> None:
            x = args[0]  # (batch, seq, d), or (batch · seq, d) where the model flattens it (OPT's MLP)
            k = x.reshape(-1, x.shape[-1])[valid["mask"].reshape(-1)].float()
            gram = (k.T @ k).to(torch.float64)
            sums[layer] = sums[layer] + gram if layer in sums else gram

        return fn

    handles = [
        edited_module(model, cfg.module, layer).register_forward_pre_hook(collect(layer)) for layer in cfg.layers
    ]
    try:
        with torch.no_grad():
            for start in range(0, len(encoded), batch_size):
                chunk = encoded[start : start + batch_size]
                width = max(len(ids) for ids in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.bool)
                for row, seq in enumerate(chunk):
                    ids[row, : len(seq)] = torch.tensor(seq)
                    mask[row, : len(seq)] = True
                valid["mask"] = mask.to(device)
                model(input_ids=ids.to(device), attention_mask=mask.to(device).long())
    finally:
        for h in handles:
            h.remove()
    count = sum(len(ids) for ids in encoded)
    return {layer: s / count for layer, s in sums.items()}


def preserved_texts(cfg: AlphaEditSettings, data: Any) -> tuple[list[str], dict[str, Any]]:
    """The preserved-knowledge texts of ``cov_text`` / ``cov_files`` and where they came from.

    None of them is a document of the testbed's held-out neutral slice (``data/neutral_heldout.jsonl``): the
    neutral-perplexity probe reads that slice to see whether a method damaged text it never saw, and keys read from
    it would keep the edit off exactly the text the probe scores. ``sources["neutral_heldout_excluded"]`` counts the
    texts left out for that reason."""
    from lacuna_tasks import qa_text

    texts: list[str] = []
    sources: dict[str, Any] = {}
    if "retain" in cfg.cov_text:
        rows = data.splits.get("retain", []) if data is not None else []
        texts += [qa_text(r["question"], r["answer"]) for r in rows]
        sources["retain"] = len(rows)
    testbed = _testbed_dir(data)
    if "neutral" in cfg.cov_text:
        neutral = _testbed_neutral(testbed) if testbed is not None else None
        sources["neutral"] = len(neutral) if neutral is not None else "unavailable (the data is not inside a testbed)"
        texts += neutral or []
    for path in cfg.cov_files:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"AlphaEdit cov_files: {file} not found")
        lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        texts += lines
        sources[str(file)] = len(lines)
    held_out = held_out_neutral(testbed) if testbed is not None else set()
    kept = [t for t in texts if t not in held_out]
    if testbed is not None:
        sources["neutral_heldout_excluded"] = len(texts) - len(kept)
    return kept[: cfg.cov_samples], sources


def _testbed_dir(data: Any) -> Path | None:
    """The testbed directory holding ``data`` (its ``data/`` or the testbed itself), or None."""
    if data is None:
        return None
    source = Path(str(data.source))
    for candidate in (source, source.parent):
        manifest = candidate / "manifest.json"
        if manifest.is_file():
            try:
                content = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(content, dict) and content.get("kind") == "lacuna-bench-testbed":
                return candidate
    return None


def _testbed_neutral(testbed: Path) -> list[str] | None:
    """The neutral documents the testbed trained on, rebuilt from its manifest (deterministic in the seed): the
    neutral corpus without the seeded share held out for the perplexity probe. None when the manifest does not
    record the corpus settings."""
    from lacuna_unlearn.testbed.corpus import build_corpus, hold_out_neutral

    config = json.loads((testbed / "manifest.json").read_text(encoding="utf-8")).get("config") or {}
    keys = ("profiles_per_group", "distractor_profiles", "bios_per_person", "qa_per_field", "lorem_paragraphs")
    if not all(k in config for k in keys):
        return None
    seed = config.get("seed", 42)
    corpus = build_corpus(**{k: config[k] for k in keys}, num_groups=config.get("num_groups", 6), seed=seed)
    # testbeds built before the held-out slice existed record no share: they held nothing out
    trained, _ = hold_out_neutral(corpus, float(config.get("neutral_heldout", 0.0)), seed)
    return list(trained.neutral)


def held_out_neutral(testbed: Path) -> set[str]:
    """The documents of the testbed's held-out neutral slice, as the perplexity probe reads them
    (``data/neutral_heldout.jsonl``); empty when the testbed has none."""
    from lacuna_tasks import NEUTRAL_HELDOUT_FILE, read_neutral_heldout

    file = testbed / "data" / NEUTRAL_HELDOUT_FILE
    return set(read_neutral_heldout(file)) if file.is_file() else set()


def _fingerprint(model_dir: Path, texts: Sequence[str], cfg: AlphaEditSettings) -> str:
    """The cache key of the second moments: everything they depend on."""
    from lacuna_metrics import Checkpoint

    digest = hashlib.sha256()
    payload = {
        "format": _FORMAT_VERSION,
        "weights": Checkpoint(model_dir).fingerprint(),
        "module": cfg.module,
        "layers": list(cfg.layers),
        "max_length": cfg.max_length,
    }
    digest.update(json.dumps(payload, sort_keys=True).encode())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (model_dir / name).is_file():
            digest.update((model_dir / name).read_bytes())
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return digest.hexdigest()


def cached_second_moments(
    model: torch.nn.Module,
    tokenizer: Any,
    model_dir: Path,
    texts: Sequence[str],
    cfg: AlphaEditSettings,
    cache: Path | None,
) -> tuple[dict[int, torch.Tensor], bool]:
    """:func:`key_second_moments`, read from / written to ``cache`` (a directory; None = no cache) under a SHA-256
    fingerprint of the weights, tokenizer, texts, module and layers; also whether it was a cache hit."""
    from safetensors import SafetensorError, safe_open

    from lacuna_metrics import save_tensors

    cfg = with_templates(model, cfg)  # the key names the module edited, not "auto"
    key = _fingerprint(model_dir, texts, cfg)
    path = cache / f"{key}.safetensors" if cache is not None else None
    if path is not None and path.is_file():
        try:
            with safe_open(str(path), framework="pt") as fh:
                if (fh.metadata() or {}).get("fingerprint") == key:
                    return {int(k): fh.get_tensor(k) for k in fh.keys()}, True
        except (OSError, SafetensorError):
            pass  # unreadable cache: recompute and overwrite
    moments = key_second_moments(model, tokenizer, texts, cfg)
    if path is not None:
        save_tensors(path, {str(k): v for k, v in moments.items()}, {"fingerprint": key})
    return moments, False
