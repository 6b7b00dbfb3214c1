"""Step time of masked continual pretraining vs the same steps unmasked (baseline, same run).

    python benchmarks/bench_masking.py [--preset mini] [--steps 60]

Builds the preset's model shape from a config (random init), one PII document pool, and runs the same
step plan through ``MaskedTrainer`` twice: with the preset's masks and with ``masks=None``. Also
times ``mask_gradients`` alone. Prints seconds per step and the masked/unmasked ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    from transformers import Olmo2ForCausalLM

    from lacuna_metrics import build_masks, named_shapes_of
    from lacuna_unlearn import StepBatches, StepPlan, get_preset, mask_gradients, model_config, train_steps

    cfg = get_preset(args.preset)
    config = model_config(cfg, cfg.vocab_size, pad_id=0, eos_id=1)
    torch.manual_seed(0)
    template = Olmo2ForCausalLM(config)
    masks = build_masks(
        named_shapes_of(template), cfg.num_layers, budget=cfg.budget, seed=cfg.seed, skip_last=cfg.skip_last
    )
    rng = random.Random(0)
    docs = {g: [[rng.randrange(2, cfg.vocab_size) for _ in range(96)] for _ in range(32)] for g in range(6)}
    plan = StepPlan.interleaved(args.steps, 6, 0, 1.0, seed=0)
    data = StepBatches(
        plan,
        pii_qa=docs,
        pii_bio=docs,
        neutral_rows=[],
        pii_batch=cfg.pii_batch,
        neutral_batch=1,
        faq_fraction=0.5,
        seq_len=cfg.seq_len,
        pad_id=0,
    )
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, use_masks in (("unmasked (baseline)", None), ("masked", masks)):
            model = Olmo2ForCausalLM(config)
            model.load_state_dict(template.state_dict())
            start = time.perf_counter()
            train_steps(model, data, plan, masks=use_masks, lr=1e-3, out_dir=Path(tmp), seed=0, log_every=10**6)
            results[label] = (time.perf_counter() - start) / args.steps
    model = Olmo2ForCausalLM(config)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = torch.ones_like(p)
    start = time.perf_counter()
    for step in range(20):
        mask_gradients(params, masks, step % 6)
    results["mask_gradients alone"] = (time.perf_counter() - start) / 20

    base = results["unmasked (baseline)"]
    print(
        f"preset {cfg.name}: d={cfg.hidden_size}, layers={cfg.num_layers}, batch {cfg.pii_batch} docs, {args.steps} steps"
    )
    print(f"| {'what':<24} | {'s/step':>8} | {'ratio vs unmasked':>17} |")
    print(f"|{'-' * 26}|{'-' * 10}|{'-' * 19}|")
    for label, seconds in results.items():
        print(f"| {label:<24} | {seconds:8.4f} | {seconds / base:17.3f} |")
    print(json.dumps({k: round(v, 5) for k, v in results.items()}))


if __name__ == "__main__":
    main()
