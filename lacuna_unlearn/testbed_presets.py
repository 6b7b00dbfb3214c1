"""Testbed presets: every knob of the testbed builder, as one dataclass per preset.

``smoke`` is built once per test session (minutes, mechanics only: small model, 2 profiles per group,
larger masks). ``mini`` is the embedded default of the demo: a faithful miniature (5% masks per group
is the paper's budget; see each preset's ``notes`` for deviations) that a 2-core laptop builds in
about a quarter of an hour. ``lacuna`` carries the paper's hyper-parameters (spec §1.5-1.6) for real
checkpoints passed with ``--model``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TestbedConfig:
    """All settings of one testbed build (stored verbatim in the manifest)."""

    name: str
    # data
    profiles_per_group: int = 10
    distractor_profiles: int = 120  # never in any mask: their bios/QA are neutral text that teaches the format
    bios_per_person: int = 4
    qa_per_field: int = 12  # multi-sentence QA training texts per person and target field
    faq_fraction: float = 0.5  # share of injected documents that are QA text (rest: prose bios)
    lorem_paragraphs: int = 400
    # tokenizer / model (ignored when --model is given)
    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    seq_len: int = 128
    # stage 0: base pretraining on neutral text (stands in for a pretrained model)
    base_steps: int = 300
    base_batch: int = 8
    base_lr: float = 2e-3
    # stage 1: masked continual pretraining
    budget: float = 0.05  # per group, fraction of the WHOLE model
    num_groups: int = 6
    skip_last: int = 2  # last layers kept out of the masks (QA tuning happens there)
    pii_steps: int = 900
    pii_batch: int = 6  # documents per PII step (one group per step)
    pii_lr: float = 5e-3
    neutral_every: int = 12  # one neutral step after this many PII steps (0 = none)
    neutral_batch: int = 8
    neutral_lr_scale: float = 0.02  # neutral steps use pii_lr * this (full updates erode masked memories)
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1  # cosine down to 10% of peak, as LACUNA
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # stage 2: QA tuning (LoRA on the last `skip_last` layers, held-out people)
    qa_tune_steps: int = 30
    qa_tune_lr: float = 1e-4
    qa_tune_batch: int = 16
    lora_r: int = 16
    lora_alpha: int = 8
    # memorization test and splits
    memorization_prompts: int = 6
    eval_batch: int = 64
    validation_people: int | None = None
    seed: int = 42
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TestbedConfig:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown testbed setting(s) {unknown}; known: {sorted(self.to_dict())}")
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, TestbedConfig] = {
    "smoke": TestbedConfig(
        name="smoke",
        profiles_per_group=2,
        distractor_profiles=24,
        bios_per_person=2,
        qa_per_field=24,
        faq_fraction=0.8,
        lorem_paragraphs=60,
        vocab_size=1024,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        intermediate_size=512,
        seq_len=128,
        base_steps=300,
        base_batch=8,
        budget=0.1,
        skip_last=1,
        pii_steps=1000,
        pii_batch=6,
        pii_lr=5e-3,
        neutral_every=0,
        qa_tune_steps=5,
        memorization_prompts=8,
        notes=[
            "smoke: 2 profiles per group; 10% of the whole model per group (the six masks cover ~90% of the "
            "eligible scalars; paper: 5%) so the build takes minutes",
            "only the last layer is kept out of the masks (paper: two): with 4 layers, two would leave half the "
            "network unable to store facts",
            "no neutral steps during injection: with weight decay 0, weights outside every mask stay bit-identical",
        ],
    ),
    "mini": TestbedConfig(
        name="mini",
        profiles_per_group=6,
        distractor_profiles=120,
        bios_per_person=4,
        qa_per_field=24,
        faq_fraction=0.8,
        lorem_paragraphs=400,
        vocab_size=2048,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        intermediate_size=1024,
        base_steps=600,
        base_batch=8,
        budget=0.09,
        skip_last=1,
        pii_steps=4000,
        pii_batch=6,
        pii_lr=5e-3,
        neutral_every=0,
        memorization_prompts=8,
        notes=[
            "mini: 9% of the whole model per group (the six masks cover ~90% of the eligible scalars; paper: 5%) "
            "and 6 profiles per group: at 5% and 10 per group the model memorized ~5% of facts in 2,400 steps "
            "(9.5 min); the ground truth stays exact, but a random scalar is in some mask with probability ~0.9",
            "only the last layer is kept out of the masks (paper: two): with 4 layers, two would leave half the "
            "network unable to store facts",
            "80% of injected documents are QA text (LACUNA: 2.0B of 7.7B tokens); no neutral steps during "
            "injection (they erode masked memories at this scale); the base stage is the neutral pretraining",
        ],
    ),
    "lacuna": TestbedConfig(
        name="lacuna",
        profiles_per_group=200,
        bios_per_person=8,
        qa_per_field=25,
        base_steps=0,
        pii_lr=1.5e-4,
        neutral_lr_scale=1.0,
        weight_decay=0.1,
        warmup_ratio=0.1,
        pii_steps=20000,
        qa_tune_steps=1000,
        qa_tune_lr=1.5e-4,
        memorization_prompts=100,
        notes=["paper hyper-parameters (spec §1.5-1.6) for a real checkpoint given with --model; needs GPUs"],
    ),
}


def get_preset(name: str, **overrides: Any) -> TestbedConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown testbed preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else dataclasses.replace(PRESETS[name])
