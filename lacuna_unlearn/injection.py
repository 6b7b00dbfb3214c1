"""Masked continual pretraining on HF ``Trainer`` (spec §1.5): PII reaches only its group's mask.

Every optimizer step is group-homogeneous: all micro-batches of a step (on every process) come from
one group, or are neutral text. After backward, a PII step of group g multiplies each eligible
parameter's gradient by bit g of its mask and drops the gradient of every parameter outside the
masks (so their optimizer state does not step either); neutral steps update every trainable
parameter. Embeddings stay frozen. With weight decay 0, a run on group-g data alone leaves every
scalar outside mask g bit-identical (tested).

Neutral steps use a scaled-down learning rate (``neutral_lr_scale``): full updates at the PII rate
erode masked memories (``minitestbed_feasibility.md``). The same trainer runs the base stage (all
neutral) and the unmasked control (``masks=None``: PII steps update everything).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, SequentialSampler
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from lacuna_metrics.masks import MaskSet
from lacuna_tasks.prompts import stable_seed

NEUTRAL = -1


@dataclass
class StepPlan:
    """Which group each optimizer step trains on (``NEUTRAL`` = neutral text) and its LR scale."""

    groups: list[int]
    lr_scale: list[float]

    @classmethod
    def interleaved(
        cls, pii_steps: int, num_groups: int, neutral_every: int, neutral_lr_scale: float, seed: int
    ) -> StepPlan:
        """PII steps cycle through the groups in a seeded order per cycle; one neutral step after every
        ``neutral_every`` PII steps."""
        rng = random.Random(stable_seed(seed, "step-plan"))
        groups: list[int] = []
        cycle: list[int] = []
        done = 0
        while done < pii_steps:
            if not cycle:
                cycle = list(range(num_groups))
                rng.shuffle(cycle)
            groups.append(cycle.pop())
            done += 1
            if neutral_every and done % neutral_every == 0:
                groups.append(NEUTRAL)
        return cls(groups, [neutral_lr_scale if g == NEUTRAL else 1.0 for g in groups])

    @classmethod
    def neutral_only(cls, steps: int) -> StepPlan:
        return cls([NEUTRAL] * steps, [1.0] * steps)


class StepBatches(Dataset):
    """Item ``i`` is one ready micro-batch; items of one optimizer step share its group.

    ``replicas`` = processes x gradient-accumulation steps: that many consecutive items form one
    optimizer step (accelerate hands batches to processes round-robin).
    """

    def __init__(
        self,
        plan: StepPlan,
        *,
        pii_qa: dict[int, list[list[int]]],
        pii_bio: dict[int, list[list[int]]],
        neutral_rows: list[list[int]],
        pii_batch: int,
        neutral_batch: int,
        faq_fraction: float,
        seq_len: int,
        pad_id: int,
        replicas: int = 1,
        seed: int = 0,
    ) -> None:
        if any(g != NEUTRAL for g in plan.groups) and not all(
            pii_qa.get(g) or pii_bio.get(g) for g in set(plan.groups) - {NEUTRAL}
        ):
            raise ValueError("a planned group has no PII documents")
        if NEUTRAL in plan.groups and len(neutral_rows) < neutral_batch:
            raise ValueError(f"neutral text gives {len(neutral_rows)} rows, a neutral step needs {neutral_batch}")
        self.plan, self.pii_qa, self.pii_bio, self.neutral_rows = plan, pii_qa, pii_bio, neutral_rows
        self.pii_batch, self.neutral_batch, self.faq_fraction = pii_batch, neutral_batch, faq_fraction
        self.seq_len, self.pad_id, self.replicas, self.seed = seq_len, pad_id, replicas, seed

    def __len__(self) -> int:
        return len(self.plan.groups) * self.replicas

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        step, replica = divmod(index, self.replicas)
        group = self.plan.groups[step]
        rng = random.Random(stable_seed(self.seed, "batch", step, replica))
        if group == NEUTRAL:
            rows = rng.sample(self.neutral_rows, self.neutral_batch)
        else:
            rows = []
            for _ in range(self.pii_batch):
                qa, bio = self.pii_qa.get(group) or [], self.pii_bio.get(group) or []
                pool = qa if (qa and (not bio or rng.random() < self.faq_fraction)) else bio
                rows.append(rng.choice(pool)[: self.seq_len])
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            attention[i, : len(row)] = 1
        labels = ids.masked_fill(attention == 0, -100)
        return {"input_ids": ids, "attention_mask": attention, "labels": labels, "group_id": torch.tensor(group)}


def _unwrap(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if len(items) != 1:
        raise ValueError("StepBatches items are whole batches: use per_device_train_batch_size=1")
    return items[0]


class MaskedTrainer(Trainer):
    """``Trainer`` with group-wise gradient masking and a per-step learning-rate scale."""

    def __init__(self, *args: Any, masks: MaskSet | None, plan: StepPlan, min_lr_ratio: float = 0.1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.masks = masks
        self.plan = plan
        self.min_lr_ratio = min_lr_ratio
        params = dict(self.model.named_parameters())
        if masks is not None:
            missing = [n for n in masks.packed if n not in params]
            if missing:
                raise ValueError(f"mask tensors not in the model: {missing[:5]}")
            masks.check_against({n: tuple(p.shape) for n, p in params.items() if n in masks.packed}, "the model")
        self._trainable = [(n, p) for n, p in params.items() if p.requires_grad]

    def _get_train_sampler(self, train_dataset=None):
        return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    def training_step(self, model, inputs, num_items_in_batch=None):
        group = int(inputs.pop("group_id"))
        loss = super().training_step(model, inputs, num_items_in_batch)
        mask_gradients(self._trainable, self.masks, group)
        return loss

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            warmup = self.args.get_warmup_steps(num_training_steps)
            scales = self.plan.lr_scale
            floor = self.min_lr_ratio

            def factor(step: int) -> float:
                if step < warmup:
                    base = (step + 1) / max(1, warmup)
                else:
                    progress = (step - warmup) / max(1, num_training_steps - warmup)
                    base = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
                return base * scales[min(step, len(scales) - 1)]

            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            self._created_lr_scheduler = True
        return self.lr_scheduler


class StageProgress(TrainerCallback):
    """One named tqdm bar per training stage (``desc``, e.g. "testbed 2/4: masked PII injection") over its optimizer
    steps, so tqdm shows the rate and ETA; the latest logged loss as postfix. Replaces the Trainer's own unlabelled
    bar and its printed log dicts (:func:`use_stage_progress`); only the main process draws it."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.bar: Any = None

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        if state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, desc=self.desc, unit="step", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{float(logs['loss']):.4g}", refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def use_stage_progress(trainer: Trainer, desc: str) -> Trainer:
    """Swap ``trainer``'s default progress bar (or log printer) for a :class:`StageProgress` named ``desc``."""
    for default in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(default)
    trainer.add_callback(StageProgress(desc))
    return trainer


def mask_gradients(named_params: Sequence[tuple[str, torch.nn.Parameter]], masks: MaskSet | None, group: int) -> None:
    """Restrict a PII step's gradient to bit ``group`` of the masks (neutral steps and ``masks=None``: no-op)."""
    if group == NEUTRAL or masks is None:
        return
    bit = 1 << group
    for name, param in named_params:
        if param.grad is None:
            continue
        packed = masks.packed.get(name)
        if packed is None:
            param.grad = None  # outside every mask: no PII gradient, and its optimizer state does not step
        else:
            param.grad.masked_fill_(((packed & bit) == 0).to(param.grad.device), 0.0)  # masks live on the CPU


def train_steps(
    model,
    dataset: StepBatches,
    plan: StepPlan,
    *,
    masks: MaskSet | None,
    lr: float,
    out_dir: Path,
    weight_decay: float = 0.0,
    warmup_ratio: float = 0.0,
    min_lr_ratio: float = 0.1,
    max_grad_norm: float = 1.0,
    seed: int = 42,
    gradient_accumulation_steps: int = 1,
    log_every: int = 50,
    desc: str = "masked training",
) -> dict[str, Any]:
    """Run ``plan`` with ``MaskedTrainer`` (progress bar named ``desc``); returns the trainer's log history summary."""
    for emb in (model.get_input_embeddings(),):
        emb.weight.requires_grad_(False)  # embeddings frozen for the whole pipeline (spec §1.5)
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=gradient_accumulation_steps,
        max_steps=len(plan.groups),
        learning_rate=lr,
        weight_decay=weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        warmup_steps=warmup_ratio,
        max_grad_norm=max_grad_norm,
        logging_steps=log_every,
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=False,
    )
    trainer = MaskedTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=_unwrap,
        masks=masks,
        plan=plan,
        min_lr_ratio=min_lr_ratio,
    )
    use_stage_progress(trainer, desc)
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"steps": len(plan.groups), "train_loss": result.training_loss, "logged_losses": losses, "trainer": trainer}
