"""Are training results bit-identical run after run, and across thread counts? (docs/distributed.md "Threads")

    python benchmarks/bench_thread_determinism.py [--steps 20] [--preset mini]

Runs the testbed's base pretraining (``--steps`` optimizer steps of the preset's model on its neutral text) in
fresh processes, twice at 1 torch thread and twice at 2, and prints the SHA-256 of the resulting weights. Equal
hashes within a thread count and different ones across counts mean: reproducible at a fixed thread count only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def _child(preset: str, steps: int, out_dir: str) -> None:
    import hashlib
    from pathlib import Path

    import torch

    from lacuna_unlearn import (
        StepPlan,
        get_preset,
        injection_batches,
        pack,
        testbed_corpus,
        tokenizer_and_model,
        train_steps,
    )

    cfg = get_preset(preset)
    torch.manual_seed(cfg.seed)
    corpus, _ = testbed_corpus(cfg)
    tokenizer, net = tokenizer_and_model(cfg, corpus, None)
    rows = pack([tokenizer.encode(t) for t in corpus.neutral], tokenizer.eos_token_id, cfg.seq_len)
    plan = StepPlan.neutral_only(steps)
    data = injection_batches(plan, {}, {}, rows, cfg, tokenizer, 1, cfg.base_batch)
    train_steps(net, data, plan, masks=None, lr=cfg.base_lr, out_dir=Path(out_dir), warmup_ratio=0.05, seed=cfg.seed,
                desc="base steps")  # fmt: skip
    digest = hashlib.sha256()
    for param in net.parameters():
        digest.update(param.detach().contiguous().numpy().tobytes())
    print(digest.hexdigest()[:16])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.preset, args.steps, args.out)
        return
    for threads in (1, 1, 2, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--preset",
                args.preset,
                "--steps",
                str(args.steps),
                "--out",
                tmp,
            ]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.split()
        print(f"threads {threads}: weights sha256 {out[-1]}")


if __name__ == "__main__":
    main()
