"""Testbed presets: every knob of the testbed builder, as one dataclass per preset (docs/testbeds.md).

``smoke`` is built once per test session (minutes, mechanics only: small model, few profiles per group,
larger masks). ``mini`` is the embedded default of the demo: a CPU miniature of LACUNA's regime (neutral
text trained unmasked between PII micro-batches, AdamW weight decay, masked PII gradients; see each preset's
``notes`` for deviations and the numbers behind them). ``standard`` is LACUNA's geometry (5% per group, the
last two layers outside the masks, 100 forget / 100 retain people per field) on a few-hundred-million-
parameter model for one GPU. ``lacuna`` carries the paper's hyper-parameters
(docs/definitions.md#masked-continual-pretraining, #qa-tuning) for real checkpoints passed with ``--model``.

Every override (``--set key=value``) is checked against the field's type and allowed range before anything
is built (:meth:`TestbedConfig.replace`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

#: Leak-audit targets a build can be gated on (the localization scorer's targets).
AUDIT_TARGETS = ("forget", "unified", "forget_vs_retain")
#: How neutral micro-batches share AdamW's moments with PII ones.
NEUTRAL_OPTIMIZERS = ("shared", "separate")


@dataclass
class TestbedConfig:
    """All settings of one testbed build (stored verbatim in the manifest)."""

    name: str
    # data
    profiles_per_group: int = 10
    distractor_profiles: int = 120  # never in any mask: their bios/QA are neutral text that teaches the format
    bios_per_person: int = 4
    qa_per_field: int = 12  # multi-sentence QA training texts per person and target field (LACUNA's template)
    varied_qa_per_field: int = 0  # extra QA texts per person and field with training-only question forms
    qa_block: int = 1  # QA pairs per injected QA document (>1: several people of one group, as ICR context)
    faq_fraction: float = 0.5  # share of injected documents that are QA text (rest: prose bios)
    lorem_paragraphs: int = 400
    neutral_heldout: float = 0.05  # share of neutral documents held out (data/neutral_heldout.jsonl), never trained
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
    pii_steps: int = 900  # PII micro-batches (one group each)
    pii_batch: int = 6  # documents per PII micro-batch
    pii_lr: float = 5e-3
    neutral_every: int = 4  # one neutral micro-batch (unmasked) after this many PII micro-batches (0 = none)
    neutral_batch: int = 8
    neutral_lr_scale: float = 1.0  # LR scale of an optimizer step made only of neutral micro-batches
    # "separate": neutral and PII steps keep their own AdamW moments (the feasibility prototype's two optimizers);
    # "shared": one AdamW as LACUNA (docs/testbeds.md 'Neutral optimizer')
    neutral_optimizer: str = "shared"
    # micro-batches per optimizer step, each masked by its own group (docs/definitions.md#masked-continual-pretraining)
    grad_accum: int = 1
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1  # cosine down to 10% of peak, as LACUNA
    weight_decay: float = 0.1  # AdamW, decoupled; LACUNA: 0.1
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
    people_per_field: int | None = None  # forget (and retain) people per field; None: half the eligible
    retain_eval_people: int = 0  # held-out retain-side people per field, memorized, never in an unlearning input
    validation_people: int | None = None
    robustness_people: int = 0  # per split and field: paraphrase / ICR probes before unlearning (0 = skip)
    # too few eligible people for the counts above: False fails the build; True takes the largest counts that fit
    # (people_per_field first, retain_eval_people in proportion) and records the shortfall in the manifest
    fit_people: bool = False
    splits_without_memorization: bool = False  # pipeline tests only: every target counts as memorized
    # leak audit (lacuna_metrics.leak_audit): the build fails if a method-free detector beats this on the target
    leak_audit: bool = True
    leak_audit_max_auc: float = 0.75
    leak_audit_target: str = "forget_vs_retain"
    leak_audit_composite_samples: int = 200_000
    null_gaussian_scale: float = 1e-3  # Gaussian null update: this x each tensor's RMS
    null_adam_lr: float = 1e-5  # Adam-shaped null update: +-lr on every scalar
    seed: int = 42
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_config(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TestbedConfig:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown testbed setting(s) {unknown}; known: {sorted(self.to_dict())}")
        for key, value in changes.items():
            _check_type(key, value)
        return dataclasses.replace(self, **changes)


#: Allowed ranges: (low, high, low inclusive, high inclusive); None = unbounded on that side.
_RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "profiles_per_group": (1, None, True, False),
    "distractor_profiles": (0, None, True, False),
    "bios_per_person": (0, None, True, False),
    "qa_per_field": (0, None, True, False),
    "varied_qa_per_field": (0, None, True, False),
    "qa_block": (1, None, True, False),
    "faq_fraction": (0, 1, True, True),
    "lorem_paragraphs": (0, None, True, False),
    "neutral_heldout": (0, 1, True, False),
    "vocab_size": (300, None, True, False),
    "hidden_size": (1, None, True, False),
    "num_layers": (1, None, True, False),
    "num_heads": (1, None, True, False),
    "intermediate_size": (1, None, True, False),
    "seq_len": (8, None, True, False),
    "base_steps": (0, None, True, False),
    "base_batch": (1, None, True, False),
    "base_lr": (0, None, False, False),
    "budget": (0, 1, False, True),
    "num_groups": (6, 6, True, True),
    "skip_last": (0, None, True, False),
    "pii_steps": (1, None, True, False),
    "pii_batch": (1, None, True, False),
    "pii_lr": (0, None, False, False),
    "neutral_every": (0, None, True, False),
    "neutral_batch": (1, None, True, False),
    "neutral_lr_scale": (0, None, True, False),
    "grad_accum": (1, None, True, False),
    "warmup_ratio": (0, 1, True, False),
    "min_lr_ratio": (0, 1, True, True),
    "weight_decay": (0, None, True, False),
    "max_grad_norm": (0, None, False, False),
    "qa_tune_steps": (0, None, True, False),
    "qa_tune_lr": (0, None, False, False),
    "qa_tune_batch": (1, None, True, False),
    "lora_r": (1, None, True, False),
    "lora_alpha": (1, None, True, False),
    "memorization_prompts": (2, None, True, False),
    "eval_batch": (1, None, True, False),
    "people_per_field": (1, None, True, False),
    "retain_eval_people": (0, None, True, False),
    "validation_people": (1, None, True, False),
    "robustness_people": (0, None, True, False),
    "leak_audit_max_auc": (0.5, 1, True, True),
    "leak_audit_composite_samples": (0, None, True, False),
    "null_gaussian_scale": (0, None, False, False),
    "null_adam_lr": (0, None, False, False),
}


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(TestbedConfig)


def _check_type(key: str, value: Any) -> None:
    """One-line error naming ``key`` when ``value`` does not fit the field's declared type."""
    hint = _hints()[key]
    if typing.get_origin(hint) is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"testbed setting {key}: expected a list of strings, got {value!r}")
        return
    args = typing.get_args(hint)  # X | None
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint)
    if value is None:
        if optional:
            return
        raise ValueError(f"testbed setting {key}: got null, expected {_type_name(base)}")
    if base is bool:
        ok = isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif base is str:
        ok = isinstance(value, str)
    else:  # pragma: no cover - every field has one of the types above
        ok = isinstance(value, base)
    if not ok:
        raise ValueError(f"testbed setting {key}: expected {_type_name(base)}, got {value!r}")


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))


def _range_text(key: str) -> str:
    low, high, low_in, high_in = _RANGES[key]
    parts = []
    if low is not None:
        parts.append(f"{low} {'<=' if low_in else '<'} ")
    parts.append(key)
    if high is not None:
        parts.append(f" {'<=' if high_in else '<'} {high}")
    return "".join(parts)


def check_config(cfg: TestbedConfig) -> None:
    """Types, ranges and cross-field rules of a config; raises ``ValueError`` naming the key and allowed range."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        _check_type(f.name, value)
        if f.name in _RANGES and value is not None:
            low, high, low_in, high_in = _RANGES[f.name]
            bad = (low is not None and (value < low if low_in else value <= low)) or (
                high is not None and (value > high if high_in else value >= high)
            )
            if bad:
                raise ValueError(f"testbed setting {f.name}={value!r} out of range: allowed {_range_text(f.name)}")
    if cfg.neutral_optimizer not in NEUTRAL_OPTIMIZERS:
        raise ValueError(
            f"testbed setting neutral_optimizer={cfg.neutral_optimizer!r}: allowed {list(NEUTRAL_OPTIMIZERS)}"
        )
    if cfg.neutral_optimizer == "separate" and cfg.grad_accum != 1:
        raise ValueError("testbed setting neutral_optimizer='separate' needs grad_accum=1")
    if cfg.leak_audit_target not in AUDIT_TARGETS:
        raise ValueError(f"testbed setting leak_audit_target={cfg.leak_audit_target!r}: allowed {list(AUDIT_TARGETS)}")
    if cfg.budget * cfg.num_groups > 1:
        raise ValueError(
            f"testbed setting budget={cfg.budget}: {cfg.num_groups} disjoint masks need budget <= {1 / cfg.num_groups:.4f}"
        )
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(
            f"testbed setting hidden_size={cfg.hidden_size} must be a multiple of num_heads={cfg.num_heads}"
        )
    # people asked for per field and side vs target profiles on that side (3 groups per side)
    per_side = 3 * cfg.profiles_per_group
    validation = cfg.validation_people or 0
    for side, extra in (("forget", 0), ("retain", cfg.retain_eval_people)):
        wanted = (cfg.people_per_field or 1) + extra + validation
        if wanted > per_side:
            raise ValueError(
                f"testbed settings ask for {wanted} {side} people per field (people_per_field + "
                f"{'retain_eval_people + ' if extra else ''}validation_people) but profiles_per_group="
                f"{cfg.profiles_per_group} gives {per_side} {side}-side profiles: allowed people_per_field + "
                f"{'retain_eval_people + ' if extra else ''}validation_people <= 3 * profiles_per_group"
            )


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
        weight_decay=0.0,
        qa_tune_steps=5,
        memorization_prompts=8,
        retain_eval_people=1,
        validation_people=1,
        fit_people=True,  # the tiny smoke population: take the largest split sizes its memorization allows
        leak_audit_composite_samples=50_000,
        notes=[
            "smoke: 2 profiles per group; 10% of the whole model per group (the six masks cover ~90% of the "
            "eligible scalars; paper: 5%) so the build takes minutes",
            "only the last layer is kept out of the masks (paper: two): with 4 layers, two would leave half the "
            "network unable to store facts",
            "no neutral micro-batches and weight decay 0 during injection (the pre-v2 regime, kept for the "
            "tests' build time and the bit-identity test): weights outside every mask stay bit-identical, so "
            "the leak audit's unified / forget targets read the ground truth; only forget_vs_retain is gated",
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
        pii_steps=6000,
        pii_batch=6,
        pii_lr=5e-3,
        neutral_every=8,
        neutral_batch=8,
        neutral_lr_scale=0.05,
        neutral_optimizer="separate",
        weight_decay=0.01,
        memorization_prompts=8,
        retain_eval_people=2,
        robustness_people=6,
        fit_people=True,
        notes=[
            "LACUNA's regime on CPU (issue 19): neutral micro-batches trained unmasked (one after every 8 PII "
            "micro-batches) and AdamW weight decay on every weight, with two deviations measured on this machine "
            "(docs/testbeds.md 'Measured', benchmarks/bench_memorization_curve.py): (1) neutral and PII steps keep "
            "separate AdamW moments and neutral steps train at 0.05 x the PII rate (the feasibility prototype's "
            "two optimizers): with one shared AdamW the neutral momentum moves every weight at the PII rate after "
            "each neutral step, and 48 people reached 0-15% extractable after 3,600 PII micro-batches; separate "
            "moments on this preset's data: 36 people 7% (1,000), 43% (2,000), 71% (3,000), 78% (4,000) "
            "extractable by 4 fresh questions; (2) weight decay 0.01, not 0.1: decoupled decay removes lr x wd per "
            "step, and at the mini's peak lr 5e-3 over ~6,800 steps 0.1 would shrink an untrained weight by ~90% "
            "(LACUNA's 0.1 at 1.5e-4: <= ~11%, the total 0.01 gives here); 0.1 raised the held-out neutral loss "
            "from 1.68 to 2.35 in 900 PII micro-batches",
            "9% of the whole model per group (the six masks cover ~90% of the eligible scalars; paper: 5%) "
            "and 6 profiles per group: at 5% and 10 per group the model memorized ~5% of facts in 2,400 steps "
            "(9.5 min); the ground truth stays exact, but a random scalar is in some mask with probability ~0.9; "
            "the issue's 20 forget / 20 retain / 10 retain-eval people per field were not reached within 20 "
            "minutes (people-vs-minutes curve in docs/testbeds.md)",
            "only the last layer is kept out of the masks (paper: two): with 4 layers, two would leave half the "
            "network unable to store facts",
            "80% of injected documents are QA text (LACUNA: 2.0B of 7.7B tokens); the base stage is the neutral "
            "pretraining; 2 held-out retain-eval people per field (fewer if memorization leaves fewer)",
        ],
    ),
    "standard": TestbedConfig(
        name="standard",
        profiles_per_group=175,  # LACUNA: 1,200 profiles, 150 held out for QA tuning, 6 groups
        distractor_profiles=400,
        bios_per_person=8,
        qa_per_field=25,
        varied_qa_per_field=16,
        qa_block=2,
        faq_fraction=0.6,
        lorem_paragraphs=20000,
        vocab_size=8192,
        hidden_size=1024,
        num_layers=16,
        num_heads=16,
        intermediate_size=4096,
        seq_len=512,
        base_steps=4000,
        base_batch=32,
        base_lr=1e-3,
        budget=0.05,
        skip_last=2,
        pii_steps=30000,
        pii_batch=16,
        pii_lr=5e-4,
        neutral_every=2,
        neutral_batch=8,
        neutral_lr_scale=1.0,
        grad_accum=4,
        warmup_ratio=0.1,
        weight_decay=0.1,
        qa_tune_steps=300,
        qa_tune_lr=1.5e-4,
        qa_tune_batch=64,
        memorization_prompts=20,
        people_per_field=100,
        retain_eval_people=30,
        validation_people=25,
        robustness_people=30,
        leak_audit_composite_samples=2_000_000,
        notes=[
            "standard: LACUNA's geometry (5% of the whole model per group, last two layers outside the masks, "
            "100 forget / 100 retain / 30 retain-eval people per field, neutral text unmasked, AdamW wd 0.1) on a "
            "~290M-parameter Olmo2 built from a config; one GPU; not yet measured on a GPU",
            "neutral micro-batches of 8 x 512 tokens after every 2 PII micro-batches of 16 documents: ~52% of the "
            "injected tokens are neutral (LACUNA: 4.3B of 7.7B tokens)",
            "estimated 2-3 h on one A100-class GPU (~3e17 training FLOPs in fp32/TF32 plus the memorization test); "
            "not measured",
        ],
    ),
    "lacuna": TestbedConfig(
        name="lacuna",
        profiles_per_group=175,
        bios_per_person=8,
        qa_per_field=25,
        base_steps=0,
        pii_lr=1.5e-4,
        neutral_every=1,
        neutral_lr_scale=1.0,
        weight_decay=0.1,
        warmup_ratio=0.1,
        pii_steps=20000,
        grad_accum=8,
        qa_tune_steps=1000,
        qa_tune_lr=1.5e-4,
        memorization_prompts=100,
        people_per_field=100,
        retain_eval_people=30,
        validation_people=100,
        robustness_people=30,
        leak_audit_composite_samples=2_000_000,
        notes=[
            "paper hyper-parameters (docs/definitions.md#masked-continual-pretraining, #qa-tuning) for a real "
            "checkpoint given with --model; needs GPUs"
        ],
    ),
}


def get_preset(name: str, **overrides: Any) -> TestbedConfig:
    """A copy of preset ``name`` with ``overrides`` applied (each type- and range-checked)."""
    if name not in PRESETS:
        raise ValueError(f"unknown testbed preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else dataclasses.replace(PRESETS[name])
