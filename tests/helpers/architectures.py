"""The architecture matrix's shared inputs (tests/metrics/weights/test_architectures.py and
tests/e2e/test_architectures_unlearn_eval.py): one tiny random model per decoder-only family, built from its
transformers config, with masks built for it; a small LACUNA dataset and tokenizer; the in-process Hydra app."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.masks import build_masks, named_shapes_of, save_masks

VOCAB = 320
HIDDEN = 32
LAYERS = 2
_SPECIAL: dict[str, int] = {}  # pad/bos/eos ids, filled from the tokenizer
_LLAMA_LIKE = dict(hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def _configs() -> dict[str, dict[str, Any]]:
    common = dict(num_hidden_layers=LAYERS, max_position_embeddings=512)
    return {
        "llama": dict(_LLAMA_LIKE, **common),
        "mistral": dict(_LLAMA_LIKE, **common),
        "qwen2": dict(_LLAMA_LIKE, **common),
        "gemma2": dict(_LLAMA_LIKE, head_dim=8, **common),
        "phi3": dict(_LLAMA_LIKE, **common),
        "mixtral": dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2, **common),
        "olmo2": dict(_LLAMA_LIKE, **common),
        "gpt2": dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=512),
        "gpt_neox": dict(hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4, **common),
        "opt": dict(hidden_size=HIDDEN, ffn_dim=64, num_attention_heads=4, word_embed_proj_dim=HIDDEN, **common),
        "falcon": dict(hidden_size=HIDDEN, num_attention_heads=4, num_hidden_layers=LAYERS),
        "bloom": dict(hidden_size=HIDDEN, n_layer=LAYERS, n_head=4),
        "qwen2_moe": dict(
            _LLAMA_LIKE,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            **common,
        ),
    }


ARCHITECTURES = list(_configs())


# -- shared inputs ---------------------------------------------------------------------------------------------


@dataclass
class World:
    root: Path
    data_dir: Path
    tokenizer: Any
    cache: Path


def make_world(root: Path) -> World:
    """A small LACUNA dataset and a byte-level BPE tokenizer trained on it in ``root`` (seconds, no network)."""
    from lacuna_tasks.prompts import qa_text
    from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    profiles = generate_profiles(24, seed=3)
    splits = build_splits(profiles, seed=3, people_per_field=4, validation_people=2)
    data_dir = Path(write_dataset(root / "data", profiles, splits))
    tokenizer = train_tokenizer([qa_text(r["question"], r["answer"]) for rows in splits.values() for r in rows], VOCAB)
    _SPECIAL.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id)
    _SPECIAL.update(eos_token_id=tokenizer.eos_token_id)
    return World(root, data_dir, tokenizer, root / "activation_cache")


@dataclass
class Arch:
    name: str
    model: torch.nn.Module
    before: Path
    masks: Path


def make_arch(name: str, world: World) -> Arch:
    """One tiny random model of architecture ``name``, saved with the tokenizer, and masks built for it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(name, vocab_size=VOCAB, **_SPECIAL, **_configs()[name])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    before = world.root / name / "before"
    model.save_pretrained(before)
    world.tokenizer.save_pretrained(before)
    masks = build_masks(named_shapes_of(model), LAYERS, num_groups=2, budget=0.01, seed=5, skip_last=0)
    path = save_masks(masks, world.root / name / "masks.safetensors")
    return Arch(name, model, before, path)


def _unlearn(world: World, arch: Arch, out: Path, *overrides: str) -> Path:
    from hydra import compose, initialize_config_module

    from lacuna_unlearn.trainer.app import run

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(
            config_name="unlearn",
            overrides=[
                f"model={arch.before}", f"data={world.data_dir}", "field=email", f"output_dir={out}",
                "trainer.args.max_steps=1", "trainer.args.per_device_train_batch_size=2",
                "trainer.args.gradient_accumulation_steps=1", "trainer.args.learning_rate=1e-3",
                "trainer.args.max_length=64", *overrides,
            ],
        )  # fmt: skip
    return Path(run(cfg))
