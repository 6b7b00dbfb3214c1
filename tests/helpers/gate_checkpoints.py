"""Tiny hand-made llama-shaped checkpoints and lm-eval output directories for the gate's checkpoint-pairing tests
(tests/unlearn/bench/gate/test_gate_checkpoints.py, tests/e2e/test_gate_checkpoints_cli.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

LAYERS, HIDDEN, INTER, VOCAB = 4, 16, 32, 64


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g)}
    for i in range(LAYERS):
        for proj in ("q", "k", "v", "o"):
            state[f"model.layers.{i}.self_attn.{proj}_proj.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g)
        state[f"model.layers.{i}.mlp.gate_proj.weight"] = torch.randn(INTER, HIDDEN, generator=g)
        state[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(INTER, HIDDEN, generator=g)
        state[f"model.layers.{i}.mlp.down_proj.weight"] = torch.randn(HIDDEN, INTER, generator=g)
        state[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(HIDDEN)
    state["model.norm.weight"] = torch.ones(HIDDEN)
    state["lm_head.weight"] = torch.randn(VOCAB, HIDDEN, generator=g)
    return state


def _save(directory: Path, state: dict[str, torch.Tensor], **config: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "llama", "num_hidden_layers": LAYERS, "tie_word_embeddings": False, **config}
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def lm_eval_out(root: Path, model_args: str, *, date: float | None = None, **config: Any) -> Path:
    """An lm-eval ``--output_path`` directory as lm-eval 0.4.x writes it (``config.model_args``, ``model_name``, ``date``)."""
    tasks = {
        "lacuna_email_forget_qa": {"leak_rate,none": 0.05},
        "lacuna_email_retain_qa": {"accuracy,none": 0.9},
    }
    pretrained = dict(p.split("=", 1) for p in model_args.split(","))["pretrained"]
    doc = {
        "results": tasks,
        "configs": {t: {"task": t} for t in tasks},
        "config": {"model": "hf", "model_args": model_args, "model_revision": "main", "model_sha": "", **config},
        "model_name": pretrained,
        "model_source": "hf",
        "date": time.time() if date is None else date,
    }
    path = root / "sanitized" / "results_2026-01-01T00-00-00.000001.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return root
