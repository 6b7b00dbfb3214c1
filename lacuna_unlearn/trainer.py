"""Run one unlearning method on HF ``Trainer`` (+ accelerate): data, restriction, reference model, manifest.

:class:`UnlearnTrainer` only swaps the loss: the method computes it from ``{"forget", "retain"}``
batches. :func:`unlearn` is the whole job: it loads a local checkpoint, builds the paired data, applies
an optional gradient restriction (``forget_mask`` = OracleGrad with GradDiff), trains, verifies that
restricted scalars did not move, and writes an HF checkpoint plus ``unlearn_manifest.json``
atomically (``OUT.partial`` renamed at the end). ``lora=LoraSettings(...)`` trains adapters instead of the
weights and merges them before saving; ``eval_rows`` holds out QA rows whose loss picks the best checkpoint
(the relearning attack's protocol, spec §1.11).
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from lacuna_metrics.manifest import hardware, package_versions, write_json
from lacuna_metrics.masks import MaskSet
from lacuna_unlearn.lora import LoraSettings
from lacuna_unlearn.methods import Method
from lacuna_unlearn.unlearn_data import ForgetRetainDataset, QADataset, collate_forget_retain

__all__ = ["TrainConfig", "UnlearnTrainer", "unlearn"]

UNLEARN_PACKAGES = ("lacuna-bench", "torch", "transformers", "accelerate", "peft")


class UnlearnTrainer(Trainer):
    """HF ``Trainer`` whose loss is the unlearning method's (OpenUnlearning's ``compute_loss`` contract)."""

    def __init__(self, *args: Any, method: Method, ref_model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.method = method
        self.ref_model = ref_model
        self.last_logs: dict[str, float] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss, logs = self.method.loss(model, inputs, self.ref_model)
        self.last_logs = logs
        return (loss, {}) if return_outputs else loss  # {}: no logits for Trainer.prediction_step


@dataclass
class TrainConfig:
    """Optimisation settings (OpenUnlearning ``trainer.args`` names)."""

    learning_rate: float = 1e-5
    num_train_epochs: float = 1.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    weight_decay: float = 0.0
    lr_scheduler_type: str = "constant"
    warmup_steps: float = 0  # an int, or a float < 1 = ratio of the total steps (transformers 5)
    max_length: int = 256
    seed: int = 42
    max_steps: int = -1
    extra: dict[str, Any] = field(default_factory=dict)  # any other TrainingArguments


def _checkpointing_args(extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` with ``gradient_checkpointing`` passed only when on, under transformers 5's name if it has one."""
    out = dict(extra)
    if out.pop("gradient_checkpointing", False):
        fields = TrainingArguments.__dataclass_fields__
        out["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = True
    return out


def unlearn(
    model_dir: str | Path,
    forget_rows: Sequence[Mapping[str, Any]],
    retain_rows: Sequence[Mapping[str, Any]],
    method: Method,
    out_dir: str | Path,
    *,
    train: TrainConfig | None = None,
    restrict: str = "none",
    masks: MaskSet | None = None,
    method_name: str = "",
    data_fingerprint: str = "",
    force: bool = False,
    config: Mapping[str, Any] | None = None,
    lora: LoraSettings | None = None,
    eval_rows: Sequence[Mapping[str, Any]] | None = None,
    eval_steps: int = 25,
) -> Path:
    """Unlearn ``forget_rows`` from the checkpoint at ``model_dir``; return the output directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_unlearn.restrict import apply_restriction, intersect, param_groups, parse_restriction, restriction_stats
    from lacuna_unlearn.restrict import verify_unchanged as check_unchanged

    train = train or TrainConfig()
    out = Path(out_dir)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force / force=true) to overwrite")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.time()
    torch.manual_seed(train.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
    prepare = getattr(method, "prepare", None)
    if callable(prepare):  # e.g. JensUn tokenizes its refusal string
        prepare(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    forget = QADataset(forget_rows, tokenizer, train.max_length, name="forget")
    retain = QADataset(retain_rows, tokenizer, train.max_length, name="retain") if method.needs_retain else None

    restriction = parse_restriction(restrict)
    if lora is not None and restriction.kind != "none":
        raise ValueError(f"restrict={restrict!r} cannot be combined with LoRA: masks select base weights, not adapters")
    collate = collate_forget_retain(pad_id)
    resolved = restriction.resolve(model, masks)
    ref_model = None
    if method.needs_reference:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    if lora is not None:
        model = lora.wrap(model)
        if train.extra.get("gradient_checkpointing") or train.extra.get("activation_checkpointing"):
            model.enable_input_require_grads()  # adapters behind frozen embeddings still need grads to flow
        resolved = {n: None for n, p in model.named_parameters() if p.requires_grad}  # the adapters
    located = method.locate(model, forget, retain, collate)  # WAGLE / MemFlex: the method's own localisation
    if located is not None:
        resolved = intersect(resolved, located)
    checked = restriction.kind != "none" or located is not None
    before = {n: p.detach().clone() for n, p in model.named_parameters()} if checked else None
    handle = apply_restriction(model, resolved)
    evaluation = QADataset(eval_rows, tokenizer, train.max_length, name="eval") if eval_rows else None
    holdout = (
        {
            "eval_strategy": "steps",
            "eval_steps": eval_steps,
            "save_strategy": "steps",
            "save_steps": eval_steps,
            "save_total_limit": 1,
            "load_best_model_at_end": True,
            "metric_for_best_model": "eval_loss",
            "greater_is_better": False,
            "save_only_model": True,
            "prediction_loss_only": True,
            "label_names": ["forget"],  # nested batches: tells Trainer the loss is computable in evaluation
        }
        if evaluation is not None
        else {"save_strategy": "no"}
    )

    args = TrainingArguments(
        output_dir=str(partial / "trainer"),
        learning_rate=train.learning_rate,
        num_train_epochs=train.num_train_epochs,
        max_steps=train.max_steps,
        per_device_train_batch_size=train.per_device_train_batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        weight_decay=train.weight_decay,
        lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_steps,
        seed=train.seed,
        remove_unused_columns=False,  # batches are nested {"forget": ..., "retain": ...}
        report_to=[],
        logging_steps=1,
        use_cpu=not torch.cuda.is_available(),
        dataloader_pin_memory=False,
        **{**holdout, **_checkpointing_args(train.extra)},  # any TrainingArguments the config names win
    )
    if lora is None:
        groups = param_groups(model, resolved, train.weight_decay)
    else:  # only the adapters train
        trainable = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": trainable, "weight_decay": float(train.weight_decay)}]
    optimizer = torch.optim.AdamW(
        groups, lr=train.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon
    )
    trainer = UnlearnTrainer(
        model=model,
        args=args,
        train_dataset=ForgetRetainDataset(forget, retain),
        eval_dataset=ForgetRetainDataset(evaluation, None) if evaluation is not None else None,
        data_collator=collate,
        optimizers=(optimizer, None),
        method=method,
        ref_model=ref_model,
    )
    if ref_model is not None:
        ref_model.to(args.device)
    try:
        result = trainer.train()
        handle.remove()
        moved = check_unchanged(before, trainer.model, resolved) if before is not None else []
        if moved:
            raise RuntimeError(f"restriction {restrict!r} violated: out-of-mask scalars changed in {moved[:5]}")
        stats = restriction_stats(trainer.model, resolved)
        if lora is not None:
            model = lora.merge(trainer.model)
        if trainer.is_world_process_zero():
            partial.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial / "trainer", ignore_errors=True)
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            losses = [h for h in trainer.state.log_history if "loss" in h]
            write_json(
                partial / "unlearn_manifest.json",
                {
                    "method": method_name or type(method).__name__,
                    "config": dict(config) if config is not None else None,
                    "method_args": asdict(method),
                    "train": asdict(train),
                    "restrict": restrict,
                    "lora": asdict(lora) if lora is not None else None,
                    "eval": {"rows": len(evaluation), "steps": eval_steps, "best": trainer.state.best_metric}
                    if evaluation is not None
                    else None,
                    "restriction": stats,
                    "located": None
                    if located is None
                    else {"parameters": len(located), **(getattr(method, "location", None) or {})},
                    "out_of_mask_unchanged": before is not None,
                    "model": str(model_dir),
                    "data": {
                        "forget": len(forget),
                        "retain": len(retain) if retain else 0,
                        "fingerprint": data_fingerprint,
                    },
                    "seed": train.seed,
                    "processes": args.world_size,
                    "steps": trainer.state.global_step,
                    "train_loss": result.training_loss,
                    "final_log": losses[-1] if losses else None,
                    "last_method_logs": trainer.last_logs,
                    "versions": package_versions(UNLEARN_PACKAGES),
                    "hardware": hardware(),
                    "wall_seconds": round(time.time() - started, 2),
                },
            )
            if out.exists():
                shutil.rmtree(out)
            partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out
