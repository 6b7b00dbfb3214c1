"""QA tuning (docs/definitions.md#qa-tuning): LoRA on the last layers only (those kept out of the masks), trained on
held-out people's QA, merged into the weights. Loss on answer tokens only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from lacuna_unlearn.lora import linear_module_names
from lacuna_unlearn.qa.encoding import QA_TUNING_FORMAT, QACollator, encode_pair
from lacuna_unlearn.testbed.injection import use_stage_progress


def encode_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_len: int = 256) -> list[dict[str, torch.Tensor]]:
    """QA-tuning items: ``(prompt, answer)`` pairs (prompts already in :func:`lacuna_tasks.prompts.qa_prompt`'s
    format) encoded with :data:`lacuna_unlearn.qa.encoding.QA_TUNING_FORMAT`: prompt + answer + EOS, labels -100
    over the prompt (answer-only loss), the right end cut at ``max_len``."""
    if not pairs:
        raise ValueError("QA dataset is empty")
    fmt = replace(QA_TUNING_FORMAT, max_length=max_len)
    return [encode_pair(tokenizer, prompt, answer, fmt) for prompt, answer in pairs]


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
    data = encode_pairs(tokenizer, pairs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
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
    trainer = Trainer(model=peft_model, args=args, train_dataset=data, data_collator=QACollator(pad_id))
    use_stage_progress(trainer, desc)
    result = trainer.train()
    merged = peft_model.merge_and_unload()
    return merged, {"steps": steps, "train_loss": result.training_loss, "examples": len(data)}
