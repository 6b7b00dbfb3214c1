"""People memorized vs build minutes under a testbed preset's injection regime (issue 19's curve).

    python benchmarks/bench_memorization_curve.py --preset mini [--set KEY=VALUE ...] [--probe-every 600]
                                                  [--probe-prompts 4] [--threads 1] [--out curve.json]
                                                  [--robustness-people 6]

Runs the builder's own stages (corpus, tokenizer, base pretraining, masked injection with the preset's plan)
and, every ``--probe-every`` PII micro-batches, probes a copy of the model: QA tuning as the build does it,
then the build's memorization test with ``--probe-prompts`` fresh multi-sentence questions per person and
field. Each probe records the build seconds so far (probe time excluded), and per field the number of
forget-side and retain-side people who are extractable (>= 1 correct) and eligible (>= 2 correct, LACUNA's
rule), plus the loss on the held-out neutral slice. The people a preset needs per field are the forget people
plus retain and retain-eval people (issue 19: 20 + 20 + 10). With ``--robustness-people N`` every probe also
builds the splits from the memorized people and runs the build's robustness test on them (J_P / J_ICR on forget
people, paraphrase / ICR accuracy on retain-eval people; questions never in the injected text). Written as JSON
(``--out``) and a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--probe-every", type=int, default=600, help="PII micro-batches between probes")
    parser.add_argument("--probe-prompts", type=int, default=4, help="fresh questions per person and field")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON file (rewritten after every probe)")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="at every probe, also the leak audit's method-free detectors (before_magnitude, injection_magnitude, "
        "trace_classifier) of the injected model against the base, per target (lacuna_metrics.method_free_aucs)",
    )
    parser.add_argument(
        "--base-cache",
        default=None,
        help="a file for the base stage's weights: loaded if it exists (same preset, seed and base settings), else "
        "written after the base stage; saves its minutes when exploring injection settings (not counted in the "
        "build minutes then)",
    )
    parser.add_argument(
        "--robustness-people",
        type=int,
        default=0,
        help="at every probe, also the build's robustness test (J_P / J_ICR, paraphrase accuracy) on up to this "
        "many split people per split and field (0 = off)",
    )
    args = parser.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from accelerate import PartialState
    from transformers import TrainerCallback

    from lacuna_unlearn import (
        NEUTRAL,
        OUTSIDE,
        StepPlan,
        count_layers,
        get_preset,
        injection_batches,
        injection_plan,
        memorization_test,
        pack,
        qa_tune,
        robustness_test,
        testbed_corpus,
        testbed_masks,
        testbed_splits,
        tokenizer_and_model,
        train_steps,
    )
    from lacuna_unlearn import parse_overrides as _parse_overrides

    cfg = get_preset(args.preset, **_parse_overrides(args.set))
    state = PartialState(cpu=True)
    torch.manual_seed(cfg.seed)
    build_clock = [0.0]  # build seconds, probes excluded
    start = time.perf_counter()
    corpus, heldout = testbed_corpus(cfg)
    tokenizer, net = tokenizer_and_model(cfg, corpus, None)
    num_layers = count_layers(net)
    masks = testbed_masks(net, num_layers, cfg, None)
    neutral_rows = pack([tokenizer.encode(t) for t in corpus.neutral], tokenizer.eos_token_id, cfg.seq_len)
    heldout_rows = pack([tokenizer.encode(t) for t in heldout], tokenizer.eos_token_id, cfg.seq_len)[:64]
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_curve_{os.getpid()}"
    cache = Path(args.base_cache) if args.base_cache else None
    if cache is not None and cache.exists():
        net.load_state_dict(torch.load(cache, weights_only=True))
        print(f"base stage loaded from {cache}", file=sys.stderr)
    elif cfg.base_steps:
        plan = StepPlan.neutral_only(cfg.base_steps)
        data = injection_batches(plan, {}, {}, neutral_rows, cfg, tokenizer, 1, cfg.base_batch)
        train_steps(net, data, plan, masks=None, lr=cfg.base_lr, out_dir=work, warmup_ratio=0.05, seed=cfg.seed,
                    desc="base")  # fmt: skip
        if cache is not None:
            torch.save(net.state_dict(), cache)
    base_state = {n: p.detach().clone() for n, p in net.named_parameters() if n in masks.packed}
    pii_qa = {g: [tokenizer.encode(t) for t in texts] for g, texts in corpus.pii_qa.items()}
    pii_bio = {g: [tokenizer.encode(t) for t in texts] for g, texts in corpus.pii_bio.items()}
    plan = injection_plan(cfg)
    # PII micro-batches done after each optimizer step
    done_after: list[int] = []
    count = 0
    for step in range(plan.steps):
        count += sum(g not in (NEUTRAL, OUTSIDE) for g in plan.groups[step * plan.accum : (step + 1) * plan.accum])
        done_after.append(count)
    probe_at = {
        step + 1: done_after[step]
        for step in range(plan.steps)
        if done_after[step] // args.probe_every > (done_after[step - 1] if step else 0) // args.probe_every
    }
    probe_at[plan.steps] = done_after[-1]
    rows: list[dict[str, Any]] = []
    probe_cfg = cfg.replace(
        memorization_prompts=max(2, args.probe_prompts), robustness_people=args.robustness_people, fit_people=True
    )
    build_clock[0] = time.perf_counter() - start

    def heldout_loss(model) -> float:
        model.eval()
        total, n = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(heldout_rows), 8):
                ids = torch.tensor(heldout_rows[i : i + 8])
                total += float(model(input_ids=ids, labels=ids).loss) * len(ids)
                n += len(ids)
        model.train()
        return total / max(1, n)

    class Probe(TrainerCallback):
        def __init__(self) -> None:
            self.mark = time.perf_counter()

        def on_step_end(self, a, st, control, **kwargs):
            if st.global_step not in probe_at:
                return
            now = time.perf_counter()
            build_clock[0] += now - self.mark
            probe = copy.deepcopy(net)
            layers = list(range(num_layers - cfg.skip_last, num_layers))
            probe, _ = qa_tune(probe, tokenizer, corpus.qa_tuning, layers=layers, steps=cfg.qa_tune_steps,
                               lr=cfg.qa_tune_lr, batch_size=cfg.qa_tune_batch, r=cfg.lora_r, alpha=cfg.lora_alpha,
                               out_dir=work / "qa", seed=cfg.seed, desc="probe QA tuning")  # fmt: skip
            memorized, report = memorization_test(probe, tokenizer, corpus, probe_cfg)
            row: dict[str, Any] = {
                "pii_micro_batches": probe_at[st.global_step],
                "optimizer_steps": st.global_step,
                "build_minutes_so_far": round(build_clock[0] / 60, 2),
                "heldout_neutral_loss": round(heldout_loss(net), 4),
                "fields": {},
            }
            for key, entry in report.items():
                if not isinstance(entry, dict):
                    continue
                row["fields"][key] = {
                    side: {
                        "people": entry[side]["people"],
                        "extractable": _count(entry[side]["extractable"], entry[side]["people"]),
                        "eligible": _count(entry[side]["eligible"], entry[side]["people"]),
                    }
                    for side in ("forget", "retain")
                }
            if args.trace:
                from lacuna_metrics import method_free_aucs

                params = dict(net.named_parameters())
                row["trace"] = method_free_aucs(
                    ((n, params[n], base_state[n], masks.packed[n]) for n in masks.packed),
                    sum(1 << g for g in masks.forget_groups),
                    sum(1 << g for g in masks.retain_groups),
                    seed=cfg.seed,
                )
            if args.robustness_people:
                try:
                    splits, _ = testbed_splits(corpus, probe_cfg, memorized, report)
                    row["robustness"] = robustness_test(probe, tokenizer, corpus, splits, probe_cfg)
                except ValueError as err:  # too few memorized people for the splits yet
                    row["robustness"] = {"skipped": str(err)}
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
            if args.out:
                _write(Path(args.out), cfg, args, rows)
            del probe
            self.mark = time.perf_counter()

    data = injection_batches(plan, pii_qa, pii_bio, neutral_rows, cfg, tokenizer, 1, cfg.neutral_batch)
    train_steps(net, data, plan, masks=masks, lr=cfg.pii_lr, out_dir=work, weight_decay=cfg.weight_decay,
                warmup_ratio=cfg.warmup_ratio, min_lr_ratio=cfg.min_lr_ratio, max_grad_norm=cfg.max_grad_norm,
                seed=cfg.seed, desc="injection", callbacks=[Probe()],
                separate_neutral_state=cfg.neutral_optimizer == "separate",
                neutral_loss_scale=cfg.neutral_loss_scale)  # fmt: skip
    del state
    if args.out:
        _write(Path(args.out), cfg, args, rows)
    print(f"preset {cfg.name} sets {args.set} threads {torch.get_num_threads()}")
    for row in rows:
        print(_line(row))


def _count(share: float | None, n: int) -> int:
    return 0 if share is None else int(round(share * n))


def _line(row: dict[str, Any]) -> str:
    parts = [
        f"{row['pii_micro_batches']:>6} PII ub  {row['build_minutes_so_far']:>6.1f} min  "
        f"neutral loss {row['heldout_neutral_loss']:.3f} |"
    ]
    for key, entry in row["fields"].items():
        f, r = entry["forget"], entry["retain"]
        parts.append(f"{key} F {f['extractable']}/{f['people']} R {r['extractable']}/{r['people']}")
    robustness = row.get("robustness") or {}
    for key, entry in (robustness.get("forget") or {}).items():
        held = (robustness.get("retain_eval") or {}).get(key, {})
        parts.append(
            f"\n    robustness {key}: forget J_P {_fmt(entry.get('j_p'))} J_ICR {_fmt(entry.get('j_icr'))} "
            f"(n {entry.get('people')}); retain-eval paraphrase acc {_fmt(held.get('paraphrase_accuracy'))} "
            f"ICR acc {_fmt(held.get('icr_accuracy'))} (n {held.get('people', 0)})"
        )
    for detector, aucs in (row.get("trace") or {}).items():
        cells = " / ".join("-" if v is None else f"{v:.3f}" for v in aucs.values())
        parts.append(f"\n    trace {detector} (forget / unified / forget_vs_retain): {cells}")
    if "skipped" in robustness:
        parts.append(f"\n    robustness skipped: {robustness['skipped']}")
    return "  ".join(parts)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _write(path: Path, cfg, args, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    payload = {"preset": cfg.name, "sets": args.set, "config": cfg.to_dict(), "probes": rows}
    tmp.write_text(
        json.dumps(payload, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    )
    tmp.replace(path)


if __name__ == "__main__":
    main()
