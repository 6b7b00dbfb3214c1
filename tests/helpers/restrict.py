"""A tiny Llama, forget masks for it, LM batches and the bit-identity check of restricted training
(tests/unlearn/trainer/test_restrict.py, tests/e2e/test_restrict_hf_trainer.py)."""

from __future__ import annotations

import torch

from lacuna_metrics.masks import MaskSet, build_masks, named_shapes_of
from lacuna_unlearn.trainer.restrict import (
    verify_unchanged,
)

VOCAB, LAYERS = 64, 2
DOWN0 = "model.layers.0.mlp.down_proj.weight"


def tiny_llama(seed: int = 0, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(config)


def tiny_masks(model) -> MaskSet:
    return build_masks(named_shapes_of(model), LAYERS, budget=0.08, seed=3, skip_last=0)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def lm_batch(seed: int, batch: int = 4, length: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def assert_restricted(model, before, resolved, expect_masked: bool = True) -> None:
    """Out-of-mask scalars bit-identical (checked by hand, independently of verify_unchanged); in-mask moved."""
    assert verify_unchanged(before, model, resolved) == []
    masked = 0
    for name, param in model.named_parameters():
        after, old = param.detach(), before[name]
        if name not in resolved:
            assert torch.equal(after, old), name
            assert not param.requires_grad, name
            continue
        mask = resolved[name]
        if mask is None:
            assert not torch.equal(after, old), name
            continue
        masked += 1
        assert torch.equal(after[~mask], old[~mask]), name
        moved = (after[mask] != old[mask]).float().mean().item()
        assert moved > 0.9, (name, moved)
    assert (masked > 0) == expect_masked
