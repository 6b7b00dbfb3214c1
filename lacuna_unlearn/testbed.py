"""Build a LACUNA-style testbed: PII injected into known parameters (spec §1.2-1.7).

Stages, each saved with ``save_pretrained``:

0. ``base/``: a small model pretrained from scratch on neutral text (or the ``--model`` checkpoint);
   the reference for reversal scores.
1. ``injected/``: masked continual pretraining (:mod:`lacuna_unlearn.injection`): each group's PII only
   reaches that group's mask (``masks.safetensors``); ``--unmasked`` runs the same pipeline without masks.
2. ``model/``: QA tuning, LoRA on the last layers (kept out of the masks), merged: the model to unlearn.
3. ``data/``: memorization test (greedy extraction of fresh multi-sentence questions) and the LACUNA
   splits in the ``lacuna_tasks`` schema, so ``lm_eval --tasks lacuna_email --metadata
   '{"lacuna_data": "OUT/data"}'`` evaluates the testbed directly.

The build happens in ``OUT.partial`` and is renamed to ``OUT`` at the end: a failed or interrupted
build never leaves a half-written testbed. ``manifest.json`` records settings, seeds, versions,
timings, memorization per field and group, and trivial magnitude-detector AUCs.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lacuna_metrics.auc import roc_auc
from lacuna_metrics.behavior import extraction_hits
from lacuna_metrics.manifest import package_versions, write_json
from lacuna_metrics.masks import MaskSet, build_masks, named_shapes_of, save_masks
from lacuna_tasks.generate import build_splits, write_dataset
from lacuna_tasks.prompts import probe_prompt
from lacuna_tasks.schema import FIELDS, FORGET_GROUPS, RETAIN_GROUPS
from lacuna_unlearn.corpus import TestbedCorpus, build_corpus, memorization_questions, pack
from lacuna_unlearn.injection import StepBatches, StepPlan, train_steps
from lacuna_unlearn.qa_tuning import qa_tune
from lacuna_unlearn.testbed_presets import TestbedConfig, get_preset
from lacuna_unlearn.tokenizer import train_tokenizer

MANIFEST_VERSION = 1


class TestbedError(ValueError):
    """Settings that cannot produce a valid testbed (e.g. the model memorized too little for splits)."""


def build_testbed(
    out: str | Path,
    *,
    preset: str = "mini",
    seed: int | None = None,
    unmasked: bool = False,
    model: str | None = None,
    overrides: dict[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Build a testbed into ``out`` and return its path (see the module docstring for the layout)."""
    from accelerate import PartialState

    # cpu=True is what makes accelerate treat torchrun / `accelerate launch --multi_gpu` workers on a
    # machine without GPUs as one multi-CPU (gloo) job instead of independent single processes.
    state = PartialState(cpu=not torch.cuda.is_available())
    if state.num_processes > 1:  # share the cores between processes instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // state.num_processes))
    cfg = get_preset(preset, **(overrides or {}))
    if seed is not None:
        cfg = cfg.replace(seed=seed)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    if state.is_main_process:
        if out.exists() and not force:
            raise FileExistsError(f"{out} exists; pass force=True (--force) to rebuild it")
        if out.exists() and not is_testbed(out):
            raise FileExistsError(f"{out} exists and is not a lacuna-bench testbed; --force only replaces testbeds")
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
    state.wait_for_everyone()
    try:
        _build(out, partial, cfg, state, unmasked=unmasked, model=model)
    except BaseException:
        if state.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)  # never leave a half-written testbed behind
        raise
    return out


def is_testbed(path: str | Path) -> bool:
    """Whether ``path`` is a directory this package built (its ``manifest.json`` says ``kind: lacuna-bench-testbed``):
    the only kind of directory ``--force`` may delete."""
    import json

    manifest = Path(path) / "manifest.json"
    try:
        return json.loads(manifest.read_text()).get("kind") == "lacuna-bench-testbed"
    except (OSError, ValueError, AttributeError):
        return False


def _build(out: Path, partial: Path, cfg: TestbedConfig, state, *, unmasked: bool, model: str | None) -> None:
    torch.manual_seed(cfg.seed)
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 1)
        clock = now

    corpus = build_corpus(
        profiles_per_group=cfg.profiles_per_group,
        distractor_profiles=cfg.distractor_profiles,
        bios_per_person=cfg.bios_per_person,
        qa_per_field=cfg.qa_per_field,
        lorem_paragraphs=cfg.lorem_paragraphs,
        num_groups=cfg.num_groups,
        seed=cfg.seed,
    )
    tokenizer, net = _tokenizer_and_model(cfg, corpus, model)
    lap("data_and_tokenizer")

    neutral_rows = pack([tokenizer.encode(t) for t in corpus.neutral], tokenizer.eos_token_id, cfg.seq_len)
    work = partial / "_trainer"
    if cfg.base_steps > 0 and model is None:
        plan = StepPlan.neutral_only(cfg.base_steps)
        data = _batches(plan, {}, {}, neutral_rows, cfg, tokenizer, state.num_processes, cfg.base_batch)
        train_steps(
            net, data, plan, masks=None, lr=cfg.base_lr, out_dir=work, warmup_ratio=0.05, seed=cfg.seed,
            desc=_stage(1, "base pretraining on neutral text"),
        )  # fmt: skip
    _save(net, tokenizer, partial / "base", state)
    lap("base")

    num_layers = _num_layers(net)
    masks = build_masks(
        named_shapes_of(net),
        num_layers,
        num_groups=cfg.num_groups,
        budget=cfg.budget,
        seed=cfg.seed,
        skip_last=cfg.skip_last,
    )
    masks.extra.update({"preset": cfg.name, "regime": "unmasked" if unmasked else "masked"})
    if state.is_main_process:
        save_masks(masks, partial / "masks.safetensors")
    base_state = {n: p.detach().clone() for n, p in net.named_parameters() if n in masks.packed}

    pii_qa = {g: [tokenizer.encode(t) for t in texts] for g, texts in corpus.pii_qa.items()}
    pii_bio = {g: [tokenizer.encode(t) for t in texts] for g, texts in corpus.pii_bio.items()}
    plan = StepPlan.interleaved(cfg.pii_steps, cfg.num_groups, cfg.neutral_every, cfg.neutral_lr_scale, cfg.seed)
    data = _batches(plan, pii_qa, pii_bio, neutral_rows, cfg, tokenizer, state.num_processes, cfg.neutral_batch)
    injection = train_steps(
        net,
        data,
        plan,
        masks=None if unmasked else masks,
        lr=cfg.pii_lr,
        out_dir=work,
        weight_decay=cfg.weight_decay,
        warmup_ratio=cfg.warmup_ratio,
        min_lr_ratio=cfg.min_lr_ratio,
        max_grad_norm=cfg.max_grad_norm,
        seed=cfg.seed,
        desc=_stage(2, f"{'unmasked' if unmasked else 'masked'} PII injection"),
    )
    _save(net, tokenizer, partial / "injected", state)
    lap("injection")

    trivial = trivial_detector_aucs(masks, base_state, dict(net.named_parameters()))
    del base_state
    lap("trivial_detectors")

    layers = list(range(num_layers - cfg.skip_last, num_layers))
    net, qa_summary = qa_tune(
        net,
        tokenizer,
        corpus.qa_tuning,
        layers=layers,
        steps=cfg.qa_tune_steps,
        lr=cfg.qa_tune_lr,
        batch_size=cfg.qa_tune_batch,
        r=cfg.lora_r,
        alpha=cfg.lora_alpha,
        out_dir=work,
        seed=cfg.seed,
        desc=_stage(3, "QA tuning (LoRA on the last layers)"),
    )
    _save(net, tokenizer, partial / "model", state)
    lap("qa_tuning")

    manifest: dict[str, Any] = {}
    if state.is_main_process:
        memorized, memorization = memorization_test(net, tokenizer, corpus, cfg)
        lap("memorization_test")
        try:
            splits = build_splits(
                corpus.profiles,
                seed=cfg.seed,
                memorized=memorized,
                people_per_field=people_per_field(memorized, corpus),
                validation_people=cfg.validation_people,
            )
        except ValueError as exc:
            table = json.dumps({k: v for k, v in memorization.items() if k in FIELDS}, indent=1)
            raise TestbedError(
                f"the model memorized too little to build LACUNA splits ({exc}); memorization:\n{table}"
            ) from exc
        write_dataset(partial / "data", corpus.profiles, splits, manifest={"seed": cfg.seed, "testbed": cfg.name})
        lap("splits")
        shutil.rmtree(work, ignore_errors=True)
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "kind": "lacuna-bench-testbed",
            "preset": cfg.name,
            "regime": "unmasked" if unmasked else "masked",
            "config": cfg.to_dict(),
            "source_model": model,
            "seed": cfg.seed,
            "sizes": {
                "parameters": sum(p.numel() for p in net.parameters()),
                "eligible_parameters": sum(t.numel() for t in masks.packed.values()),
                "masked_per_group": masks.total_counts(),
                "target_people": len(corpus.targets),
                "qa_tuning_people": sum(p["role"] == "qa_tuning" for p in corpus.profiles),
                "distractors": len(corpus.distractors),
                "split_rows": {s: len(r) for s, r in splits.items()},
            },
            "memorization": memorization,
            "trivial_detector_auc": trivial,
            "injection": {"steps": injection["steps"], "final_losses": injection["logged_losses"][-3:]},
            "qa_tuning": qa_summary,
            "timings_seconds": {**timings, "total": round(sum(timings.values()), 1)},
            "processes": state.num_processes,
            "torch_threads": torch.get_num_threads(),
            "versions": package_versions(TESTBED_PACKAGES),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        }
        write_json(partial / "manifest.json", manifest)
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    state.wait_for_everyone()


#: The named stages of a build's progress bars (the tokenizer, splits and manifest take seconds: no bar).
STAGES = 4


def _stage(number: int, name: str) -> str:
    """A progress bar's name: ``testbed 2/4: masked PII injection``."""
    return f"testbed {number}/{STAGES}: {name}"


def _tokenizer_and_model(cfg: TestbedConfig, corpus: TestbedCorpus, model: str | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Olmo2ForCausalLM

    if model is not None:
        tokenizer = AutoTokenizer.from_pretrained(model)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        return tokenizer, net
    tokenizer = train_tokenizer(corpus.tokenizer_texts(), vocab_size=cfg.vocab_size)
    config = model_config(cfg, len(tokenizer), pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id)
    return tokenizer, Olmo2ForCausalLM(config)


def model_config(cfg: TestbedConfig, vocab_size: int, *, pad_id: int, eos_id: int):
    """The from-scratch Olmo2 architecture of a preset (untied head, as OLMo-2)."""
    from transformers import Olmo2Config

    return Olmo2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=max(512, cfg.seq_len),
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        tie_word_embeddings=False,
    )


def _num_layers(net) -> int:
    n = getattr(net.config, "num_hidden_layers", None) or getattr(net.config, "n_layer", None)
    if not n:
        raise ValueError(f"cannot find the number of layers in the config of {type(net).__name__}")
    return int(n)


def _batches(plan, pii_qa, pii_bio, neutral_rows, cfg: TestbedConfig, tokenizer, processes: int, neutral_batch: int):
    return StepBatches(
        plan,
        pii_qa=pii_qa,
        pii_bio=pii_bio,
        neutral_rows=neutral_rows,
        pii_batch=cfg.pii_batch,
        neutral_batch=neutral_batch,
        faq_fraction=cfg.faq_fraction,
        seq_len=cfg.seq_len,
        pad_id=tokenizer.pad_token_id,
        replicas=processes,
        seed=cfg.seed,
    )


def _save(net, tokenizer, path: Path, state) -> None:
    from transformers.utils import logging as hf_logging

    if state.is_main_process:
        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a "Writing model shards" bar per save would sit between the stages' bars
        try:
            net.save_pretrained(path)
            tokenizer.save_pretrained(path)
        finally:
            if shown:
                hf_logging.enable_progress_bar()
    state.wait_for_everyone()


def memorization_test(
    net, tokenizer, corpus: TestbedCorpus, cfg: TestbedConfig
) -> tuple[dict[tuple[str, str], list[str]], dict[str, Any]]:
    """Greedy extraction of ``memorization_prompts`` fresh questions per target person and field.

    Returns the memorized questions per (person, field) for the split builder, and per field the share
    of forget-group / retain-group people who are ``eligible`` (>= 2 memorized questions, LACUNA's rule)
    and ``extractable`` (>= 1), plus the share of correct prompts, overall and per group.
    """
    items = []
    for person in corpus.targets:
        for key, fld in FIELDS.items():
            answer = str(person.get(fld.column, "N/A"))
            if answer in {"N/A", ""}:
                continue
            for q in memorization_questions(person, key, cfg.memorization_prompts, cfg.seed):
                items.append((person, key, q, answer))
    hits = _extraction_hits_with_progress(net, tokenizer, items, cfg.eval_batch, _stage(4, "memorization test"))
    memorized: dict[tuple[str, str], list[str]] = defaultdict(list)
    correct: dict[tuple[str, str], int] = defaultdict(int)
    asked: dict[tuple[str, str], int] = defaultdict(int)
    group_of = {}
    for (person, key, q, _), hit in zip(items, hits, strict=True):
        pid = person["Unique ID"]
        group_of[pid] = int(person["group_id"])
        asked[(pid, key)] += 1
        if hit:
            memorized[(pid, key)].append(q)
            correct[(pid, key)] += 1
    report: dict[str, Any] = {"prompts_per_person_field": cfg.memorization_prompts}
    for key in FIELDS:
        people = [(pid, g) for (pid, k) in asked for g in [group_of[pid]] if k == key]
        row: dict[str, Any] = {}
        for side, groups in (("forget", FORGET_GROUPS), ("retain", RETAIN_GROUPS)):
            ids = [pid for pid, g in people if g in groups]
            row[side] = {
                "people": len(ids),
                "eligible": _share(sum(correct[(p, key)] >= 2 for p in ids), len(ids)),
                "extractable": _share(sum(correct[(p, key)] >= 1 for p in ids), len(ids)),
                "prompt_accuracy": _share(sum(correct[(p, key)] for p in ids), sum(asked[(p, key)] for p in ids)),
            }
        row["by_group"] = {
            str(g): _share(
                sum(correct[(p, key)] >= 2 for p, gg in people if gg == g), sum(1 for _, gg in people if gg == g)
            )
            for g in range(cfg.num_groups)
        }
        report[key] = row
    return dict(memorized), report


def _extraction_hits_with_progress(net, tokenizer, items: list, batch_size: int, desc: str) -> list[bool]:
    """``extraction_hits`` of ``items`` (person, field, question, answer) batch by batch under a progress bar named
    ``desc``. The prompts go in the order and batches ``greedy_generate`` forms itself (shortest first, stable), so
    every generation, and the testbed, is the same as in one call."""
    from tqdm.auto import tqdm

    prompts = [probe_prompt(q) for _, _, q, _ in items]
    order = sorted(range(len(items)), key=lambda i: len(prompts[i]))
    hits = [False] * len(items)
    with tqdm(total=len(items), desc=desc, unit="prompt", dynamic_ncols=True) as bar:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            found = extraction_hits(
                net,
                tokenizer,
                [prompts[i] for i in idx],
                [items[i][3] for i in idx],
                [items[i][1] for i in idx],
                batch_size=batch_size,
            )
            for i, hit in zip(idx, found, strict=True):
                hits[i] = hit
            bar.update(len(idx))
    return hits


def people_per_field(memorized: dict[tuple[str, str], list[str]], corpus: TestbedCorpus) -> int:
    """Forget (and retain) people per field: half the smallest eligible side over all fields, at least 1.

    The other half of the eligible people feed the validation and relearn splits (the split builder's
    default keeps only a third for forget/retain, LACUNA's 100 of ~550, which is too few at mini scale).
    """
    smallest = None
    for key in FIELDS:
        for groups in (FORGET_GROUPS, RETAIN_GROUPS):
            n = sum(
                len(memorized.get((p["Unique ID"], key), ())) >= 2
                for p in corpus.targets
                if int(p["group_id"]) in groups
            )
            smallest = n if smallest is None else min(smallest, n)
    return max(1, (smallest or 0) // 2)


def _share(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def trivial_detector_aucs(
    masks: MaskSet,
    base: dict[str, torch.Tensor],
    injected: dict[str, torch.Tensor],
    *,
    max_scalars: int = 20_000_000,
    seed: int = 0,
) -> dict[str, float]:
    """AUCs of method-free magnitude detectors on the eligible scalars (the testbed's magnitude leak).

    ``abs_weight``: |theta_injected|; ``abs_injection_delta``: |theta_injected - theta_base|. Targets:
    ``forget_vs_rest`` (forget-group scalars vs all other eligible scalars) and ``forget_vs_retain``
    (forget vs retain scalars only; immune to a leak that marks every masked weight). Exact up to
    ``max_scalars`` eligible scalars; above that, on a seeded uniform subsample of that size (reported
    as ``sampled_fraction``) until the streaming scorer covers real checkpoints.
    """
    names = list(masks.packed)
    total = sum(masks.packed[n].numel() for n in names)
    fraction = min(1.0, max_scalars / total)
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {"packed": [], "weight": [], "delta": []}
    for n in names:
        packed, after = masks.packed[n].ravel(), injected[n].detach().float().ravel()
        before = base[n].float().ravel()
        if fraction < 1.0:
            keep = torch.rand(packed.numel(), generator=generator) < fraction
            packed, after, before = packed[keep], after[keep], before[keep]
        parts["packed"].append(packed.numpy())
        parts["weight"].append(after.abs().numpy())
        parts["delta"].append((after - before).abs().numpy())
    packed, weight, delta = (np.concatenate(parts[k]) for k in ("packed", "weight", "delta"))
    forget_bits = sum(1 << g for g in masks.forget_groups or FORGET_GROUPS)
    retain_bits = sum(1 << g for g in masks.retain_groups or RETAIN_GROUPS)
    is_forget = (packed & forget_bits) != 0
    is_retain = (packed & retain_bits) != 0
    both = is_forget | is_retain
    out: dict[str, float] = {"sampled_fraction": round(fraction, 6)}
    for label, score in (("abs_weight", weight), ("abs_injection_delta", delta)):
        out[f"{label}.forget_vs_rest"] = round(roc_auc(score, is_forget), 4)
        out[f"{label}.forget_vs_retain"] = round(roc_auc(score[both], is_forget[both]), 4)
    return out


TESTBED_PACKAGES = ("lacuna-bench", "torch", "transformers", "peft", "accelerate", "tokenizers", "faker")
