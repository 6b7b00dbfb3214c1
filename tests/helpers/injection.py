"""A tiny OLMo, random documents and step datasets for masked continual pretraining
(tests/unlearn/testbed/test_injection.py, tests/e2e/test_injection_trainer.py)."""

from __future__ import annotations

import random

import torch

from lacuna_unlearn.testbed.injection import StepBatches, StepPlan


def tiny_olmo(seed: int = 0):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    config = Olmo2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    return Olmo2ForCausalLM(config)


def random_docs(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 97) for _ in range(rng.randrange(8, 20))] for _ in range(n)]


def steps_dataset(plan: StepPlan, replicas: int = 1) -> StepBatches:
    return StepBatches(
        plan,
        pii_qa={g: random_docs(6, g) for g in range(6)},
        pii_bio={g: random_docs(3, 100 + g) for g in range(6)},
        neutral_rows=[[(i * 7 + j) % 95 + 2 for j in range(16)] for i in range(20)],
        pii_batch=3,
        neutral_batch=2,
        faq_fraction=0.5,
        seq_len=16,
        pad_id=0,
        replicas=replicas,
        seed=3,
    )
