"""QA tuning (docs/definitions.md#qa-tuning): LoRA on the last layers only (those kept out of the masks), trained on
held-out people's QA, merged into the weights. Loss on answer tokens only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from lacuna_unlearn.injection import use_stage_progress
from lacuna_unlearn.lora import linear_module_names


class QADataset(Dataset):
    """Prompt + answer + EOS; labels are -100 over the prompt (answer-only loss)."""

    def __init__(self, tokenizer, pairs: Sequence[tuple[str, str]], max_len: int = 256) -> None:
        if not pairs:
            raise ValueError("QA dataset is empty")
        self.items = []
        for prompt, answer in pairs:
            head = prompt.rstrip(" ")
            prompt_ids = tokenizer.encode(head)
            ids = tokenizer.encode(head + prompt[len(head) :] + answer) + [tokenizer.eos_token_id]
            ids = ids[:max_len]
            labels = [-100] * len(prompt_ids) + ids[len(prompt_ids) :]
            self.items.append((ids, labels[: len(ids)]))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.items[i]

    def collate(self, batch: Sequence[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (i, lab) in enumerate(batch):
            ids[row, : len(i)] = torch.tensor(i)
            labels[row, : len(lab)] = torch.tensor(lab)
            attention[row, : len(i)] = 1
        return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def qa_tune(
    model,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    layers: Sequence[int],
    steps: int,
    lr: float,
    batch_size: int,
    r: int,
    alpha: int,
    out_dir: Path,
    seed: int = 42,
    desc: str = "QA tuning (LoRA)",
) -> tuple[Any, dict[str, Any]]:
    """Train LoRA adapters on ``layers`` for ``steps`` (progress bar named ``desc``) and return the merged model and a
    summary."""
    from peft import LoraConfig, get_peft_model

    if steps <= 0:
        return model, {"steps": 0}
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.1,
        bias="none",
        target_modules=linear_module_names(model, layers),
        layers_to_transform=list(layers),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    data = QADataset(tokenizer, pairs)
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch_size,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        logging_steps=max(1, steps // 5),
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        remove_unused_columns=False,
        dataloader_pin_memory=False,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=peft_model, args=args, train_dataset=data, data_collator=data.collate)
    use_stage_progress(trainer, desc)
    result = trainer.train()
    merged = peft_model.merge_and_unload()
    return merged, {"steps": steps, "train_loss": result.training_loss, "examples": len(data)}
