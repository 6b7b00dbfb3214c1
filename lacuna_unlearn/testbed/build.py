"""Build a LACUNA-style testbed: PII injected into known parameters (docs/definitions.md, docs/testbeds.md).

Stages, each saved with ``save_pretrained``:

0. ``base/``: a small model pretrained from scratch on neutral text (or the ``--model`` checkpoint);
   the reference for reversal scores.
1. ``injected/``: masked continual pretraining (:mod:`lacuna_unlearn.testbed.injection`): each group's PII
   gradient only reaches that group's mask (``masks.safetensors``), neutral text between the PII
   micro-batches trains every weight, AdamW decays every weight; ``--unmasked`` runs the same pipeline
   without masks.
2. ``model/``: QA tuning, LoRA on the last layers (kept out of the masks), merged: the model to unlearn.
3. ``data/``: memorization test (greedy extraction of fresh multi-sentence questions), the LACUNA splits
   plus ``retain_eval`` (held-out retain-side people) in the ``lacuna_tasks`` schema, so ``lm_eval --tasks
   lacuna_email --metadata '{"lacuna_data": "OUT/data"}'`` evaluates the testbed directly, and
   ``neutral_heldout.jsonl`` (neutral documents never trained on, for a perplexity probe).

The leak audit (:mod:`lacuna_metrics.localization.leak_audit`) scores method-free detectors and null updates against
the masks; a build whose detector beats ``leak_audit_max_auc`` on ``leak_audit_target`` fails. The build
happens in ``OUT.partial`` and is renamed to ``OUT`` at the end: a failed or interrupted build never leaves
a half-written testbed. ``manifest.json`` records settings, seeds, timings, memorization and robustness per
field, people per split and field, and the leak audit, plus the versions and hardware every artifact records
(:func:`lacuna_metrics.manifest.build_manifest`).

This module runs the build steps and chooses the splits; the training text is :mod:`lacuna_unlearn.testbed.corpus`, the
masked training :mod:`lacuna_unlearn.testbed.injection`, the memorization and robustness tests
:mod:`lacuna_unlearn.testbed.probes`, the presets :mod:`lacuna_unlearn.testbed.presets`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics import (
    MaskError,
    MaskSet,
    build_manifest,
    build_masks,
    exclusive_writer,
    named_shapes_of,
    naming_outputs,
    save_masks,
    write_json,
    write_text,
    writing,
)
from lacuna_tasks import FIELDS, FORGET_GROUPS, NEUTRAL_HELDOUT_FILE, RETAIN_GROUPS, build_splits, write_dataset
from lacuna_unlearn.testbed.corpus import (  # noqa: F401  (re-exported: tests and benchmarks import them from here)
    TRAIN_QUESTION_FORMS,
    TestbedCorpus,
    hold_out_neutral,
    pack,
    testbed_corpus,
    with_training_question_forms,
)
from lacuna_unlearn.testbed.injection import StepBatches, StepPlan, train_steps
from lacuna_unlearn.testbed.presets import TestbedConfig, get_preset
from lacuna_unlearn.testbed.probes import ROBUSTNESS_SPLITS, memorization_test, robustness_test  # noqa: F401
from lacuna_unlearn.testbed.qa_tuning import qa_tune
from lacuna_unlearn.testbed.tokenizer import train_tokenizer

__all__ = [
    "MANIFEST_VERSION",
    "NEUTRAL_HELDOUT_FILE",
    "STAGES",
    "TRAIN_QUESTION_FORMS",
    "TestbedError",
    "build_testbed",
    "hold_out_neutral",
    "is_testbed",
    "memorization_test",
    "model_config",
    "people_per_field",
    "robustness_test",
    "split_people",
    "testbed_corpus",
    "with_training_question_forms",
    "write_neutral_heldout",
]

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 2  # 2: leak_audit replaces trivial_detector_auc; retain_eval, robustness, neutral_heldout


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
    """Build a testbed into ``out`` and return its path (see the module docstring for the layout).

    Settings are checked (types, ranges, people vs profiles) before anything is written or trained.
    """
    from accelerate import PartialState

    cfg = get_preset(preset, **(overrides or {}))
    if seed is not None:
        cfg = cfg.replace(seed=seed)
    # cpu=True is what makes accelerate treat torchrun / `accelerate launch --multi_gpu` workers on a
    # machine without GPUs as one multi-CPU (gloo) job instead of independent single processes.
    state = PartialState(cpu=not torch.cuda.is_available())
    if state.num_processes > 1:  # share the cores between processes instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // state.num_processes))
    out = Path(out)
    with exclusive_writer(out, "lacuna build-testbed"):  # two builds into one OUT would mix their masks and data
        return _build_locked(out, cfg, state, unmasked=unmasked, model=model, force=force)


def _build_locked(out: Path, cfg: TestbedConfig, state, *, unmasked: bool, model: str | None, force: bool) -> Path:
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
        with naming_outputs(partial, out), writing(out):  # a full disk names the file at its place in OUT
            _build(out, partial, cfg, state, unmasked=unmasked, model=model)
    except BaseException:
        if state.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)  # never leave a half-written testbed behind
        raise
    return out


def is_testbed(path: str | Path) -> bool:
    """Whether ``path`` is a directory this package built (its ``manifest.json`` says ``kind: lacuna-bench-testbed``):
    the only kind of directory ``--force`` may delete."""
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

    corpus, heldout = testbed_corpus(cfg)
    tokenizer, net = tokenizer_and_model(cfg, corpus, model)
    num_layers = count_layers(net)
    masks = testbed_masks(net, num_layers, cfg, model)  # before any training: a model with no maskable block fails here
    masks.extra.update({"preset": cfg.name, "regime": "unmasked" if unmasked else "masked"})
    lap("data_and_tokenizer")

    neutral_rows = pack([tokenizer.encode(t) for t in corpus.neutral], tokenizer.eos_token_id, cfg.seq_len)
    work = partial / "_trainer"
    if cfg.base_steps > 0 and model is None:
        plan = StepPlan.neutral_only(cfg.base_steps)
        data = injection_batches(plan, {}, {}, neutral_rows, cfg, tokenizer, state.num_processes, cfg.base_batch)
        train_steps(
            net, data, plan, masks=None, lr=cfg.base_lr, out_dir=work, warmup_ratio=0.05, seed=cfg.seed,
            desc=_stage(1, "base pretraining on neutral text"),
        )  # fmt: skip
    _save(net, tokenizer, partial / "base", state)
    if state.is_main_process:
        save_masks(masks, partial / "masks.safetensors")
    lap("base")

    pii_qa = {g: [tokenizer.encode(t) for t in texts] for g, texts in corpus.pii_qa.items()}
    pii_bio = {g: [tokenizer.encode(t) for t in texts] for g, texts in corpus.pii_bio.items()}
    plan = injection_plan(cfg)
    data = injection_batches(
        plan, pii_qa, pii_bio, neutral_rows, cfg, tokenizer, state.num_processes, cfg.neutral_batch
    )
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
        separate_neutral_state=cfg.neutral_optimizer == "separate",
        neutral_loss_scale=cfg.neutral_loss_scale,
        desc=_stage(2, f"{'unmasked' if unmasked else 'masked'} PII injection"),
    )
    _save(net, tokenizer, partial / "injected", state)
    lap("injection")

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
    if state.is_main_process:  # tie the masks to the model they describe (lacuna score checks it; docs/scoring.md)
        from lacuna_metrics import Checkpoint, stamp_masks

        stamp_masks(partial / "masks.safetensors", Checkpoint(partial / "model").fingerprint())

    if state.is_main_process:
        audit = _leak_audit(partial, cfg)
        if audit is not None:  # name the inputs where they will be: the audit ran in OUT.partial
            final = out.resolve()
            audit["inputs"] = {
                "before": str(final / "model"),
                "base": str(final / "base"),
                "masks": str(final / "masks.safetensors"),
            }
        lap("leak_audit")
        memorized, memorization = memorization_test(net, tokenizer, corpus, cfg, desc=_stage(4, "memorization test"))
        lap("memorization_test")
        splits, people_counts = testbed_splits(corpus, cfg, memorized, memorization)
        write_dataset(partial / "data", corpus.profiles, splits, manifest={"seed": cfg.seed, "testbed": cfg.name})
        write_neutral_heldout(partial / "data" / NEUTRAL_HELDOUT_FILE, heldout)
        lap("splits")
        robustness = (
            robustness_test(net, tokenizer, corpus, splits, cfg, desc=_stage(5, "robustness test (paraphrase, ICR)"))
            if cfg.robustness_people
            else None
        )
        lap("robustness_test")
        shutil.rmtree(work, ignore_errors=True)
        manifest = build_manifest(
            manifest_version=MANIFEST_VERSION,
            kind="lacuna-bench-testbed",
            preset=cfg.name,
            regime="unmasked" if unmasked else "masked",
            config=cfg.to_dict(),
            source_model=model,
            seed=cfg.seed,
            sizes={
                "parameters": sum(p.numel() for p in net.parameters()),
                "eligible_parameters": sum(t.numel() for t in masks.packed.values()),
                "masked_per_group": masks.total_counts(),
                "masked_share_of_eligible": round(
                    sum(masks.total_counts()) / max(1, sum(t.numel() for t in masks.packed.values())), 4
                ),
                "target_people": len(corpus.targets),
                "qa_tuning_people": sum(p["role"] == "qa_tuning" for p in corpus.profiles),
                "distractors": len(corpus.distractors),
                "split_rows": {s: len(r) for s, r in splits.items()},
                "split_people": split_people(splits),
                "people_counts": people_counts,
                "neutral_documents": {"trained": len(corpus.neutral), "heldout": len(heldout)},
            },
            memorization=memorization,
            robustness=robustness,
            leak_audit=audit,
            neutral_heldout=f"data/{NEUTRAL_HELDOUT_FILE}",
            injection={
                "optimizer_steps": injection["steps"],
                "micro_batches": injection["micro_batches"],
                "neutral_micro_batches": injection["neutral_micro_batches"],
                "final_losses": injection["logged_losses"][-3:],
            },
            qa_tuning=qa_summary,
            timings_seconds={**timings, "total": round(sum(timings.values()), 1)},
            processes=state.num_processes,
            torch_threads=torch.get_num_threads(),
        )  # + versions and hardware (platform, Python, CPUs, CUDA), as every artifact records them
        write_json(partial / "manifest.json", manifest)
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    state.wait_for_everyone()


#: The named stages of a build's progress bars (the tokenizer, splits and manifest take seconds: no bar).
STAGES = 5


def _stage(number: int, name: str) -> str:
    """A progress bar's name: ``testbed 2/5: masked PII injection``."""
    return f"testbed {number}/{STAGES}: {name}"


def testbed_masks(net, num_layers: int, cfg: TestbedConfig, model: str | None) -> MaskSet:
    try:
        return build_masks(
            named_shapes_of(net),
            num_layers,
            num_groups=cfg.num_groups,
            budget=cfg.budget,
            seed=cfg.seed,
            skip_last=cfg.skip_last,
        )
    except MaskError as exc:
        source = f"--model {model}" if model else f"preset {cfg.name!r}"
        raise MaskError(f"{source} ({type(net).__name__}): {exc}") from exc


def _leak_audit(testbed: Path, cfg: TestbedConfig) -> dict[str, Any] | None:
    """The leak audit of the testbed being built; a detector above the preset's threshold fails the build."""
    if not cfg.leak_audit:
        return None
    from lacuna_metrics import LeakAuditError, audit_testbed

    try:
        return audit_testbed(
            testbed,
            max_auc=cfg.leak_audit_max_auc,
            target=cfg.leak_audit_target,
            seed=cfg.seed,
            gaussian_scale=cfg.null_gaussian_scale,
            adam_lr=cfg.null_adam_lr,
            composite_samples=cfg.leak_audit_composite_samples,
            raise_on_leak=True,
        )
    except LeakAuditError as exc:
        raise TestbedError(f"leak audit failed: {exc}") from exc


def testbed_splits(
    corpus: TestbedCorpus,
    cfg: TestbedConfig,
    memorized: dict[tuple[str, str], list[str]],
    memorization: dict[str, Any],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The splits and the people counts used (requested vs used: ``fit_people`` may take fewer than requested)."""
    target = cfg.people_per_field or people_per_field(memorized, corpus)
    wanted = {
        "people_per_field": target,
        "retain_eval_people": cfg.retain_eval_people,
        "validation_people": cfg.validation_people,
    }
    attempts = [wanted]
    if cfg.fit_people:
        for n in range(target - 1, 0, -1):
            share = n / target
            attempts.append(
                {
                    "people_per_field": n,
                    "retain_eval_people": max(1, round(cfg.retain_eval_people * share))
                    if cfg.retain_eval_people
                    else 0,
                    "validation_people": cfg.validation_people,
                }
            )
    error: ValueError | None = None
    for counts in attempts:
        try:
            splits = build_splits(
                corpus.profiles,
                seed=cfg.seed,
                memorized=None if cfg.splits_without_memorization else memorized,
                **counts,
            )
        except ValueError as exc:
            error = error or exc
            continue
        if counts != wanted:
            logger.warning("too few memorized people for %s; the splits use %s", wanted, counts)
        return splits, {"requested": wanted, "used": counts, "shortfall": counts != wanted}
    table = json.dumps({k: v for k, v in memorization.items() if k in FIELDS}, indent=1)
    raise TestbedError(f"the model memorized too little to build LACUNA splits ({error}); memorization:\n{table}")


def split_people(splits: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """Distinct people per split and field (the population a behaviour rate is measured on)."""
    out: dict[str, dict[str, int]] = {}
    for split, rows in splits.items():
        by_field: dict[str, set[str]] = defaultdict(set)
        for row in rows:
            by_field[row["field"]].add(str(row["ID"]))
        out[split] = {f.column: len(by_field.get(f.column, ())) for f in FIELDS.values()}
    return out


def write_neutral_heldout(path: Path, docs: Sequence[str]) -> None:
    """``{"text": ...}`` per line, written atomically."""
    write_text(path, "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))


def tokenizer_and_model(cfg: TestbedConfig, corpus: TestbedCorpus, model: str | None):
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


def count_layers(net) -> int:
    n = getattr(net.config, "num_hidden_layers", None) or getattr(net.config, "n_layer", None)
    if not n:
        raise ValueError(f"cannot find the number of layers in the config of {type(net).__name__}")
    return int(n)


def injection_plan(cfg: TestbedConfig) -> StepPlan:
    """The injection's step plan: ``cfg.step_mix`` decides what one optimizer step holds (docs/testbeds.md)."""
    if cfg.step_mix == "all_groups":
        return StepPlan.all_groups(cfg.pii_steps, cfg.num_groups, cfg.neutral_per_step, cfg.seed, cfg.neutral_lr_scale)
    return StepPlan.interleaved(
        cfg.pii_steps,
        cfg.num_groups,
        cfg.neutral_every,
        cfg.neutral_lr_scale,
        cfg.seed,
        accum=cfg.grad_accum,
        outside_slot=cfg.outside_slot,
    )


def injection_batches(
    plan, pii_qa, pii_bio, neutral_rows, cfg: TestbedConfig, tokenizer, processes: int, neutral_batch: int
):
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
        outside_batch=cfg.outside_batch,
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


def people_per_field(memorized: dict[tuple[str, str], list[str]], corpus: TestbedCorpus) -> int:
    """Forget (and retain) people per field when the preset sets none: half the smallest eligible side over all
    fields, at least 1.

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
