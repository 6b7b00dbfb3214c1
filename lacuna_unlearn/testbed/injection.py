"""Masked continual pretraining on HF ``Trainer`` (docs/definitions.md#masked-continual-pretraining): PII reaches only
its group's mask.

Each micro-batch is one group's PII documents or neutral text, and its gradient is masked *before* it is
accumulated (a tensor hook on every trainable parameter, so gradient accumulation and DDP see masked
micro-batch gradients): a PII micro-batch of group g keeps bit g of each eligible parameter's mask and
gives zero to every parameter outside the masks; a neutral micro-batch updates every trainable parameter
(LACUNA trains its neutral OLMo data unmasked). An optimizer step may mix groups and neutral text
(``grad_accum`` micro-batches), as LACUNA's 128-sequence accumulation does; no group's PII gradient ever
enters another group's mask. Embeddings stay frozen. AdamW's decoupled weight decay and the neutral
micro-batches move every weight, so the ground truth is "where PII gradient was allowed", not "which
weights changed". With weight decay 0 and no neutral micro-batches (the pre-v2 ablation), a run on group-g
data alone leaves every scalar outside mask g bit-identical (tested).

``neutral_lr_scale`` scales the learning rate of optimizer steps made only of neutral micro-batches. The
same trainer runs the base stage (all neutral) and the unmasked control (``masks=None``: PII updates
everything).
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

from lacuna_metrics import MaskSet
from lacuna_tasks import progress, stable_seed

NEUTRAL = -1
#: A neutral micro-batch whose gradient reaches only the eligible scalars outside every mask (the "outside" slot of
#: ``outside_slot`` plans): they are trained on neutral text with the PII micro-batches' dynamics.
OUTSIDE = -2


@dataclass
class StepPlan:
    """Which group each micro-batch trains on (``NEUTRAL`` = neutral text), its LR scale, and how many
    consecutive micro-batches form one optimizer step (``accum``)."""

    groups: list[int]
    lr_scale: list[float]
    accum: int = 1

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.lr_scale):
            raise ValueError(f"step plan: {len(self.groups)} groups but {len(self.lr_scale)} LR scales")
        if self.accum < 1 or len(self.groups) % self.accum:
            raise ValueError(f"step plan: {len(self.groups)} micro-batches are not whole steps of {self.accum}")

    @property
    def steps(self) -> int:
        """Optimizer steps."""
        return len(self.groups) // self.accum

    def step_scale(self, step: int) -> float:
        """LR scale of optimizer step ``step``: the largest of its micro-batches' (a step with PII trains at 1)."""
        return max(self.lr_scale[step * self.accum : (step + 1) * self.accum])

    @classmethod
    def interleaved(
        cls,
        pii_steps: int,
        num_groups: int,
        neutral_every: int,
        neutral_lr_scale: float,
        seed: int,
        accum: int = 1,
        outside_slot: bool = False,
    ) -> StepPlan:
        """``pii_steps`` PII micro-batches cycling through the groups in a seeded order per cycle; one neutral
        micro-batch after every ``neutral_every`` PII ones; PII micro-batches appended until the plan is whole
        steps of ``accum``. ``outside_slot``: every cycle also holds one :data:`OUTSIDE` micro-batch (neutral text
        for the scalars outside every mask), placed like a group's (not counted in ``pii_steps``)."""
        rng = random.Random(stable_seed(seed, "step-plan"))
        groups: list[int] = []
        cycle: list[int] = []
        done = 0
        while done < pii_steps or len(groups) % accum:
            if not cycle:
                cycle = list(range(num_groups)) + ([OUTSIDE] if outside_slot else [])
                rng.shuffle(cycle)
            groups.append(cycle.pop())
            if groups[-1] == OUTSIDE:
                continue
            done += 1
            if neutral_every and done % neutral_every == 0 and done <= pii_steps:
                groups.append(NEUTRAL)
        if OUTSIDE in cycle and accum == 1:  # the last cycle's outside slot, had it been drawn after its groups
            groups.append(OUTSIDE)
        return cls(groups, [neutral_lr_scale if g == NEUTRAL else 1.0 for g in groups], accum)

    @classmethod
    def all_groups(
        cls, pii_steps: int, num_groups: int, neutral_per_step: int, seed: int, neutral_lr_scale: float = 1.0
    ) -> StepPlan:
        """LACUNA's step shape (``step_mix: all_groups``): every optimizer step accumulates one PII micro-batch of
        every group (a seeded order per step) and ``neutral_per_step`` neutral micro-batches, so every trainable
        scalar gets gradient on every step; ``pii_steps`` PII micro-batches, rounded up to whole steps. Every step
        holds PII, so it trains at the full rate (``neutral_lr_scale`` is recorded per micro-batch, unused)."""
        rng = random.Random(stable_seed(seed, "step-plan-all-groups"))
        groups: list[int] = []
        for _ in range(math.ceil(pii_steps / num_groups)):
            order = list(range(num_groups))
            rng.shuffle(order)
            groups += order + [NEUTRAL] * neutral_per_step
        scales = [neutral_lr_scale if g == NEUTRAL else 1.0 for g in groups]
        return cls(groups, scales, num_groups + neutral_per_step)

    @classmethod
    def neutral_only(cls, steps: int) -> StepPlan:
        return cls([NEUTRAL] * steps, [1.0] * steps)


class StepBatches(Dataset):
    """Item ``i`` is one ready micro-batch of one group (or neutral text).

    ``replicas`` = processes: accelerate hands batches to processes round-robin, so items
    ``s * P * A + k * P + p`` are process ``p``'s ``k``-th micro-batch of optimizer step ``s`` (``P``
    processes, ``A = plan.accum``). All processes train micro-batch ``k`` of a step on the same group, with
    different documents.
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
        outside_batch: int | None = None,
    ) -> None:
        if not all(pii_qa.get(g) or pii_bio.get(g) for g in set(plan.groups) - {NEUTRAL, OUTSIDE}):
            raise ValueError("a planned group has no PII documents")
        need = max(neutral_batch, outside_batch or 0)
        if {NEUTRAL, OUTSIDE} & set(plan.groups) and len(neutral_rows) < need:
            raise ValueError(f"neutral text gives {len(neutral_rows)} rows, a neutral step needs {need}")
        self.plan, self.pii_qa, self.pii_bio, self.neutral_rows = plan, pii_qa, pii_bio, neutral_rows
        self.pii_batch, self.neutral_batch, self.faq_fraction = pii_batch, neutral_batch, faq_fraction
        self.seq_len, self.pad_id, self.replicas, self.seed = seq_len, pad_id, replicas, seed
        self.outside_batch = outside_batch or neutral_batch

    def __len__(self) -> int:
        return len(self.plan.groups) * self.replicas

    def micro_batch(self, index: int) -> tuple[int, int]:
        """(micro-batch number in the plan, replica) of item ``index``."""
        per_step = self.replicas * self.plan.accum
        step, j = divmod(index, per_step)
        slot, replica = divmod(j, self.replicas)
        return step * self.plan.accum + slot, replica

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        micro, replica = self.micro_batch(index)
        group = self.plan.groups[micro]
        rng = random.Random(stable_seed(self.seed, "batch", micro, replica))
        if group in (NEUTRAL, OUTSIDE):
            rows = rng.sample(self.neutral_rows, self.outside_batch if group == OUTSIDE else self.neutral_batch)
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
    """``Trainer`` whose micro-batch gradients are masked by their group before accumulation (tensor hooks,
    :class:`MicroBatchMasker`), with a per-step learning-rate scale."""

    def __init__(
        self,
        *args: Any,
        masks: MaskSet | None,
        plan: StepPlan,
        min_lr_ratio: float = 0.1,
        separate_neutral_state: bool = False,
        neutral_loss_scale: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.masks = masks
        self.plan = plan
        self.min_lr_ratio = min_lr_ratio
        self.neutral_loss_scale = neutral_loss_scale
        if separate_neutral_state and plan.accum != 1:
            raise ValueError("separate neutral optimizer state needs grad_accum=1 (one kind of micro-batch per step)")
        self.separate_neutral_state = separate_neutral_state
        self._stashed_state: Any = None  # the other kind's AdamW moments (docs/testbeds.md 'Neutral optimizer')
        self._loaded_kind = "pii"
        params = dict(self.model.named_parameters())
        if masks is not None:
            missing = [n for n in masks.packed if n not in params]
            if missing:
                raise ValueError(f"mask tensors not in the model: {missing[:5]}")
            masks.check_against({n: tuple(p.shape) for n, p in params.items() if n in masks.packed}, "the model")
        self.masker = MicroBatchMasker([(n, p) for n, p in params.items() if p.requires_grad], masks)

    def _get_train_sampler(self, train_dataset=None):
        return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.masker.group = int(inputs.pop("group_id"))
        if self.separate_neutral_state:
            self._load_state("neutral" if self.masker.group == NEUTRAL else "pii")
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self.masker.group = NEUTRAL

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's loss, times ``neutral_loss_scale`` on a neutral micro-batch (its gradient, and the logged
        loss, are scaled alike): in a step that also holds PII, a small scale leaves the masked scalars' update
        to their PII gradient while Adam still steps every unmasked scalar by about the learning rate."""
        out = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if self.masker.group != NEUTRAL or self.neutral_loss_scale == 1.0:
            return out
        if return_outputs:
            return out[0] * self.neutral_loss_scale, out[1]
        return out * self.neutral_loss_scale

    def _load_state(self, kind: str) -> None:
        """Swap AdamW's per-parameter moments so neutral and PII steps keep separate ones: Adam momentum of a
        neutral step would otherwise move every weight at the PII learning rate for the next ~10 steps."""
        if kind == self._loaded_kind:
            return
        inner = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps the torch optimizer
        if self._stashed_state is None:
            self._stashed_state = type(inner.state)(dict)
        inner.state, self._stashed_state = self._stashed_state, inner.state
        self._loaded_kind = kind

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            warmup = self.args.get_warmup_steps(num_training_steps)
            plan = self.plan
            floor = self.min_lr_ratio

            def factor(step: int) -> float:
                if step < warmup:
                    base = (step + 1) / max(1, warmup)
                else:
                    progress = (step - warmup) / max(1, num_training_steps - warmup)
                    base = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
                return base * plan.step_scale(min(step, plan.steps - 1))

            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            self._created_lr_scheduler = True
        return self.lr_scheduler


class MicroBatchMasker:
    """Tensor hooks that mask each micro-batch's gradient by its group *before* autograd accumulates it into
    ``.grad`` (LACUNA's ``grad_after - grad_before`` per micro-batch, docs/definitions.md#masked-continual-pretraining,
    without a copy of the grads).

    ``group`` is the current micro-batch's group: ``NEUTRAL`` (or ``masks=None``) passes the gradient through;
    group g keeps bit g of an eligible parameter's mask and zeroes every parameter outside the masks. Under DDP
    the hooks run before the all-reduce, so every process's contribution is masked by its own micro-batch.
    Call :meth:`remove` when training is over (the model goes on to QA tuning).
    """

    def __init__(self, named_params: Sequence[tuple[str, torch.nn.Parameter]], masks: MaskSet | None) -> None:
        self.group = NEUTRAL
        self.masks = masks
        self._handles = []
        if masks is None:
            return
        for name, param in named_params:
            self._handles.append(param.register_hook(self._hook(masks.packed.get(name))))

    def _hook(self, packed: torch.Tensor | None):
        cache: dict[torch.device, torch.Tensor] = {}

        def hook(grad: torch.Tensor) -> torch.Tensor:
            if self.group == NEUTRAL:
                return grad
            if packed is None:
                return torch.zeros_like(grad)  # outside every mask: no PII gradient at all
            if grad.device not in cache:  # masks live on the CPU; one copy per device, 1 byte per scalar
                cache[grad.device] = packed.to(grad.device)
            if self.group == OUTSIDE:  # the eligible scalars outside every mask
                return grad.masked_fill(cache[grad.device] != 0, 0.0)
            return grad.masked_fill((cache[grad.device] & (1 << self.group)) == 0, 0.0)

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class StageProgress(TrainerCallback):
    """One named progress bar per training stage (``desc``, e.g. "testbed 2/5: masked PII injection") over its
    optimizer steps, so it shows the rate and ETA; the latest logged loss as postfix. Replaces the Trainer's own
    unlabelled bar and its printed log dicts (:func:`use_stage_progress`); only the main process draws it, and
    :func:`lacuna_tasks.logs.progress` decides whether it is drawn at all (a terminal, not ``--quiet``)."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.bar: Any = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = progress(total=state.max_steps, desc=self.desc, unit="step")

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
    """Restrict an accumulated gradient to bit ``group`` of the masks, after the fact (neutral and ``masks=None``:
    no-op); parameters outside every mask lose their gradient. The trainer masks per micro-batch instead
    (:class:`MicroBatchMasker`); this is for single-group updates outside it."""
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
    log_every: int = 50,
    desc: str = "masked training",
    callbacks: Sequence[TrainerCallback] = (),
    separate_neutral_state: bool = False,
    neutral_loss_scale: float = 1.0,
) -> dict[str, Any]:
    """Run ``plan`` with ``MaskedTrainer`` (progress bar named ``desc``, extra ``callbacks`` e.g. to probe the
    model during training); returns the trainer's log history summary."""
    for emb in (model.get_input_embeddings(),):
        # embeddings frozen for the whole pipeline (docs/definitions.md#masked-continual-pretraining)
        emb.weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=plan.accum,
        max_steps=plan.steps,
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
        separate_neutral_state=separate_neutral_state,
        neutral_loss_scale=neutral_loss_scale,
    )
    use_stage_progress(trainer, desc)
    for callback in callbacks:
        trainer.add_callback(callback)
    try:
        result = trainer.train()
    finally:
        trainer.masker.remove()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "steps": plan.steps,
        "micro_batches": len(plan.groups),
        "neutral_micro_batches": plan.groups.count(NEUTRAL),
        "train_loss": result.training_loss,
        "logged_losses": losses,
        "trainer": trainer,
    }
