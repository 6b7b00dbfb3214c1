"""Restricted unlearning (OracleGrad) through the real HF Trainer: out-of-mask scalars stay bit-identical (plain AdamW:
tests/unlearn/trainer/test_restrict.py; shared model and masks: tests/helpers/restrict.py).
"""

from __future__ import annotations

import torch
from helpers.restrict import DOWN0, assert_restricted, lm_batch, snapshot, tiny_llama, tiny_masks

from lacuna_metrics.masks import named_shapes_of
from lacuna_unlearn.trainer.restrict import (
    apply_restriction,
    check_optimizer,
    param_groups,
    parse_restriction,
)

# --------------------------------------------------------------------------------------------------
# Training: real HF Trainer


class _Batches(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in lm_batch(100 + i, batch=1).items()}


def test_hf_trainer_with_param_groups_keeps_out_of_mask_scalars(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = tiny_llama()
    shapes = named_shapes_of(model)
    masks = tiny_masks(model)
    masks.packed[DOWN0] = torch.ones(shapes[DOWN0], dtype=torch.int32)  # one whole, weight-decayed parameter
    resolved = parse_restriction("forget_mask").resolve(model, masks)
    handle = apply_restriction(model, resolved)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        weight_decay=0.01,
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    groups = param_groups(model, resolved, args.weight_decay)
    assert {g["weight_decay"] for g in groups} == {0.0, 0.01}
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    check_optimizer(optimizer, model, resolved)
    before = snapshot(model)
    trainer = Trainer(model=model, args=args, train_dataset=_Batches(), optimizers=(optimizer, None))
    trainer.train()
    assert trainer.state.global_step == 3
    assert_restricted(model, before, resolved)  # DOWN0 (whole, decayed) moved; masked ones only in-mask
    handle.remove()
