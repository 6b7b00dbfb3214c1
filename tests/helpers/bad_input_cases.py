"""The bad-input cases of every ``lacuna`` command and the real files they run on (tests of
tests/unlearn/bench/cli/test_bad_input_cli.py in-process, and a few through the console script in
tests/e2e/test_bad_input_console_scripts.py): tiny safetensors checkpoints with a config, real mask files, real
LACUNA data directories (``build_inputs``), and ``CASES``, each a command line with its exit code and culprits."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from lacuna_metrics.masks import MaskSet, build_masks, save_masks
from lacuna_metrics.weights.checkpoints import Checkpoint

BIN = Path(sys.executable).parent
LAYERS = 2


# -- real inputs ----------------------------------------------------------------------------------------------


def _state(seed: int) -> dict[str, torch.Tensor]:
    """A two-block Llama-shaped state dict (attention, MLP, norms, embeddings, untied head)."""
    g = torch.Generator().manual_seed(seed)
    state = {"model.embed_tokens.weight": torch.randn(32, 8, generator=g)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = torch.randn(8, 8, generator=g)
        state[p + "self_attn.k_proj.weight"] = torch.randn(8, 8, generator=g)
        state[p + "mlp.up_proj.weight"] = torch.randn(16, 8, generator=g)
        state[p + "mlp.down_proj.weight"] = torch.randn(8, 16, generator=g)
        state[p + "input_layernorm.weight"] = torch.ones(8)
    state["model.norm.weight"] = torch.ones(8)
    state["lm_head.weight"] = torch.randn(32, 8, generator=g)
    return state


def _checkpoint(path: Path, state: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {"model_type": "llama", "num_hidden_layers": LAYERS, "hidden_size": 8, "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps(config))
    return path


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def _rewrite_mask_metadata(src: Path, dest: Path, **changes: str) -> Path:
    """Copy a mask file with some metadata values replaced (what a hand-edited or foreign file looks like)."""
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"].update(changes)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    dest.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])
    return dest


def _lacuna_data(root: Path) -> Path:
    from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset

    profiles = generate_profiles(48, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=8, validation_people=4)
    return Path(write_dataset(root, profiles, splits))


def _mutated_data(good: Path, dest: Path, mutate: Callable[[list[dict]], None], split: str = "forget") -> Path:
    shutil.copytree(good, dest)
    file = dest / f"{split}.jsonl"
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    mutate(rows)
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


def _lm_eval_results(path: Path, model: str = "/nonexistent/model") -> Path:
    doc = {
        "results": {
            "lacuna_email_forget_qa": {"alias": "forget", "leak_rate,none": 0.1},
            "lacuna_email_retain_qa": {"alias": "retain", "accuracy,none": 0.9},
        },
        "configs": {t: {"task": t} for t in ("lacuna_email_forget_qa", "lacuna_email_retain_qa")},
        "config": {"model": "hf", "model_args": f"pretrained={model}"},
    }
    path.write_text(json.dumps(doc))
    return path


@dataclass
class Inputs:
    root: Path
    before: Path
    after: Path
    masks: Path
    masks_other_model: Path
    masks_stray_bit: Path
    masks_sign_bit: Path
    masks_overlap: Path
    masks_missing_tensor: Path
    masks_wrong_shape: Path
    after_other_shape: Path
    after_missing_tensor: Path
    after_int_weight: Path
    after_bool_weight: Path
    after_legacy_bin: Path
    after_nan: Path
    after_truncated: Path
    after_bad_index: Path
    after_bad_config: Path
    data: Path
    data_duplicate_id: Path
    data_missing_column: Path
    fake_testbed: Path
    a_file: Path
    lm_eval: Path
    garbage: Path
    bad_json: Path
    not_results: Path


def build_inputs(root: Path) -> Inputs:
    """Every input file of the cases, written under ``root``."""
    state = _state(0)
    before = _checkpoint(root / "before", state)
    after = _checkpoint(root / "after", {k: v + 0.01 * torch.randn_like(v) for k, v in state.items()})
    shapes = _shapes(state)
    masks_set = build_masks(shapes, LAYERS, skip_last=0, seed=1)
    fingerprint = Checkpoint(before).fingerprint()
    masks = save_masks(masks_set, root / "masks.safetensors", model_fingerprint=fingerprint)
    other = _checkpoint(root / "other_model", _state(5))  # same architecture, other weights
    masks_other = save_masks(
        masks_set, root / "masks_other.safetensors", model_fingerprint=Checkpoint(other).fingerprint()
    )

    q0 = "model.layers.0.self_attn.q_proj.weight"
    stray = {k: v.clone() for k, v in masks_set.packed.items()}
    stray[q0].view(-1)[3] = 1 << 6  # group 6 of a six-group file
    masks_stray = save_masks(MaskSet(stray, num_groups=6), root / "masks_stray.safetensors")
    ten = build_masks(shapes, LAYERS, num_groups=10, skip_last=0, seed=1)  # stored as int32
    ten.packed[q0].view(-1)[0] = -(2**31)
    masks_sign = save_masks(ten, root / "masks_sign.safetensors")
    masks_overlap = _rewrite_mask_metadata(masks, root / "masks_overlap.safetensors", retain_groups="0,1,3")
    extra = build_masks({**shapes, "model.layers.0.mlp.gate_proj.weight": (16, 8)}, LAYERS, skip_last=0, seed=1)
    masks_missing = save_masks(extra, root / "masks_missing.safetensors")
    wrong = build_masks({**shapes, q0: (8, 4)}, LAYERS, skip_last=0, seed=1)
    masks_wrong = save_masks(wrong, root / "masks_wrong.safetensors")

    up1 = "model.layers.1.mlp.up_proj.weight"
    after_shape = _checkpoint(root / "after_shape", {**state, up1: torch.zeros(16, 4)})
    after_missing = _checkpoint(root / "after_missing", {k: v for k, v in state.items() if k != up1})
    after_int = _checkpoint(root / "after_int", {**state, q0: state[q0].round().to(torch.int32)})
    after_bool = _checkpoint(root / "after_bool", {**state, q0: state[q0] > 0})
    legacy = root / "after_legacy"
    legacy.mkdir()
    torch.save(state, legacy / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    shutil.copy(before / "config.json", legacy / "config.json")
    nan = {k: v.clone() for k, v in state.items()}
    nan[up1][2, 3] = float("nan")
    after_nan = _checkpoint(root / "after_nan", nan)
    after_truncated = _checkpoint(root / "after_truncated", state)
    blob = (after_truncated / "model.safetensors").read_bytes()
    (after_truncated / "model.safetensors").write_bytes(blob[: len(blob) - 100])
    after_index = root / "after_index"
    after_index.mkdir()
    save_file(state, str(after_index / "model-00001-of-00001.safetensors"))
    (after_index / "model.safetensors.index.json").write_text('{"weight_map": {')
    # no lm_head: whether it is tied to the embedding is read from config.json
    after_config = _checkpoint(root / "after_config", {k: v for k, v in state.items() if k != "lm_head.weight"})
    (after_config / "config.json").write_text("{not json")

    data = _lacuna_data(root / "data")

    def duplicate(rows: list[dict]) -> None:
        rows[1] = {**rows[1], "ID": rows[0]["ID"]}

    def drop_answer(rows: list[dict]) -> None:
        rows[0].pop("answer")

    fake_testbed = root / "fake_testbed"
    (fake_testbed / "model").mkdir(parents=True)
    (fake_testbed / "manifest.json").write_text('{"kind": "lacuna-bench-testbed"}')
    a_file = root / "a_file.txt"
    a_file.write_text("a regular file, used where a directory is expected\n")
    garbage = root / "garbage.safetensors"
    garbage.write_bytes(os.urandom(256))
    bad_json = root / "bad.json"
    bad_json.write_text('{"results": {')
    not_results = root / "not_results.json"
    not_results.write_text('{"hello": "world"}')
    return Inputs(
        root=root,
        before=before,
        after=after,
        masks=masks,
        masks_other_model=masks_other,
        masks_stray_bit=masks_stray,
        masks_sign_bit=masks_sign,
        masks_overlap=masks_overlap,
        masks_missing_tensor=masks_missing,
        masks_wrong_shape=masks_wrong,
        after_other_shape=after_shape,
        after_missing_tensor=after_missing,
        after_int_weight=after_int,
        after_bool_weight=after_bool,
        after_legacy_bin=legacy,
        after_nan=after_nan,
        after_truncated=after_truncated,
        after_bad_index=after_index,
        after_bad_config=after_config,
        data=data,
        data_duplicate_id=_mutated_data(data, root / "data_dup", duplicate),
        data_missing_column=_mutated_data(data, root / "data_noanswer", drop_answer),
        fake_testbed=fake_testbed,
        a_file=a_file,
        lm_eval=_lm_eval_results(root / "lm_eval.json"),
        garbage=garbage,
        bad_json=bad_json,
        not_results=not_results,
    )


# -- the cases --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """``argv(inputs, out)`` -> the command line; ``named(inputs, out)`` -> strings stderr must contain."""

    argv: Callable[[Inputs, Path], list[str]]
    named: Callable[[Inputs, Path], list[str]]
    code: int = 2


def _score(i: Inputs, out: Path, *extra: str, after: Path | None = None, masks: Path | None = None) -> list[str]:
    argv = ["score", "--after", str(after or i.after), "--before", str(i.before), "--out", str(out), "--quiet"]
    argv += ["--masks", str(masks or i.masks), "--no-frag", "--composite-samples", "0", "--scores", "raw"]
    return argv + list(extra)


def _frag_only(i: Inputs, out: Path, *extra: str) -> list[str]:
    """FRAG and distances only (no masks): the calibration text matters."""
    return ["score", "--after", str(i.after), "--before", str(i.before), "--no-masks", "--out", str(out), *extra]


def _attack(i: Inputs, out: Path, *extra: str, data: Path | None = None) -> list[str]:
    return ["attack", "--model", str(i.before), "--data", str(data or i.data), "--out", str(out), *extra]


def _diagnose(i: Inputs, out: Path, *extra: str) -> list[str]:
    return ["diagnose", "--reference", str(i.before), "--updated", str(i.after), "--data", str(i.data), "--out",
            str(out), *extra]  # fmt: skip


def _rev(i: Inputs, out: Path, *extra: str, original: Path | None = None) -> list[str]:
    lm = str(i.lm_eval)
    return ["reversibility", "--original", str(original or i.lm_eval), "--unlearned", lm, "--relearned", lm,
            "--out", str(out / "rev.json"), *extra]  # fmt: skip


def _gate(i: Inputs, out: Path, *extra: str, results: Path | None = None) -> list[str]:
    return ["gate", str(results or i.lm_eval), "--json", str(out / "gate.json"), *extra]


C = Case
CASES: dict[str, Case] = {
    # -- missing path ------------------------------------------------------------------------------------------
    "missing-path/score-after": C(
        lambda i, o: _score(i, o, after=i.root / "nope"), lambda i, o: ["--after", str(i.root / "nope")]
    ),
    "missing-path/score-before": C(
        lambda i, o: [*_score(i, o), "--before", str(i.root / "nope")], lambda i, o: ["--before", "nope"]
    ),
    "missing-path/score-masks": C(
        lambda i, o: _score(i, o, masks=i.root / "nope.safetensors"), lambda i, o: ["--masks", "nope.safetensors"]
    ),
    "missing-path/score-testbed-not-a-testbed": C(
        lambda i, o: ["score", "--after", str(i.after), "--testbed", str(i.data), "--out", str(o)],
        lambda i, o: ["--testbed", str(i.data), "not a testbed"],
    ),
    "missing-path/score-calib-forget": C(
        lambda i, o: _frag_only(i, o, "--calib-forget", str(i.root / "nope.jsonl"), "--calib-retain", str(i.data)),
        lambda i, o: ["--calib-forget", "nope.jsonl"],
    ),
    "missing-path/score-crossfield": C(
        lambda i, o: _score(i, o, "--crossfield", str(i.root / "nope")), lambda i, o: ["--crossfield", "nope"]
    ),
    "missing-path/attack-model": C(
        lambda i, o: ["attack", "--model", str(i.root / "nope"), "--data", str(i.data), "--out", str(o)],
        lambda i, o: ["--model", "nope"],
    ),
    "missing-path/attack-testbed": C(
        lambda i, o: ["attack", "--model", str(i.before), "--testbed", str(i.root / "nope"), "--out", str(o)],
        lambda i, o: ["--testbed", "nope"],
    ),
    "missing-path/attack-data": C(lambda i, o: _attack(i, o, data=i.root / "nope"), lambda i, o: ["--data", "nope"]),
    "missing-path/attack-no-data": C(
        lambda i, o: ["attack", "--model", str(i.before), "--out", str(o)], lambda i, o: ["--testbed", "--data"]
    ),
    "missing-path/attack-unrelated-file": C(
        lambda i, o: _attack(i, o, "--source", "unrelated", "--set", f"unrelated_file={i.root / 'nope.jsonl'}"),
        lambda i, o: ["unrelated_file", "nope.jsonl"],
    ),
    "missing-path/diagnose-reference": C(
        lambda i, o: [*_diagnose(i, o), "--reference", str(i.root / "nope")], lambda i, o: ["--reference", "nope"]
    ),
    "missing-path/diagnose-updated": C(
        lambda i, o: [*_diagnose(i, o), "--updated", str(i.root / "nope")], lambda i, o: ["--updated", "nope"]
    ),
    "missing-path/diagnose-queries-file": C(
        lambda i, o: [*_diagnose(i, o), "--queries", str(i.root / "nope.txt")], lambda i, o: ["--queries", "nope.txt"]
    ),
    "missing-path/diagnose-queries-without-data": C(
        lambda i, o: ["diagnose", "--reference", str(i.before), "--updated", str(i.after), "--out", str(o)],
        lambda i, o: ["--queries forget", "--testbed", "--data"],
    ),
    "missing-path/reversibility-original": C(
        lambda i, o: _rev(i, o, original=i.root / "nope.json"), lambda i, o: ["--original", "nope.json"]
    ),
    "missing-path/reversibility-diagnose": C(
        lambda i, o: _rev(i, o, "--diagnose", str(i.root / "nope.json")), lambda i, o: ["--diagnose", "nope.json"]
    ),
    "missing-path/gate-results": C(
        lambda i, o: _gate(i, o, "--max-leak", "0.5", results=i.root / "nope.json"), lambda i, o: ["nope.json"]
    ),
    "missing-path/gate-score": C(
        lambda i, o: _gate(i, o, "--min-auc", "0.6", "--score", str(i.root / "nope_score.json")),
        lambda i, o: ["nope_score.json"],
    ),
    "missing-path/run-config": C(
        lambda i, o: ["run", "--config", str(i.root / "nope.yaml"), "--out", str(o)], lambda i, o: ["nope.yaml"]
    ),
    "missing-path/build-testbed-model": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--model", str(i.root / "nope"), "--out", str(o)],
        lambda i, o: ["--model", "nope"],
    ),
    # -- unwritable output -------------------------------------------------------------------------------------
    "unwritable-output/build-testbed-out-under-a-file": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(i.a_file / "tb")],
        lambda i, o: ["--out", str(i.a_file)],
    ),
    "unwritable-output/build-testbed-out-exists": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(i.data)], lambda i, o: [str(i.data), "exists"]
    ),
    "unwritable-output/build-testbed-force-on-a-non-testbed": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(i.data), "--force"],
        lambda i, o: [str(i.data), "not a lacuna-bench testbed"],
    ),
    "unwritable-output/score-out-is-a-file": C(
        lambda i, o: [*_score(i, o), "--out", str(i.a_file)], lambda i, o: ["--out", str(i.a_file)]
    ),
    "unwritable-output/score-out-under-a-file": C(
        lambda i, o: [*_score(i, o), "--out", str(i.a_file / "x")], lambda i, o: ["--out", str(i.a_file)]
    ),
    "unwritable-output/score-activation-cache-under-a-file": C(
        lambda i, o: [*_score(i, o), "--activation-cache", str(i.a_file / "cache")],
        lambda i, o: ["--activation-cache", str(i.a_file)],
    ),
    "unwritable-output/attack-out-exists": C(
        lambda i, o: _attack(i, i.root), lambda i, o: ["--out", str(i.root), "exists", "--force"]
    ),
    "unwritable-output/attack-out-under-a-file": C(
        lambda i, o: _attack(i, i.a_file / "attack"), lambda i, o: ["--out", str(i.a_file)]
    ),
    "unwritable-output/diagnose-out-under-a-file": C(
        lambda i, o: [*_diagnose(i, o), "--out", str(i.a_file / "d")], lambda i, o: ["--out", str(i.a_file)]
    ),
    "unwritable-output/reversibility-out-under-a-file": C(
        lambda i, o: [*_rev(i, o), "--out", str(i.a_file / "rev.json")], lambda i, o: ["--out", str(i.a_file)]
    ),
    "unwritable-output/reversibility-out-is-a-directory": C(
        lambda i, o: [*_rev(i, o), "--out", str(i.root)], lambda i, o: ["--out", str(i.root), "directory"]
    ),
    "unwritable-output/gate-json-under-a-file": C(
        lambda i, o: [*_gate(i, o, "--max-leak", "0.5"), "--json", str(i.a_file / "g.json")],
        lambda i, o: ["--json", str(i.a_file)],
    ),
    "unwritable-output/gate-junit-is-a-directory": C(
        lambda i, o: _gate(i, o, "--max-leak", "0.5", "--junit", str(i.root)), lambda i, o: ["--junit", str(i.root)]
    ),
    "unwritable-output/run-out-under-a-file": C(
        lambda i, o: ["run", "--preset", "smoke", "--out", str(i.a_file / "run")], lambda i, o: [str(i.a_file)]
    ),
    # -- malformed JSON / YAML ---------------------------------------------------------------------------------
    "malformed-json/gate-results": C(
        lambda i, o: _gate(i, o, "--max-leak", "0.5", results=i.bad_json), lambda i, o: [str(i.bad_json), "JSON"]
    ),
    "malformed-json/gate-score": C(
        lambda i, o: _gate(i, o, "--min-auc", "0.5", "--score", str(i.bad_json)), lambda i, o: [str(i.bad_json)]
    ),
    "malformed-json/gate-not-a-results-file": C(
        lambda i, o: _gate(i, o, "--max-leak", "0.5", results=i.not_results), lambda i, o: [str(i.not_results)]
    ),
    "malformed-json/reversibility-original": C(
        lambda i, o: _rev(i, o, original=i.bad_json), lambda i, o: [str(i.bad_json)]
    ),
    "malformed-json/reversibility-diagnose": C(
        lambda i, o: _rev(i, o, "--diagnose", str(i.bad_json)), lambda i, o: ["--diagnose", str(i.bad_json)]
    ),
    "malformed-json/reversibility-task-absent": C(
        lambda i, o: [*_rev(i, o), "--field", "phone"], lambda i, o: ["lacuna_phone_forget_qa", str(i.lm_eval)]
    ),
    "malformed-json/score-shard-index": C(
        lambda i, o: _score(i, o, after=i.after_bad_index), lambda i, o: ["model.safetensors.index.json"]
    ),
    "malformed-json/score-config": C(
        lambda i, o: _score(i, o, after=i.after_bad_config), lambda i, o: [str(i.after_bad_config / "config.json")]
    ),
    "malformed-yaml/run-config": C(
        lambda i, o: ["run", "--config", str(i.bad_json.with_suffix(".yaml")), "--out", str(o)],
        lambda i, o: [str(i.bad_json.with_suffix(".yaml"))],
    ),
    # -- unknown override key ----------------------------------------------------------------------------------
    "unknown-key/attack-set-attack.attempts": C(
        lambda i, o: _attack(i, o, "--set", "attack.attempts=abc"),
        lambda i, o: ["attack.attempts: no such setting", "--attempts"],
    ),
    "unknown-key/attack-set-typo": C(lambda i, o: _attack(i, o, "--set", "seeed=1"), lambda i, o: ["seeed"]),
    "unknown-key/attack-set-trainer-arg": C(
        lambda i, o: _attack(i, o, "--set", "+trainer.args.no_such_arg=1"), lambda i, o: ["trainer.args.no_such_arg"]
    ),
    "unknown-key/attack-set-no-equals": C(
        lambda i, o: _attack(i, o, "--set", "learning_rate"), lambda i, o: ["learning_rate"]
    ),
    "unknown-key/score-scores": C(lambda i, o: _score(i, o, "--scores", "raw,bogus"), lambda i, o: ["bogus"]),
    "unknown-key/score-frag-target": C(
        lambda i, o: _frag_only(i, o, "--frag-target", "everything"),
        lambda i, o: ["everything"],
    ),
    "unknown-key/gate-check-metric-syntax": C(
        lambda i, o: _gate(i, o, "--check", "forget_leak=0.5"), lambda i, o: ["forget_leak=0.5"]
    ),
    "unknown-key/gate-no-criteria": C(lambda i, o: _gate(i, o), lambda i, o: ["no criteria"]),
    "unknown-key/run-set-typo": C(
        lambda i, o: ["run", "--out", str(o), "--set", "attack.atempts=5"], lambda i, o: ["attack.atempts"]
    ),
    "unknown-key/attack-protocol": C(
        lambda i, o: _attack(i, o, "--protocol", "relearn_all"), lambda i, o: ["relearn_all"]
    ),
    "unknown-key/build-testbed-set-typo": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(o), "--set", "pii_stepz=3"],
        lambda i, o: ["pii_stepz"],
    ),
    "unknown-key/build-testbed-set-no-equals": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(o), "--set", "noequals"],
        lambda i, o: ["noequals"],
    ),
    "unknown-key/build-testbed-preset": C(
        lambda i, o: ["build-testbed", "--preset", "huge", "--out", str(o)], lambda i, o: ["--preset", "huge"]
    ),
    # -- bad override value ------------------------------------------------------------------------------------
    "bad-value/build-testbed-set-steps": C(
        lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(o), "--set", "pii_steps=abc"],
        lambda i, o: ["pii_steps"],
    ),
    "bad-value/attack-attempts-abc": C(lambda i, o: _attack(i, o, "--attempts", "abc"), lambda i, o: ["--attempts"]),
    "bad-value/attack-attempts-zero": C(lambda i, o: _attack(i, o, "--attempts", "0"), lambda i, o: ["--attempts"]),
    "bad-value/attack-batch-size": C(lambda i, o: _attack(i, o, "--batch-size", "-1"), lambda i, o: ["--batch-size"]),
    "bad-value/attack-budget": C(lambda i, o: _attack(i, o, "--budget", "lots"), lambda i, o: ["--budget", "lots"]),
    "bad-value/attack-learning-rate": C(
        lambda i, o: _attack(i, o, "--set", "trainer.args.learning_rate=abc"),
        lambda i, o: ["trainer.args.learning_rate: expected a number, got 'abc'"],
    ),
    "bad-value/attack-max-steps": C(
        lambda i, o: _attack(i, o, "--set", "trainer.args.max_steps=2.5"),
        lambda i, o: ["trainer.args.max_steps: expected an integer, got 2.5"],
    ),
    "unknown-key/attack-method": C(
        lambda i, o: _attack(i, o, "--set", "method=nosuch"), lambda i, o: ["method/nosuch", "finetune"]
    ),
    "bad-value/attack-eval-fraction": C(
        lambda i, o: _attack(i, o, "--set", "eval_fraction=1.5"), lambda i, o: ["eval_fraction=1.5"]
    ),
    "bad-value/attack-source": C(lambda i, o: _attack(i, o, "--source", "everyone"), lambda i, o: ["everyone"]),
    "bad-value/score-gamma-nan": C(lambda i, o: _score(i, o, "--gamma", "nan"), lambda i, o: ["--gamma", "nan"]),
    "bad-value/score-frag-min-coverage": C(
        lambda i, o: _score(i, o, "--frag-min-coverage", "2"), lambda i, o: ["--frag-min-coverage"]
    ),
    "bad-value/score-calib-samples": C(
        lambda i, o: _score(i, o, "--calib-samples", "0"), lambda i, o: ["--calib-samples"]
    ),
    "bad-value/score-threads": C(lambda i, o: _score(i, o, "--threads", "zero"), lambda i, o: ["--threads", "zero"]),
    "bad-value/diagnose-n": C(lambda i, o: [*_diagnose(i, o), "--n", "0"], lambda i, o: ["--n"]),
    "bad-value/diagnose-max-length": C(
        lambda i, o: [*_diagnose(i, o), "--max-length", "long"], lambda i, o: ["--max-length", "long"]
    ),
    "bad-value/reversibility-tau-rev": C(lambda i, o: _rev(i, o, "--tau-rev", "inf"), lambda i, o: ["--tau-rev"]),
    "bad-value/gate-min-auc": C(lambda i, o: _gate(i, o, "--min-auc", "high"), lambda i, o: ["--min-auc", "high"]),
    "bad-value/gate-check-threshold": C(
        lambda i, o: _gate(i, o, "--check", "forget_leak<=abc"), lambda i, o: ["forget_leak<=abc"]
    ),
    "bad-value/run-set-attempts": C(
        lambda i, o: ["run", "--out", str(o), "--set", "attack.attempts=abc"], lambda i, o: ["attack.attempts"]
    ),
    # issues 35 and 37: refused before any stage, the key named
    "bad-value/run-method-override": C(
        lambda i, o: ["run", "--out", str(o), "--set", "methods={grad_diff: ['trainer.args.learning_rate=abc']}"],
        lambda i, o: ["methods.grad_diff", "trainer.args.learning_rate"],
    ),
    "unknown-key/run-method-override": C(
        lambda i, o: ["run", "--out", str(o), "--set", "methods={grad_diff: ['trainer.args.nope=1']}"],
        lambda i, o: ["methods.grad_diff", "trainer.args.nope"],
    ),
    "bad-value/run-attack-override": C(
        lambda i, o: ["run", "--out", str(o), "--set", "attack.overrides=['trainer.args.max_steps=1.5']"],
        lambda i, o: ["attack.overrides", "trainer.args.max_steps"],
    ),
    "bad-value/run-stopping-metric-not-computed": C(
        lambda i, o: ["run", "--preset", "smoke", "--out", str(o), "--set", "stopping.metric=j_w"],
        lambda i, o: ["stopping.metric=j_w", "forget_worstcase"],
    ),
    "bad-value/run-regime-rule": C(
        lambda i, o: ["run", "--out", str(o), "--set", "regime.rule=paper"], lambda i, o: ["regime.rule"]
    ),
    "bad-value/run-tau-ppl": C(
        lambda i, o: ["run", "--out", str(o), "--set", "regime.tau_ppl=0.5"], lambda i, o: ["regime.tau_ppl"]
    ),
    "bad-value/run-min-suppression": C(
        lambda i, o: ["run", "--out", str(o), "--set", "reversibility.min_suppression=2"],
        lambda i, o: ["reversibility.min_suppression"],
    ),
    "bad-value/run-null-draws": C(
        lambda i, o: ["run", "--out", str(o), "--set", "score.null_draws=1"], lambda i, o: ["score.null_draws"]
    ),
    "bad-value/score-null-z": C(lambda i, o: _score(i, o, "--null-z", "inf"), lambda i, o: ["--null-z"]),
    "bad-value/score-null-draws": C(lambda i, o: _score(i, o, "--null-draws", "1"), lambda i, o: ["--null-draws"]),
    # -- mismatched checkpoints --------------------------------------------------------------------------------
    "mismatched-checkpoints/score-shape": C(
        lambda i, o: _score(i, o, after=i.after_other_shape), lambda i, o: ["model.layers.1.mlp.up_proj.weight"]
    ),
    "mismatched-checkpoints/score-missing-tensor": C(
        lambda i, o: _score(i, o, after=i.after_missing_tensor), lambda i, o: ["model.layers.1.mlp.up_proj.weight"]
    ),
    "mismatched-checkpoints/score-masks-of-another-model": C(
        lambda i, o: _score(i, o, masks=i.masks_other_model),
        lambda i, o: [
            str(i.masks_other_model),
            Checkpoint(i.root / "other_model").fingerprint(),
            Checkpoint(i.before).fingerprint(),
            "--allow-mask-mismatch",
        ],
    ),
    "mismatched-checkpoints/score-control-without-pair": C(
        lambda i, o: _score(i, o, "--control-before", str(i.before)), lambda i, o: ["--control-after"]
    ),
    # -- bad masks ---------------------------------------------------------------------------------------------
    "bad-masks/bit-beyond-num-groups": C(
        lambda i, o: _score(i, o, masks=i.masks_stray_bit),
        lambda i, o: ["model.layers.0.self_attn.q_proj.weight", "bit 6", "num_groups=6"],
    ),
    "bad-masks/sign-bit-of-int32-field": C(
        lambda i, o: _score(i, o, masks=i.masks_sign_bit),
        lambda i, o: ["model.layers.0.self_attn.q_proj.weight", "bit 31", "num_groups=10"],
    ),
    "bad-masks/overlapping-forget-retain-groups": C(
        lambda i, o: _score(i, o, masks=i.masks_overlap), lambda i, o: [str(i.masks_overlap), "overlap"]
    ),
    "bad-masks/tensor-missing-from-model": C(
        lambda i, o: _score(i, o, masks=i.masks_missing_tensor), lambda i, o: ["model.layers.0.mlp.gate_proj.weight"]
    ),
    "bad-masks/shape-differs": C(
        lambda i, o: _score(i, o, masks=i.masks_wrong_shape), lambda i, o: ["model.layers.0.self_attn.q_proj.weight"]
    ),
    "bad-masks/not-a-mask-file": C(
        lambda i, o: _score(i, o, masks=i.before / "model.safetensors"),
        lambda i, o: [str(i.before / "model.safetensors"), "lacuna-bench-masks"],
    ),
    "bad-masks/garbage-bytes": C(lambda i, o: _score(i, o, masks=i.garbage), lambda i, o: [str(i.garbage)]),
    # -- bad tensors -------------------------------------------------------------------------------------------
    "bad-tensors/integer-weight": C(
        lambda i, o: _score(i, o, after=i.after_int_weight),
        lambda i, o: ["model.layers.0.self_attn.q_proj.weight", "I32"],
    ),
    "bad-tensors/bool-weight": C(
        lambda i, o: _score(i, o, after=i.after_bool_weight),
        lambda i, o: ["model.layers.0.self_attn.q_proj.weight", "BOOL"],
    ),
    "bad-tensors/legacy-pytorch-bin": C(
        lambda i, o: _score(i, o, after=i.after_legacy_bin), lambda i, o: ["pytorch_model.bin", "legacy", "convert"]
    ),
    "bad-tensors/nan-in-after": C(
        lambda i, o: _score(i, o, after=i.after_nan), lambda i, o: ["model.layers.1.mlp.up_proj.weight", "NaN"]
    ),
    "bad-tensors/truncated-safetensors": C(
        lambda i, o: _score(i, o, after=i.after_truncated), lambda i, o: [str(i.after_truncated / "model.safetensors")]
    ),
    # -- bad data ----------------------------------------------------------------------------------------------
    "bad-data/attack-duplicate-id": C(
        lambda i, o: _attack(i, o, data=i.data_duplicate_id), lambda i, o: ["forget", "ID"]
    ),
    "bad-data/attack-missing-column": C(
        lambda i, o: _attack(i, o, data=i.data_missing_column), lambda i, o: ["forget.jsonl", "answer"]
    ),
    "bad-data/diagnose-duplicate-id": C(
        lambda i, o: [*_diagnose(i, o), "--data", str(i.data_duplicate_id)], lambda i, o: ["forget", "ID"]
    ),
    "bad-data/score-calibration-missing-column": C(
        lambda i, o: _frag_only(i, o, "--calib-forget", str(i.data_missing_column), "--calib-retain", str(i.data)),
        lambda i, o: ["forget.jsonl", "answer"],
    ),
}


def _left_behind(out: Path) -> list[Path]:
    """Anything a refused command wrote: its output, a ``.partial`` beside it, a staging directory in it."""
    found = [p for p in (out, out.with_name(out.name + ".partial")) if p.exists()]
    return found + list(out.parent.glob(".staging-*"))
