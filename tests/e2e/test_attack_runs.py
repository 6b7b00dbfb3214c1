"""Relearning attacks, end to end on the tiny memorizing model (``tiny_lacuna``) and the smoke testbed: the
attacker's rows per source and budget on its data, real Hydra attack runs that fine-tune an unlearned model back
towards its forget answers, frozen input embeddings through the Trainer. Pure row and preset logic:
tests/unlearn/bench/test_attacks.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lacuna_tasks.loader import load_data
from lacuna_unlearn.qa.unlearn_data import split_rows
from lacuna_unlearn.trainer.relearn_rows import SOURCES, attack_rows, holdout


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)


def test_sources_pick_the_protocol_rows(tiny_lacuna):
    data = load_data(tiny_lacuna.data_dir)
    forget, retain = split_rows(data, "forget", "email"), split_rows(data, "retain", "email")
    relearn = split_rows(data, "relearn", "email")
    assert attack_rows(data, "forget", "email") == forget
    assert attack_rows(data, "retain", "email") == retain
    assert attack_rows(data, "forget_retain", "email") == forget + retain
    assert attack_rows(data, "relearn_split", "email") == relearn
    held_out = {r["ID"] for r in relearn}
    assert not held_out & {r["ID"] for r in forget + retain}  # held-out people only
    assert len(attack_rows(data, "unrelated", "email")) == len(forget)  # default size |D_f|
    assert set(SOURCES) == {"relearn_split", "retain", "forget", "forget_retain", "unrelated"}


def test_budget_draws_a_stable_subset(tiny_lacuna):
    data = load_data(tiny_lacuna.data_dir)
    n_forget = len(split_rows(data, "forget", "email"))
    rows = attack_rows(data, "relearn_split", "email", budget="forget", seed=3)
    assert len(rows) == n_forget and rows == attack_rows(data, "relearn_split", "email", budget="forget", seed=3)
    assert rows != attack_rows(data, "relearn_split", "email", budget="forget", seed=4)
    assert len(attack_rows(data, "relearn_split", "email", budget=2)) == 2
    assert attack_rows(data, "forget", "email", budget=10_000) == split_rows(data, "forget", "email")  # whole source
    assert len(attack_rows(data, "unrelated", "email", budget=7)) == 7


def test_bad_source_budget_and_fraction(tiny_lacuna, tmp_path):
    data = load_data(tiny_lacuna.data_dir)
    with pytest.raises(ValueError, match="attack source 'wiki'"):
        attack_rows(data, "wiki", "email")
    with pytest.raises(ValueError, match="attack budget 'lots'"):
        attack_rows(data, "forget", "email", budget="lots")
    with pytest.raises(ValueError, match="budget must be >= 1"):
        attack_rows(data, "forget", "email", budget=0)
    with pytest.raises(ValueError, match="no split 'relearnx'"):
        attack_rows(data, "relearn_split", "email", relearn_split="relearnx")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Q1?"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: row 0 needs string fields"):
        attack_rows(data, "unrelated", "email", unrelated_file=bad)
    with pytest.raises(ValueError, match="eval_fraction"):
        holdout([{}, {}], 1.0)


def test_attack_relearns_an_unlearned_model(tiny_lacuna, tiny_email_rows, forget_nll, tmp_path):
    """grad_ascent raises the forget NLL; `attack=relearn source=forget` brings it back down (real Trainer)."""
    forget, _ = tiny_email_rows
    common = [f"data={tiny_lacuna.data_dir}", "field=email", "trainer.args.per_device_train_batch_size=4"]
    unlearned = tmp_path / "ga"
    proc = _app(
        "method=grad_ascent", f"model={tiny_lacuna.model_dir}", f"output_dir={unlearned}",
        "trainer.args.learning_rate=3e-3", "trainer.args.max_steps=4", *common, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    relearned = tmp_path / "relearned"
    proc = _app(
        "attack=relearn", "source=forget", "eval_fraction=0", f"model={unlearned}", f"output_dir={relearned}",
        "trainer.args.learning_rate=3e-3", "trainer.args.max_steps=6", *common, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = forget_nll(unlearned, forget), forget_nll(relearned, forget)
    assert after < before - 0.5, (before, after)
    manifest = json.loads((relearned / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "attack:relearn:forget" and manifest["config"]["source"] == "forget"
    assert manifest["train"]["num_train_epochs"] == 10 and manifest["train"]["learning_rate"] == 3e-3
    assert manifest["data"]["retain"] == 0 and manifest["eval"] is None


def test_attack_holdout_picks_the_best_checkpoint_and_lora_preset_merges(tiny_lacuna, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora_attack"
    proc = _app(
        "attack=relearn_lora", f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email",
        "source=forget_retain", "eval_steps=1", "trainer.args.max_steps=3", "trainer.args.per_device_train_batch_size=4",
        f"output_dir={out}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["lora"]["r"] == 16 and manifest["lora"]["lora_alpha"] == 8
    assert manifest["eval"]["rows"] >= 1 and manifest["eval"]["best"] is not None
    assert not (out / "adapter_config.json").exists() and not (out / "trainer").exists()
    AutoModelForCausalLM.from_pretrained(out, local_files_only=True)


def test_attack_needs_a_model(tiny_lacuna, tmp_path):
    proc = _app("attack=relearn", f"data={tiny_lacuna.data_dir}", f"output_dir={tmp_path / 'x'}", cwd=tmp_path)
    assert proc.returncode == 2 and "give model=UNLEARNED_CHECKPOINT" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_attack_end_to_end_on_the_smoke_testbed(smoke_testbed, tmp_path):
    """Unlearn (grad_ascent), then `lacuna attack` relearns on the forget rows: leaks come back."""
    from lacuna_unlearn.bench.cli.main import main

    unlearned = tmp_path / "ga"
    proc = _app(
        "method=grad_ascent", f"testbed={smoke_testbed}", "field=email", f"output_dir={unlearned}",
        "trainer.args.learning_rate=1e-3", "trainer.args.max_steps=8", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "attack"
    code = main(
        [
            "attack", "--model", str(unlearned), "--testbed", str(smoke_testbed), "--source", "forget",
            "--attempts", "4", "--out", str(out), "--set", "eval_fraction=0",
            "--set", "trainer.args.learning_rate=1e-3", "--set", "trainer.args.max_steps=30",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "attack.json").read_text())
    assert report["schema"] == {"name": "lacuna-bench/attack", "version": 3}
    assert (out / report["relearned"] / "config.json").is_file()  # relative: valid wherever the directory moves
    assert report["success_at_n_relearned"] >= report["success_at_n_unlearned"]
    assert report["leak_rate_relearned"] > report["leak_rate_unlearned"]
    assert report["persons"] == len(report["per_person"]) > 0
    assert (out / "relearned" / "model.safetensors").is_file() and not (tmp_path / "attack.partial").exists()
    assert report["manifest"]["config"]["source"] == "forget" and report["manifest"]["timings_seconds"]["relearn"] > 0


# -- frozen input embeddings (LACUNA's relearning freezes embed_tokens) ------------------------------------------
# docs/definitions.md#masked-continual-pretraining


def _compose(*overrides: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        return compose(config_name="unlearn", overrides=list(overrides))


@pytest.mark.parametrize(
    "preset,freeze",
    [("relearn_restricted", True), ("relearn_lora", True), ("relearn_restricted", False)],
)
def test_relearning_leaves_the_input_embeddings_bit_identical(tiny_lacuna, tmp_path, preset, freeze):
    """A relearning run trains every other weight (or LoRA adapters, merged) but not ``embed_tokens``: bit-identical
    after the run, recorded in the manifest; ``freeze_embeddings=false`` lets them move (the option is real)."""
    import torch
    from safetensors.torch import load_file

    from lacuna_unlearn.trainer.app import run

    out = tmp_path / f"{preset}_{freeze}"
    cfg = _compose(
        f"attack={preset}", f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email",
        "source=forget_retain", "eval_fraction=0", "trainer.args.max_steps=2", "trainer.args.learning_rate=1e-3",
        "trainer.args.per_device_train_batch_size=4", f"freeze_embeddings={str(freeze).lower()}", f"output_dir={out}",
    )  # fmt: skip
    run(cfg)
    before = load_file(str(tiny_lacuna.model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    name = "model.embed_tokens.weight"
    moved = [n for n in before if n != name and not torch.equal(before[n], after[n])]
    assert moved, "the relearning run trained nothing"
    assert torch.equal(before[name], after[name]) is freeze
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["config"]["freeze_embeddings"] is freeze
    if freeze:
        frozen = manifest["freeze_embeddings"]
        assert frozen["parameter"] == name and frozen["unchanged"] is True and frozen["tied_output"] is False
    else:
        assert manifest["freeze_embeddings"] is None
    assert manifest["labels"]["append_eos"] is True and manifest["labels"]["eos_appended"] is True
    assert manifest["labels"]["leading_special_ids"] == []  # the byte-level BPE built here adds no BOS


def test_the_optimizer_refuses_a_frozen_embedding(tiny_lacuna, tmp_path):
    """The trainer's optimizer is built from the restriction's parameters, which leave the frozen embeddings out;
    a frozen parameter that reached it anyway (AdamW's weight decay alone would move it) is an error."""
    from transformers import AutoModelForCausalLM, TrainingArguments

    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.trainer.loop import UnlearnTrainer, freeze_input_embeddings
    from lacuna_unlearn.trainer.restrict import check_optimizer, param_groups, parse_restriction

    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir)
    frozen = freeze_input_embeddings(model)
    resolved = parse_restriction("none").resolve(model)
    assert "model.embed_tokens.weight" not in resolved
    args = TrainingArguments(output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True, weight_decay=0.1)

    def trainer(groups):
        return UnlearnTrainer(
            model=model, args=args, method=make_method("finetune"), param_groups=groups, frozen=[frozen["weight"]]
        )

    optimizer = trainer(param_groups(model, resolved, 0.1)).create_optimizer()
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert id(frozen["weight"]) not in held and len(held) == len(resolved)
    check_optimizer(optimizer, model, resolved)
    with pytest.raises(RuntimeError, match="frozen parameter"):
        trainer([{"params": list(model.parameters()), "weight_decay": 0.1}]).create_optimizer()
