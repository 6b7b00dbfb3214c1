"""Run one unlearning method on HF ``Trainer`` (+ accelerate): data, restriction, reference model, manifest.

:class:`UnlearnTrainer` only swaps the loss: the method computes it from ``{"forget", "retain"}``
batches. :func:`unlearn` is the whole job: it loads a local checkpoint, builds the paired data, applies
an optional gradient restriction (``forget_mask`` = OracleGrad with GradDiff), trains, verifies that
restricted scalars did not move, and writes an HF checkpoint plus ``unlearn_manifest.json``
atomically (``OUT.partial`` renamed at the end). ``lora=LoraSettings(...)`` trains adapters instead of the
weights and merges them before saving; ``eval_rows`` holds out QA rows whose loss picks the best checkpoint
(the relearning attack's protocol, docs/definitions.md#lacuna-relearning). ``freeze_embeddings=True`` keeps the input
embeddings out of the optimizer and checks they come out bit-identical (LACUNA's relearning freezes ``embed_tokens``,
docs/definitions.md#masked-continual-pretraining; the ``attack=relearn*`` presets turn it on). ``append_eos`` ends every
labelled answer with EOS (OpenUnlearning and LACUNA; :func:`lacuna_unlearn.qa.unlearn_data.encode_qa`). The manifest
records both. ``train.eval_every`` evaluates the model on the validation people every N optimizer steps and saves the
best step by ``train.best_by`` (:mod:`lacuna_unlearn.trainer.evaluation`); ``train.report_to`` names the experiment
trackers the Trainer logs to (none by default, :mod:`lacuna_unlearn.trainer.reporting`).

Distributed (``docs/distributed.md``): DDP as is; FSDP2 (``accelerate launch --use_fsdp --fsdp_version 2``)
with restrictions exact on the sharded DTensor parameters (masks cut to each rank's shard, checked on the
gathered weights after the run); FSDP1 only without a restriction (its FlatParameters have no per-parameter
gradients to mask), and LoRA not under FSDP. The optimizer is built inside the Trainer (``create_optimizer``),
so accelerate can shard it.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from lacuna_metrics import MaskSet, build_manifest, write_json
from lacuna_tasks import probe_prompt
from lacuna_unlearn.lora import LoraSettings
from lacuna_unlearn.methods import Method
from lacuna_unlearn.qa.encoding import leading_special_ids
from lacuna_unlearn.qa.unlearn_data import ForgetRetainDataset, QADataset, collate_forget_retain, eos_appended
from lacuna_unlearn.trainer.evaluation import BestCheckpoint, validation_leak, validation_loss
from lacuna_unlearn.trainer.reporting import resolve_report_to
from lacuna_unlearn.trainer.restrict import exempt_from_decay
from lacuna_unlearn.trainer.schedule import check_min_lr_ratio, warmup_cosine_factor
from lacuna_unlearn.trainer.selection import check_evaluation

__all__ = ["TrainConfig", "UnlearnTrainer", "freeze_input_embeddings", "unlearn"]


class UnlearnTrainer(Trainer):
    """HF ``Trainer`` whose loss is the unlearning method's (OpenUnlearning's ``compute_loss`` contract).

    ``param_groups``: AdamW parameter groups of the unwrapped model (e.g. :func:`restrict.param_groups`, which
    gives restricted parameters ``weight_decay=0``); the optimizer is created from them in ``create_optimizer``,
    i.e. where HF Trainer creates its own, so that accelerate can prepare it under FSDP (which refuses a
    ready-made ``optimizers=`` pair). ``grad_masks``: the restriction's per-parameter masks, applied to the
    sharded gradients after every backward when the model is FSDP2-sharded (the restriction's hooks live on
    the unsharded parameters, which FSDP replaces).

    Weight decay skips biases and norms, as HF Trainer's own grouping does (``get_decay_parameter_names``;
    :func:`~lacuna_unlearn.trainer.restrict.exempt_from_decay`), whatever groups are given. ``min_lr_ratio``: with
    ``lr_scheduler_type`` ``cosine``, LACUNA's schedule (:func:`~lacuna_unlearn.trainer.schedule.warmup_cosine_factor`:
    no step at learning rate 0, cosine down to this share of the peak at the last step) instead of HF's; None keeps
    HF's scheduler.
    """

    def __init__(
        self,
        *args: Any,
        method: Method,
        ref_model: torch.nn.Module | None = None,
        param_groups: list[dict[str, Any]] | None = None,
        grad_masks: Mapping[str, torch.Tensor | None] | None = None,
        frozen: Sequence[torch.nn.Parameter] = (),
        min_lr_ratio: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.min_lr_ratio = check_min_lr_ratio(min_lr_ratio, self.args.lr_scheduler_type)
        self.method = method
        self.ref_model = ref_model
        self.last_logs: dict[str, float] = {}
        self._param_groups = param_groups
        self._frozen = list(frozen)  # parameters the optimizer must not hold (frozen input embeddings)
        self._grad_masks = {n: m for n, m in (grad_masks or {}).items() if m is not None}
        self._shard_drops: list[tuple[torch.nn.Parameter, torch.Tensor]] | None = None

    @property
    def fsdp_version(self) -> int | None:
        """1 or 2 when accelerate shards the model with FSDP, else None."""
        if not self.is_fsdp_enabled:
            return None
        return int(getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) or 1)

    def create_optimizer(self, model=None):  # noqa: ANN001, ANN201
        if self.optimizer is None:
            opt_model = self.model if model is None else model
            groups = self._param_groups
            if groups is None or opt_model is not self.model:  # FSDP1 builds it on the wrapped model
                trainable = [p for p in opt_model.parameters() if p.requires_grad]
                groups = [{"params": trainable, "weight_decay": float(self.args.weight_decay)}]
            groups = exempt_from_decay(groups, opt_model, set(self.get_decay_parameter_names(opt_model)))
            self.optimizer = torch.optim.AdamW(
                groups,
                lr=self.args.learning_rate,
                betas=(self.args.adam_beta1, self.args.adam_beta2),
                eps=self.args.adam_epsilon,
            )
            held = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
            if any(id(p) in held for p in self._frozen):  # AdamW's weight decay alone would move them
                raise RuntimeError("a frozen parameter (the input embeddings) reached the optimizer")
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):  # noqa: ANN001, ANN201
        if self.lr_scheduler is None and self.min_lr_ratio is not None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            warmup, floor = self.args.get_warmup_steps(num_training_steps), self.min_lr_ratio

            def factor(step: int) -> float:
                return warmup_cosine_factor(step, warmup=warmup, total=num_training_steps, floor=floor)

            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            self._created_lr_scheduler = True
        return super().create_scheduler(num_training_steps, optimizer)

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._grad_masks and self.fsdp_version == 2:
            if self._shard_drops is None:
                from lacuna_unlearn.trainer.restrict import shard_masks

                self._shard_drops = shard_masks(self.model, self._grad_masks)
            from lacuna_unlearn.trainer.restrict import mask_gradients

            mask_gradients(self._shard_drops)  # before clipping and the optimizer step, like the hooks
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss, logs = self.method.loss(model, inputs, self.ref_model)
        self.last_logs = logs
        return (loss, {}) if return_outputs else loss  # {}: no logits for Trainer.prediction_step


#: How snapshot steps are spread over a schedule (``trainer.args.snapshot_spacing``).
SNAPSHOT_SPACINGS = ("linear", "log")


def snapshot_steps(total: int, count: int, spacing: str = "linear", extra: Sequence[int] = ()) -> list[int]:
    """The optimizer steps a schedule of ``total`` steps keeps: ``count`` of them evenly spaced (``linear``) or
    geometrically spaced from step 1 (``log``: dense early, where a forget leak falls), the last step included, plus
    the ``extra`` steps within the schedule."""
    if spacing not in SNAPSHOT_SPACINGS:
        raise ValueError(f"trainer.args.snapshot_spacing must be one of {SNAPSHOT_SPACINGS}, got {spacing!r}")
    total = max(1, int(total))
    steps: set[int] = set()
    if count > 0:
        if spacing == "linear":
            steps = {max(1, round(total * k / count)) for k in range(1, count + 1)}
        else:
            steps = {max(1, round(total ** (k / count))) for k in range(1, count + 1)} | {total}
    return sorted(steps | {int(s) for s in extra if 1 <= int(s) <= total})


class SnapshotCallback(TrainerCallback):
    """Saves the model at the optimizer steps of :func:`snapshot_steps` under ``root/step-N``, so a method can be read
    at matched forgetting or at a stopping point chosen on validation people instead of at the end of an arbitrary
    schedule (docs/report.md)."""

    def __init__(
        self,
        count: int,
        save: Callable[[Path], None],
        root: Path,
        *,
        spacing: str = "linear",
        extra: Sequence[int] = (),
    ) -> None:
        self.count, self.save, self.root, self.spacing, self.extra = count, save, root, spacing, list(extra)
        self.steps: set[int] = set()

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - TrainerCallback hook
        self.steps = set(snapshot_steps(int(state.max_steps), self.count, self.spacing, self.extra))

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - TrainerCallback hook
        if state.global_step in self.steps and state.is_world_process_zero:
            self.save(self.root / f"step-{state.global_step:06d}")


class StopAtStep(TrainerCallback):
    """Stops training after optimizer step ``step``: the model at a stopping point, reached on the learning rates of
    the full schedule (a shorter ``max_steps`` would compress the schedule instead)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - TrainerCallback hook
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


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
    min_lr_ratio: float | None = None  # cosine only: LACUNA's schedule down to this share of the peak (None: HF's)
    max_length: int = 256
    seed: int = 42
    max_steps: int = -1
    snapshots: int = 0  # checkpoints kept under OUT/snapshots/step-N (trade-off curves, stopping points)
    snapshot_spacing: str = "linear"  # or "log": dense early (snapshot_steps)
    snapshot_steps: list[int] = field(default_factory=list)  # also keep these steps
    stop_at_step: int = 0  # > 0: stop after this step, on the full schedule's learning rates
    report_to: str | list[str] = "none"  # HF integrations (tensorboard, wandb, trackio ...); reporting.py
    logging_dir: str | None = None  # TensorBoard's event files (None: $TENSORBOARD_LOGGING_DIR, else OUT/logs)
    eval_every: int = 0  # > 0: evaluate on the validation people every N optimizer steps, keep the best step
    best_by: str = "validation_leak"  # the criterion of that choice (selection.BEST_BY)
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
    freeze_embeddings: bool = False,
    append_eos: bool = True,
    validation_rows: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Unlearn ``forget_rows`` from the checkpoint at ``model_dir``; return the output directory.

    ``validation_rows``: the validation people's QA rows that ``train.eval_every`` evaluates on (the saved model is
    then the best evaluated step's by ``train.best_by``, :mod:`lacuna_unlearn.trainer.evaluation`).
    ``freeze_embeddings``: the input embeddings stay frozen (out of the optimizer, checked bit-identical after
    training; a tied LM head is frozen with them), as LACUNA's relearning; the relearning attacks set it.
    ``append_eos``: labels end with the tokenizer's EOS after `` answer\\n`` (OpenUnlearning/LACUNA; none if the
    tokenizer has no EOS token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_unlearn.trainer.restrict import (
        apply_restriction,
        intersect,
        param_groups,
        parse_restriction,
        restriction_stats,
    )
    from lacuna_unlearn.trainer.restrict import verify_unchanged as check_unchanged

    train = train or TrainConfig()
    out = Path(out_dir)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force / force=true) to overwrite")
    report = _reporting(train)
    _check_evaluation(train, validation_rows, eval_rows)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.time()
    torch.manual_seed(train.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:  # checked before the model loads
        raise ValueError(
            f"{model_dir}: the tokenizer has neither an EOS nor a pad token; unlearning pads its batches with one "
            "(add an EOS token to the tokenizer and save it with the checkpoint)"
        )
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
    frozen = freeze_input_embeddings(model) if freeze_embeddings else None  # before the restriction picks parameters
    method.prepare(tokenizer)  # e.g. JensUn and IdkDPO tokenize their refusal string
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    forget = QADataset(forget_rows, tokenizer, train.max_length, name="forget", append_eos=append_eos)
    retain = (
        QADataset(retain_rows, tokenizer, train.max_length, name="retain", append_eos=append_eos)
        if method.needs_retain
        else None
    )
    alternate_ids = method.alternate_answer_ids()  # IdkDPO: its refusal side, encoded once here, not every step
    labels_info = {
        "append_eos": bool(append_eos),
        "eos_token_id": tokenizer.eos_token_id,
        "eos_appended": eos_appended(tokenizer, append_eos),  # false when the tokenizer has no EOS token
        "leading_special_ids": leading_special_ids(tokenizer, probe_prompt("")),  # BOS before every prompt, if any
    }

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
        if frozen is not None:
            adapted = [n for n, p in model.get_input_embeddings().named_parameters() if p.requires_grad]
            if adapted:
                raise ValueError(
                    f"freeze_embeddings=true, but LoRA adapts the input embeddings ({adapted[:3]}): drop them from "
                    "lora.target_modules or set freeze_embeddings=false"
                )
    located = method.locate(model, forget, retain, collate)  # WAGLE / MemFlex: the method's own localisation
    if located is not None:
        resolved = intersect(resolved, located)
    checked = restriction.kind != "none" or located is not None
    before = {n: p.detach().clone() for n, p in model.named_parameters()} if checked else None
    handle = apply_restriction(model, resolved)
    evaluation = (
        QADataset(eval_rows, tokenizer, train.max_length, name="eval", append_eos=append_eos) if eval_rows else None
    )
    validation = (
        QADataset(validation_rows, tokenizer, train.max_length, name="validation", append_eos=append_eos)
        if train.eval_every
        else None
    )
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
        report_to=report,
        logging_steps=1,
        use_cpu=not torch.cuda.is_available(),
        dataloader_pin_memory=False,
        # the trackers' run name: the output directory's (a set trainer.args.run_name wins, as any named argument)
        **{"run_name": out.name, **holdout, **_checkpointing_args(train.extra)},
    )
    args.report_to = report  # exactly what was named: transformers adds kubeflow by itself inside a Kubeflow job
    if lora is None:
        groups = param_groups(model, resolved, train.weight_decay)
    else:  # only the adapters train
        trainable = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": trainable, "weight_decay": float(train.weight_decay)}]
    stats = restriction_stats(model, resolved)  # on the unwrapped model: FSDP renames and flattens parameters
    trainer = UnlearnTrainer(
        model=model,
        args=args,
        train_dataset=ForgetRetainDataset(forget, retain, _alternate(forget, alternate_ids)),
        eval_dataset=ForgetRetainDataset(evaluation, None, _alternate(evaluation, alternate_ids))
        if evaluation is not None
        else None,
        data_collator=collate,
        method=method,
        ref_model=ref_model,
        param_groups=groups,
        grad_masks=resolved,
        frozen=[frozen["weight"]] if frozen is not None else (),
        min_lr_ratio=train.min_lr_ratio,
    )
    logging_dir = _point_tensorboard(trainer, train, report, partial, out)
    if ref_model is not None:
        ref_model.to(args.device)
    if int(train.stop_at_step) < 0:
        raise ValueError(f"trainer.args.stop_at_step must be >= 0, got {train.stop_at_step!r}")
    if train.stop_at_step:
        trainer.add_callback(StopAtStep(int(train.stop_at_step)))
    extra_steps = list(train.snapshot_steps or [])
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in extra_steps):
        raise ValueError(f"trainer.args.snapshot_steps must be optimizer steps >= 1, got {extra_steps!r}")
    if train.snapshots or extra_steps:
        if int(train.snapshots) < 0:
            raise ValueError(f"trainer.args.snapshots must be >= 0, got {train.snapshots!r}")
        if train.snapshot_spacing not in SNAPSHOT_SPACINGS:
            raise ValueError(
                f"trainer.args.snapshot_spacing must be one of {SNAPSHOT_SPACINGS}, got {train.snapshot_spacing!r}"
            )
        if trainer.is_fsdp_enabled:
            raise ValueError("trainer.args.snapshots is not supported under FSDP (sharded weights)")

        def save_snapshot(path: Path) -> None:
            current = trainer.accelerator.unwrap_model(trainer.model)
            if lora is not None:  # a merged copy: the adapters keep training (costs one model copy, briefly)
                current = lora.merge(copy.deepcopy(current))
            current.save_pretrained(path)
            tokenizer.save_pretrained(path)

        trainer.add_callback(
            SnapshotCallback(
                int(train.snapshots), save_snapshot, partial / "snapshots", spacing=train.snapshot_spacing,
                extra=extra_steps,
            )
        )  # fmt: skip
    best = None
    if validation is not None:
        if trainer.is_fsdp_enabled:
            raise ValueError("trainer.args.eval_every is not supported under FSDP (sharded weights)")
        best = BestCheckpoint(
            train.eval_every,
            train.best_by,
            _criterion(train.best_by, tokenizer, validation_rows, validation, pad_id, args.per_device_eval_batch_size),
            trainer.log,
        )
        trainer.add_callback(best)  # after StopAtStep: the step it stops at is evaluated
    try:
        distributed = _distributed_setup(trainer, checked=checked, restrict=restrict, lora=lora is not None)
        result = trainer.train()
        kept = best.restore(trainer.model) if best is not None else None  # the checks below then read the kept step
        handle.remove()
        moved = check_unchanged(before, trainer.model, resolved) if before is not None else []
        if moved:
            raise RuntimeError(f"restriction {restrict!r} violated: out-of-mask scalars changed in {moved[:5]}")
        if frozen is not None:
            frozen["unchanged"] = None  # not checked under FSDP (sharded weights)
            if not trainer.is_fsdp_enabled:
                current = trainer.accelerator.unwrap_model(trainer.model).get_input_embeddings().weight
                if _digest(current) != frozen["sha256"]:
                    raise RuntimeError(f"freeze_embeddings: {frozen['parameter']} changed during training")
                frozen["unchanged"] = True
        adapters, checkpointing = None, _checkpointing_engaged(trainer.model)
        if lora is not None:
            adapters = _adapters_moved(trainer.model)
            model = lora.merge(trainer.model)
        # Sharded weights are gathered on every rank (a collective), then written by rank 0.
        full_state = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled else None
        if trainer.is_world_process_zero():
            partial.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial / "trainer", ignore_errors=True)
            model.save_pretrained(partial, state_dict=full_state)
            tokenizer.save_pretrained(partial)
            losses = [h for h in trainer.state.log_history if "loss" in h]
            write_json(
                partial / "unlearn_manifest.json",
                build_manifest(
                    method=method_name or type(method).__name__,
                    config=dict(config) if config is not None else None,
                    method_args=asdict(method),
                    train=asdict(train),
                    restrict=restrict,
                    freeze_embeddings={k: v for k, v in frozen.items() if k != "weight"} if frozen else None,
                    labels=labels_info,
                    lora=asdict(lora) if lora is not None else None,
                    lora_adapters=adapters,
                    activation_checkpointing=checkpointing,
                    reporting={"report_to": report, "logging_dir": logging_dir, "run_name": args.run_name},
                    eval={"rows": len(evaluation), "steps": eval_steps, "best": trainer.state.best_metric}
                    if evaluation is not None
                    else None,
                    best_checkpoint=None
                    if kept is None
                    else {
                        **kept,
                        "rows": len(validation),
                        "people": len({(str(r["ID"]), str(r["field"])) for r in validation_rows or ()}),
                        "final_step": trainer.state.global_step,
                    },
                    restriction=stats,
                    located=None
                    if located is None
                    else {"parameters": len(located), **(getattr(method, "location", None) or {})},
                    out_of_mask_unchanged=before is not None,
                    model=str(model_dir),
                    data={
                        "forget": len(forget),
                        "retain": len(retain) if retain else 0,
                        "fingerprint": data_fingerprint,
                    },
                    seed=train.seed,
                    processes=args.world_size,
                    distributed=distributed,
                    steps=trainer.state.global_step,
                    scheduled_steps=trainer.state.max_steps,  # the schedule's length (steps: where it stopped)
                    train_loss=result.training_loss,
                    final_log=losses[-1] if losses else None,
                    last_method_logs=trainer.last_logs,
                    wall_seconds=round(time.time() - started, 2),
                ),
            )
            if out.exists():
                shutil.rmtree(out)
            partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


def _reporting(train: TrainConfig) -> list[str]:
    """``train.report_to`` resolved (:func:`~lacuna_unlearn.trainer.reporting.resolve_report_to`) and checked against
    the integrations this transformers has; ``logging_dir`` only where TensorBoard writes."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    report = resolve_report_to(train.report_to, train.logging_dir)
    for name in report:
        if name not in INTEGRATION_TO_CALLBACK:
            raise ValueError(f"trainer.args.report_to: this transformers has no {name} integration (upgrade it)")
    return report


def _point_tensorboard(trainer: Trainer, train: TrainConfig, report: list[str], partial: Path, out: Path) -> str | None:
    """Where TensorBoard writes: ``train.logging_dir``, else ``$TENSORBOARD_LOGGING_DIR``, else ``OUT/logs`` (written
    as ``OUT.partial/logs``, renamed with the model; transformers' own default is under the trainer's scratch
    directory, deleted at the end). None without TensorBoard; else the path as it is after the run."""
    if "tensorboard" not in report:
        return None
    from transformers.integrations import TensorBoardCallback

    given = train.logging_dir or os.environ.get("TENSORBOARD_LOGGING_DIR")
    where = os.path.expanduser(given) if given else str(partial / "logs")
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = where
    return where if given else str(out / "logs")


def _check_evaluation(
    train: TrainConfig,
    validation_rows: Sequence[Mapping[str, Any]] | None,
    eval_rows: Sequence[Mapping[str, Any]] | None,
) -> None:
    """``train.eval_every`` / ``train.best_by`` checked before anything loads (:func:`check_evaluation`) and, when
    on, validation rows to compute the criterion on and no second best-checkpoint rule (an attack's held-out rows)."""
    if not check_evaluation(train.eval_every, train.best_by):
        return
    if eval_rows:
        raise ValueError(
            "trainer.args.eval_every: this run already keeps its best checkpoint by eval loss on held-out rows "
            "(attack=..., eval_fraction); set trainer.args.eval_every=0"
        )
    if not validation_rows:
        raise ValueError(
            f"trainer.args.best_by={train.best_by} needs the validation people's QA rows (the data's validation "
            "split for the run's field); none were given"
        )


def _criterion(
    name: str,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    data: QADataset,
    pad_id: int,
    batch_size: int,
) -> Callable[[torch.nn.Module], float]:
    """The measurement of ``trainer.args.best_by`` ``name`` on a model (:mod:`lacuna_unlearn.trainer.evaluation`)."""
    if name == "eval_loss":
        return lambda model: validation_loss(model, data, pad_id, batch_size=batch_size)
    if tokenizer.pad_token is None:  # prompts are batched with padding: EOS pads them, as in the training batches
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.pad_token = tokenizer.eos_token
    return lambda model: validation_leak(model, tokenizer, rows, batch_size=batch_size)


def _checkpointing_engaged(model: torch.nn.Module) -> bool:
    """Whether any layer of ``model`` runs with activation (gradient) checkpointing, as transformers tells it."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _adapters_moved(model: torch.nn.Module) -> dict[str, int]:
    """How many LoRA B matrices left their zero initialisation: with none, the adapters (and the merged model) are
    unchanged, the silent failure of LoRA under gradient checkpointing without input gradients (OpenUnlearning
    #178). Warns then; a schedule with no effective step (learning rate 0) can cause it too."""
    b = [p for n, p in model.named_parameters() if ".lora_B." in n]
    moved = sum(bool(p.detach().ne(0).any()) for p in b)
    if b and not moved:
        warnings.warn(
            f"LoRA: none of the {len(b)} B matrices moved from zero: the adapters trained nothing and the saved model "
            "equals the input",
            stacklevel=2,
        )
    return {"b_matrices": len(b), "b_moved": moved}


def _alternate(data: QADataset, answer_ids: Sequence[int] | None) -> QADataset | None:
    """``data`` with every answer replaced by ``answer_ids`` (None when the method wants no alternate answers)."""
    return data.with_answer(answer_ids) if answer_ids is not None else None


def _digest(weight: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes: a bit-for-bit comparison without keeping a copy (a 1B model's embeddings are
    hundreds of MB)."""
    import hashlib

    flat = weight.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest()  # hashes the buffer in place, no bytes copy


def freeze_input_embeddings(model: torch.nn.Module) -> dict[str, Any]:
    """Freeze ``model``'s input embeddings (``requires_grad=False``: no gradient, so no optimizer state), as LACUNA's
    relearning and masked pre-training freeze ``embed_tokens`` (docs/definitions.md#masked-continual-pretraining).
    Returns what the manifest records and what :func:`unlearn` checks after training: the parameter's name, whether the
    output embeddings are tied to it (then the LM head is frozen too, as in LACUNA's code) and its SHA-256; ``weight``
    is the parameter itself."""
    embeddings = model.get_input_embeddings()
    weight = getattr(embeddings, "weight", None)
    if not isinstance(weight, torch.nn.Parameter):
        raise ValueError(f"freeze_embeddings: {type(model).__name__} has no input embedding weight to freeze")
    weight.requires_grad_(False)
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    output = model.get_output_embeddings()
    tied = output is not None and getattr(output, "weight", None) is weight
    if tied:
        warnings.warn(
            "freeze_embeddings: the output embeddings are tied to the input ones, so the LM head is frozen too",
            stacklevel=2,
        )
    return {"parameter": names[0] if names else "", "tied_output": tied, "sha256": _digest(weight), "weight": weight}


def _distributed_setup(trainer: UnlearnTrainer, *, checked: bool, restrict: str, lora: bool) -> dict[str, Any]:
    """How accelerate runs this job (for the manifest); refuses, before training, what FSDP cannot do exactly."""
    state = trainer.accelerator.state
    version = trainer.fsdp_version
    if version == 1 and checked:
        raise ValueError(
            f"restrict={restrict!r} (or a method's own localisation) cannot be exact under FSDP1: it flattens "
            "parameters into sharded FlatParameters, so per-parameter gradient masks do not apply. Launch with "
            "FSDP2 (accelerate launch --use_fsdp --fsdp_version 2 ...), DDP (--multi_gpu) or one process"
        )
    if version is not None and lora:
        raise ValueError("lora is not supported under FSDP here (the adapters are merged into unsharded weights)")
    requested = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if requested and version is None:
        warnings.warn(
            f"FSDP was requested (ACCELERATE_USE_FSDP) but accelerate runs this job as "
            f"{state.distributed_type.value}: parameters are replicated, not sharded (accelerate enables FSDP only "
            "on GPU-like devices; see docs/distributed.md)",
            stacklevel=2,
        )
    return {
        "type": str(state.distributed_type.value),
        "fsdp_version": version,
        "fsdp_requested": requested,
        "processes": trainer.args.world_size,
    }
