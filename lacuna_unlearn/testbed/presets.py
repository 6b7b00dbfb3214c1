"""Testbed presets: every knob of the testbed builder as one dataclass, ``TestbedConfig`` (docs/testbeds.md).

The presets are YAML files in ``presets/testbed/`` holding only what differs from the dataclass defaults.
``smoke`` is built once per test session (minutes, mechanics only: small model, few profiles per group,
larger masks). ``mini`` is the embedded default of the demo: a CPU miniature of LACUNA's regime (neutral
text trained unmasked between PII micro-batches, AdamW weight decay, masked PII gradients; see each preset's
``notes`` for deviations and the numbers behind them). ``standard`` is LACUNA's geometry (5% per group, the
last two layers outside the masks, 100 forget / 100 retain people per field) on a few-hundred-million-
parameter model for one GPU. ``lacuna`` carries the paper's hyper-parameters
(docs/definitions.md#masked-continual-pretraining, #qa-tuning) for real checkpoints passed with ``--model``.

Every override (``--set key=value``, :func:`lacuna_unlearn.dataclass_config.parse_overrides`) is checked against the
field's type and allowed range before anything is built (:meth:`TestbedConfig.replace`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from lacuna_unlearn.dataclass_config import (
    apply_settings,
    check_value,
    preset_names,
    preset_path,
    read_yaml,
    structured,
)

__all__ = [
    "AUDIT_TARGETS",
    "NEUTRAL_OPTIMIZERS",
    "PRESETS",
    "STEP_MIXES",
    "TestbedConfig",
    "check_config",
    "get_preset",
]

#: Leak-audit targets a build can be gated on: the localization scorer's targets, or ``all`` of them.
AUDIT_TARGETS = ("all", "forget", "unified", "forget_vs_retain")
#: What one optimizer step of the injection holds (docs/testbeds.md 'Injection regime'): ``interleaved`` (one group's
#: PII micro-batch, or neutral text, per micro-batch, ``grad_accum`` micro-batches per step) or ``all_groups``
#: (LACUNA's: one PII micro-batch of every group plus ``neutral_per_step`` neutral ones in every step).
STEP_MIXES = ("interleaved", "all_groups")
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
    # "interleaved": the plan above (neutral_every, grad_accum); "all_groups": every optimizer step accumulates one PII
    # micro-batch of every group plus neutral_per_step neutral ones (LACUNA's step; grad_accum and neutral_every unused)
    step_mix: str = "interleaved"
    neutral_per_step: int = 1  # all_groups only
    # interleaved only: each cycle of the groups also holds one micro-batch of neutral text whose gradient reaches only
    # the eligible scalars outside every mask (a seventh "group": they train like masked scalars, on neutral text)
    outside_slot: bool = False
    # rows of neutral text in an outside-slot micro-batch (None: neutral_batch); about a PII micro-batch's tokens
    # gives the outside scalars a gradient as noisy as the masked ones' (docs/testbeds.md 'The magnitude trace')
    outside_batch: int | None = None
    # neutral micro-batches' loss (so gradient) times this; in all_groups steps a small scale leaves the masked
    # scalars' Adam update to their PII gradient while every unmasked scalar is still stepped (docs/testbeds.md)
    neutral_loss_scale: float = 1.0
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
    # leak audit (lacuna_metrics.localization.leak_audit): the build fails if a method-free detector beats this on the
    # target; "all": every target (forget, unified, forget_vs_retain), LACUNA's check that the weights hide the masks
    leak_audit: bool = True
    leak_audit_max_auc: float = 0.60
    leak_audit_target: str = "all"
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
        return dataclasses.replace(self, **{key: _check_type(key, value) for key, value in changes.items()})


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
    "outside_batch": (1, None, True, False),
    "grad_accum": (1, None, True, False),
    "neutral_per_step": (0, None, True, False),
    "neutral_loss_scale": (0, 1, False, True),
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


def _check_type(key: str, value: Any) -> Any:
    """``value`` if it fits the field's declared type (ints become floats for a number); else a one-line error
    naming ``key``."""
    return check_value(f"testbed setting {key}", typing.get_type_hints(TestbedConfig)[key], value)


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
    if cfg.step_mix not in STEP_MIXES:
        raise ValueError(f"testbed setting step_mix={cfg.step_mix!r}: allowed {list(STEP_MIXES)}")
    if cfg.step_mix == "all_groups":
        if cfg.neutral_optimizer != "shared":
            raise ValueError(
                "testbed setting step_mix='all_groups' needs neutral_optimizer='shared' (every step holds PII and "
                "neutral micro-batches: one AdamW state)"
            )
        if cfg.grad_accum != 1:
            raise ValueError(
                f"testbed setting step_mix='all_groups' sets the accumulation itself (num_groups + neutral_per_step "
                f"micro-batches per step): leave grad_accum at 1, got {cfg.grad_accum}"
            )
        if cfg.outside_slot:
            raise ValueError(
                "testbed setting outside_slot=true is for step_mix='interleaved' (all_groups steps every scalar "
                "already): set outside_slot=false"
            )
    if cfg.outside_batch is not None and not cfg.outside_slot:
        raise ValueError(f"testbed setting outside_batch={cfg.outside_batch} needs outside_slot=true")
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


def _load(name: str) -> TestbedConfig:
    """Preset ``name``: ``presets/testbed/NAME.yaml`` merged onto the structured :class:`TestbedConfig`."""
    from omegaconf import OmegaConf

    cfg = structured("testbed", TestbedConfig)
    cfg.name = name
    file = preset_path("testbed", name)
    apply_settings(cfg, read_yaml(file, "testbed preset"), kind="testbed", where=str(file))
    return TestbedConfig(**OmegaConf.to_container(cfg, resolve=True))


#: Every testbed preset by name; read on first use (``__getattr__``).
PRESETS: dict[str, TestbedConfig]


def __getattr__(name: str) -> Any:
    """``PRESETS``: every testbed preset (``presets/testbed/*.yaml`` over the :class:`TestbedConfig` defaults), read
    on first use so importing the dataclass stays cheap."""
    if name == "PRESETS":
        globals()["PRESETS"] = {n: _load(n) for n in preset_names("testbed")}
        return globals()["PRESETS"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_preset(name: str, **overrides: Any) -> TestbedConfig:
    """A copy of preset ``name`` with ``overrides`` applied (each type- and range-checked)."""
    presets = __getattr__("PRESETS")
    if name not in presets:
        raise ValueError(f"unknown testbed preset {name!r}; known: {sorted(presets)}")
    return presets[name].replace(**overrides) if overrides else dataclasses.replace(presets[name])
