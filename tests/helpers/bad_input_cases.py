"""The bad-input cases of every ``lacuna`` command and the real files they run on (tests of
tests/unlearn/bench/cli/test_bad_input_cli.py in-process, and a few through the console script in
tests/e2e/test_bad_input_console_scripts.py): tiny safetensors checkpoints with a config, real mask files, real
LACUNA data directories (``build_inputs``), and ``CASES``, each a command line with its exit code and culprits."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
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


def _release_data(data: Path, dest: Path) -> Path:
    """``data`` as LACUNA's released data directory ``dest`` (``data-<regime>``: card and parquet files,
    tests/helpers/release.py)."""
    from helpers.release import release_tables, write_release_data
    from lacuna_tasks.loader import load_data, read_rows

    profiles = {str(p["Unique ID"]): p for p in read_rows(data / "profiles.jsonl")}
    return write_release_data(dest, release_tables(load_data(data).splits, profiles))


def _broken_release(good: Path, dest: Path, name: str, change: Callable[[Any], Any] | None = None) -> Path:
    """A copy of the release ``good`` whose ``data/<name>`` is rewritten by ``change`` (a pyarrow table -> table) or,
    without one, deleted (the card still naming it)."""
    import pyarrow.parquet as pq

    shutil.copytree(good, dest)
    file = dest / "data" / name
    if change is None:
        file.unlink()
    else:
        pq.write_table(change(pq.read_table(file)), file)
    return dest


def _release_regime(size_dir: Path, regime: str, model: Path, masks: Any | None) -> Path:
    """``size_dir/regime`` as LACUNA's release lays a regime out: the model (also as ``intruction_tuned/``) and, given
    a MaskSet, its ``mask.pt`` (name -> flat int32); the data must be ``size_dir/data-<regime>``."""
    import torch

    regime_dir = size_dir / regime
    shutil.copytree(model, regime_dir / "intruction_tuned")
    shutil.copy(model / "model.safetensors", regime_dir / "model.safetensors")
    if masks is not None:
        torch.save({n: t.reshape(-1).clone() for n, t in masks.packed.items()}, regime_dir / "mask.pt")
    return regime_dir


def _fake_testbed(root: Path, data: Path | None = None) -> Path:
    """A directory that passes the 'is a testbed' check (manifest.json, model/), with ``data`` copied in."""
    (root / "model").mkdir(parents=True)
    (root / "manifest.json").write_text('{"kind": "lacuna-bench-testbed"}')
    if data is not None:
        shutil.copytree(data, root / "data")
    return root


def _not_utf8(good: Path, dest: Path) -> Path:
    """A copy of ``good`` whose forget.jsonl holds the bytes ``\\xff\\xfe`` in its third row's question."""
    shutil.copytree(good, dest)
    file = dest / "forget.jsonl"
    lines = file.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"question": "', b'"question": "\xff\xfe', 1)
    file.write_bytes(b"".join(lines))
    return dest


def _unreadable(good: Path, dest: Path) -> Path:
    """A copy of ``good`` whose forget.jsonl has mode 000 (as root, which reads it anyway, :func:`deny_reads`
    stands in); returns that file."""
    shutil.copytree(good, dest)
    file = dest / "forget.jsonl"
    file.chmod(0)
    return file


def deny_reads(monkeypatch: Any, file: Path) -> None:
    """Opening ``file`` to read raises what the kernel raises for a mode-000 file. Needed as root only (root reads
    any file); elsewhere the file's mode does it."""
    if os.geteuid() != 0:
        return
    real = io.open

    def guarded(target: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(target, int) and os.path.abspath(os.fspath(target)) == str(file):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(target))
        return real(target, *args, **kwargs)

    monkeypatch.setattr(io, "open", guarded)
    monkeypatch.setattr(builtins, "open", guarded)


class _Disk:
    """The bytes left on a simulated disk holding the paths that start with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...], free: int) -> None:
        self.prefixes, self.free = prefixes, free

    def holds(self, target: Any) -> bool:
        path = os.readlink(f"/proc/self/fd/{target}") if isinstance(target, int) else os.fspath(target)
        return os.path.abspath(path).startswith(self.prefixes)

    def take(self, size: int) -> None:
        if size > self.free:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # write(2)'s: no file name
        self.free -= size


class _FileOnDisk:
    """A file opened for writing on a :class:`_Disk`: opening works, a write past the free bytes fails."""

    def __init__(self, handle: Any, disk: _Disk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data: Any) -> int:
        self._disk.take(len(data))
        return self._handle.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __iter__(self) -> Any:
        return iter(self._handle)

    def __enter__(self) -> _FileOnDisk:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.close()


def full_disk(monkeypatch: Any, out: Path, free: int = 0) -> None:
    """Put ``out`` (and ``OUT.partial``, and the ``.OUT*`` temp and lock files beside it) on a disk with ``free``
    bytes left, as the package sees one: creating files works, a write past the free bytes fails with ENOSPC and
    no file name, through open, Path.open, os.fdopen, os.write and safetensors' save_file."""
    disk = _Disk((str(out), str(out.parent / f".{out.name}")), free)
    real_open, real_fdopen, real_write = io.open, os.fdopen, os.write

    def wrap(handle: Any, target: Any, mode: str) -> Any:
        writes = any(c in mode for c in "wax+")
        return _FileOnDisk(handle, disk) if writes and disk.holds(target) else handle

    def open_(target: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return wrap(real_open(target, mode, *args, **kwargs), target, mode)

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return wrap(real_fdopen(fd, mode, *args, **kwargs), fd, mode)

    def write(fd: int, data: Any) -> int:
        if disk.holds(fd):
            disk.take(len(data))
        return real_write(fd, data)

    import safetensors.torch
    from safetensors import SafetensorError

    real_save = safetensors.torch.save_file

    def save_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> None:
        if disk.holds(filename):
            try:
                disk.take(sum(t.numel() * t.element_size() for t in tensors.values()))
            except OSError:
                raise SafetensorError(
                    "Error while serializing: I/O error: No space left on device (os error 28)"
                ) from None
        real_save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "fdopen", fdopen)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def symlink_loop(where: Path) -> Path:
    """``where/loop_a -> loop_b``, ``loop_b -> loop_a``; returns ``loop_a``."""
    where.mkdir(parents=True, exist_ok=True)
    a, b = where / "loop_a", where / "loop_b"
    if not a.is_symlink():
        a.symlink_to(b)
        b.symlink_to(a)
    return a


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
    data_not_utf8: Path
    data_unreadable: Path
    release: Path
    release_missing_config: Path
    release_card_missing_file: Path
    release_renamed_column: Path
    release_group_id_float: Path
    release_masked: Path
    release_unmasked: Path
    release_other_mask: Path
    release_group_seven: Path
    neither_layout: Path
    testbed_not_utf8: Path
    testbed_unreadable: Path
    queries_not_utf8: Path
    config_not_utf8: Path
    results_not_utf8: Path
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

    release = _release_data(data, root / "OLMo2-1B" / "data-masked")
    release_missing = _broken_release(release, root / "release_missing_config", "Email_Address_forget.parquet")
    (release_missing / "README.md").unlink()  # no card: the files are classified by name, one is missing
    release_card = _broken_release(release, root / "release_card_missing_file", "Birth_City_retain.parquet")
    release_renamed = _broken_release(
        release,
        root / "release_renamed_column",
        "Drivers_License_retain.parquet",
        lambda t: t.rename_columns(["Question" if n == "question" else n for n in t.column_names]),
    )
    release_float = _broken_release(
        release,
        root / "release_group_id_float",
        "Phone_Number_forget.parquet",
        lambda t: t.set_column(t.column_names.index("group_id"), "group_id", t.column("group_id").cast("float64")),
    )
    # LACUNA's release as a testbed: its masked and unmasked regimes beside their data, a mask.pt of another model,
    # and data whose group_id lies beyond the mask's six groups
    release_masked = _release_regime(root / "OLMo2-1B", "masked", before, masks_set)
    shutil.copytree(release, root / "OLMo2-1B" / "data-unmasked")
    release_unmasked = _release_regime(root / "OLMo2-1B", "unmasked", before, None)
    release_other_mask = _release_regime(root / "other_mask" / "OLMo2-1B", "masked", before, wrong)
    shutil.copytree(release, root / "other_mask" / "OLMo2-1B" / "data-masked")
    release_group_seven = _release_regime(root / "group_seven" / "OLMo2-1B", "masked", before, masks_set)
    _broken_release(
        release,
        root / "group_seven" / "OLMo2-1B" / "data-masked",
        "relearn_train.parquet",
        lambda t: t.set_column(
            t.column_names.index("group_id"), "group_id", pa.array([7] * t.num_rows, type=pa.int32())
        ),
    )
    neither = root / "neither_layout"
    (neither / "downloads").mkdir(parents=True)
    (neither / "notes.txt").write_text("neither lacuna-bench's layout nor LACUNA's release\n")
    fake_testbed = _fake_testbed(root / "fake_testbed")
    not_utf8 = _not_utf8(data, root / "data_not_utf8")
    unreadable = _unreadable(data, root / "data_unreadable")
    tb_not_utf8 = _fake_testbed(root / "tb_not_utf8", data=not_utf8)
    tb_unreadable = _unreadable(data, _fake_testbed(root / "tb_unreadable") / "data")
    queries = root / "queries.txt"
    queries.write_bytes(b"a query\nanother \xff\xfe query\n")
    config = root / "run_config.yaml"
    config.write_bytes(b"attack:\n  attempts: 5 # \xff\xfe\n")
    results_bad = _lm_eval_results(root / "lm_eval_not_utf8.json")
    results_bad.write_bytes(results_bad.read_bytes().replace(b"forget", b"f\xffrget", 1))
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
        data_not_utf8=not_utf8,
        data_unreadable=unreadable.parent,
        release=release,
        release_missing_config=release_missing,
        release_card_missing_file=release_card,
        release_renamed_column=release_renamed,
        release_group_id_float=release_float,
        release_masked=release_masked,
        release_unmasked=release_unmasked,
        release_other_mask=release_other_mask,
        release_group_seven=release_group_seven,
        neither_layout=neither,
        testbed_not_utf8=tb_not_utf8,
        testbed_unreadable=tb_unreadable.parent.parent,
        queries_not_utf8=queries,
        config_not_utf8=config,
        results_not_utf8=results_bad,
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
    """``argv(inputs, out)`` -> the command line; ``named(inputs, out)`` -> strings stderr must contain;
    ``setup(inputs, out, monkeypatch)``: the fault, made before the command runs (a full disk, a symlink loop)."""

    argv: Callable[[Inputs, Path], list[str]]
    named: Callable[[Inputs, Path], list[str]]
    code: int = 2
    setup: Callable[[Inputs, Path, Any], Any] | None = None


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
    "unwritable-output/score-lacuna-files-layout-under-a-file": C(
        lambda i, o: [*_score(i, o), "--lacuna-files", str(i.a_file / "{target}" / "Email_Address" / "SimNPO")],
        lambda i, o: ["--lacuna-files", str(i.a_file)],
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
    # LACUNA's released data directory (issue 36): the file at fault named
    "bad-data/attack-release-missing-config": C(
        lambda i, o: _attack(i, o, data=i.release_missing_config),
        lambda i, o: [str(i.release_missing_config / "data" / "Email_Address_forget.parquet"), "missing"],
    ),
    "bad-data/attack-release-card-names-missing-file": C(
        lambda i, o: _attack(i, o, data=i.release_card_missing_file),
        lambda i, o: [str(i.release_card_missing_file / "README.md"), "data/Birth_City_retain.parquet"],
    ),
    "bad-data/attack-release-renamed-column": C(
        lambda i, o: _attack(i, o, data=i.release_renamed_column),
        lambda i, o: [str(i.release_renamed_column / "data" / "Drivers_License_retain.parquet"), "'question'"],
    ),
    "bad-data/attack-release-group-id-not-integer": C(
        lambda i, o: _attack(i, o, data=i.release_group_id_float),
        lambda i, o: [str(i.release_group_id_float / "data" / "Phone_Number_forget.parquet"), "'group_id'", "double"],
    ),
    # LACUNA's release as a testbed (issue 36): the regime's own file named
    "bad-masks/score-release-unmasked-has-no-mask": C(
        lambda i, o: ["score", "--testbed", str(i.release_unmasked), "--after", str(i.after), "--out", str(o)],
        lambda i, o: [str(i.release_unmasked), "mask.pt", "unmasked regime", "--no-masks"],
    ),
    "bad-masks/score-release-mask-of-another-model": C(
        lambda i, o: [
            "score",
            "--testbed",
            str(i.release_other_mask),
            "--after",
            str(i.after),
            "--out",
            str(o),
            "--no-frag",
            "--composite-samples",
            "0",
            "--scores",
            "raw",
        ],  # fmt: skip
        lambda i, o: [str(i.release_other_mask / "mask.pt"), "model.layers.0.self_attn.q_proj.weight"],
    ),
    "bad-data/run-release-group-beyond-the-mask": C(
        lambda i, o: ["run", "--preset", "smoke", "--set", f"testbed={i.release_group_seven}", "--out", str(o)],
        lambda i, o: ["relearn_train.parquet", "group_id 7", "6 groups", str(i.release_group_seven / "mask.pt")],
    ),
    "bad-data/attack-neither-layout": C(
        lambda i, o: _attack(i, o, data=i.neither_layout),
        lambda i, o: [str(i.neither_layout), "downloads/, notes.txt", "<split>.jsonl", "data/<Config>_<split>.parquet"],
    ),
    "bad-data/diagnose-release-renamed-column": C(
        lambda i, o: [*_diagnose(i, o), "--data", str(i.release_renamed_column)],
        lambda i, o: [str(i.release_renamed_column / "data" / "Drivers_License_retain.parquet"), "'question'"],
    ),
}

# -- faults (issue 37 item 6): a full disk, unreadable or non-UTF-8 data, a symlink loop ---------------------------

_NOSPACE = "no space left on device"
_LOOP = "symlink loop"


def _loop(o: Path) -> Path:
    return o.parent / "loop_a"


def _deny(file: Callable[[Inputs], Path]) -> Callable[[Inputs, Path, Any], None]:
    return lambda i, o, mp: deny_reads(mp, file(i))


def _disk(free: int = 0) -> Callable[[Inputs, Path, Any], None]:
    return lambda i, o, mp: full_disk(mp, o, free)


def _make_loop(i: Inputs, o: Path, mp: Any) -> None:
    symlink_loop(o.parent)


def _forget(attr: str, *under: str) -> Callable[[Inputs], Path]:
    return lambda i: getattr(i, attr).joinpath(*under, "forget.jsonl")


_NOT_UTF8 = ["forget.jsonl:3", "not UTF-8", "byte offset"]
_EACCES = ["forget.jsonl", "permission denied"]
_DATA_ARGS = ("--profiles", "48", "--people-per-field", "8", "--validation-people", "4")

CASES.update(
    {
        # a full disk: the first write past the free bytes fails (ENOSPC, no file name); the message names the file
        # at its place in OUT, and neither OUT, OUT.partial nor a staging directory is left
        "fault/score-full-disk": C(
            _score, lambda i, o: ["cannot write", str(o / "score.md"), _NOSPACE], setup=_disk(free=64)
        ),
        "fault/reversibility-full-disk": C(
            lambda i, o: [*_rev(i, o), "--out", str(o)], lambda i, o: [f"cannot write {o}", _NOSPACE], setup=_disk()
        ),
        "fault/gate-full-disk": C(
            lambda i, o: [*_gate(i, o, "--max-leak", "0.5"), "--json", str(o)],
            lambda i, o: [f"cannot write {o}", _NOSPACE],
            setup=_disk(),
        ),
        "fault/data-generate-full-disk": C(
            lambda i, o: ["data", "generate", *_DATA_ARGS, "--out", str(o)],
            lambda i, o: [f"cannot write {o / 'profiles.jsonl'}", _NOSPACE],
            setup=_disk(),
        ),
        "fault/run-full-disk": C(
            lambda i, o: ["run", "--preset", "smoke", "--out", str(o)],
            lambda i, o: [f"cannot write {o / '.lock'}", _NOSPACE],
            setup=_disk(),
        ),
        "fault/build-testbed-full-disk": C(
            lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(o)],
            lambda i, o: ["cannot write", f".{o.name}.lock", _NOSPACE],
            setup=_disk(),
        ),
        "fault/attack-full-disk": C(_attack, lambda i, o: ["cannot write", f".{o.name}.lock", _NOSPACE], setup=_disk()),
        # data that is not UTF-8: the file, line and byte offset
        "fault/attack-data-not-utf8": C(
            lambda i, o: _attack(i, o, data=i.data_not_utf8),
            lambda i, o: [str(i.data_not_utf8 / "forget.jsonl"), *_NOT_UTF8],
        ),
        "fault/diagnose-data-not-utf8": C(
            lambda i, o: [*_diagnose(i, o), "--data", str(i.data_not_utf8)],
            lambda i, o: [str(i.data_not_utf8 / "forget.jsonl"), *_NOT_UTF8],
        ),
        "fault/score-calibration-not-utf8": C(
            lambda i, o: _frag_only(i, o, "--calib-forget", str(i.data_not_utf8), "--calib-retain", str(i.data)),
            lambda i, o: [str(i.data_not_utf8 / "forget.jsonl"), *_NOT_UTF8],
        ),
        "fault/run-testbed-data-not-utf8": C(
            lambda i, o: ["run", "--preset", "smoke", "--set", f"testbed={i.testbed_not_utf8}", "--out", str(o)],
            lambda i, o: [str(i.testbed_not_utf8 / "data" / "forget.jsonl"), *_NOT_UTF8],
        ),
        "fault/demo-testbed-data-not-utf8": C(
            lambda i, o: ["demo", "--testbed", str(i.testbed_not_utf8), "--out", str(o)],
            lambda i, o: [str(i.testbed_not_utf8 / "data" / "forget.jsonl"), *_NOT_UTF8],
        ),
        "fault/attack-unrelated-file-not-utf8": C(
            lambda i, o: _attack(
                i, o, "--source", "unrelated", "--set", f"unrelated_file={i.data_not_utf8 / 'forget.jsonl'}"
            ),
            lambda i, o: [str(i.data_not_utf8 / "forget.jsonl"), *_NOT_UTF8],
        ),
        "fault/diagnose-queries-not-utf8": C(
            lambda i, o: [*_diagnose(i, o), "--queries", str(i.queries_not_utf8)],
            lambda i, o: [f"{i.queries_not_utf8}:2", "not UTF-8", "byte offset 16"],
        ),
        "fault/run-config-not-utf8": C(
            lambda i, o: ["run", "--config", str(i.config_not_utf8), "--out", str(o)],
            lambda i, o: [str(i.config_not_utf8), "utf-8"],
        ),
        "fault/gate-results-not-utf8": C(
            lambda i, o: _gate(i, o, "--max-leak", "0.5", results=i.results_not_utf8),
            lambda i, o: [str(i.results_not_utf8), "utf-8"],
        ),
        "fault/reversibility-results-not-utf8": C(
            lambda i, o: _rev(i, o, original=i.results_not_utf8), lambda i, o: [str(i.results_not_utf8), "utf-8"]
        ),
        # data that cannot be read (mode 000; as root, deny_reads)
        "fault/attack-data-unreadable": C(
            lambda i, o: _attack(i, o, data=i.data_unreadable),
            lambda i, o: [str(i.data_unreadable / "forget.jsonl"), *_EACCES],
            setup=_deny(_forget("data_unreadable")),
        ),
        "fault/diagnose-data-unreadable": C(
            lambda i, o: [*_diagnose(i, o), "--data", str(i.data_unreadable)],
            lambda i, o: [str(i.data_unreadable / "forget.jsonl"), *_EACCES],
            setup=_deny(_forget("data_unreadable")),
        ),
        "fault/score-calibration-unreadable": C(
            lambda i, o: _frag_only(i, o, "--calib-forget", str(i.data_unreadable), "--calib-retain", str(i.data)),
            lambda i, o: [str(i.data_unreadable / "forget.jsonl"), *_EACCES],
            setup=_deny(_forget("data_unreadable")),
        ),
        "fault/run-testbed-data-unreadable": C(
            lambda i, o: ["run", "--preset", "smoke", "--set", f"testbed={i.testbed_unreadable}", "--out", str(o)],
            lambda i, o: [str(i.testbed_unreadable / "data" / "forget.jsonl"), *_EACCES],
            setup=_deny(_forget("testbed_unreadable", "data")),
        ),
        # an output (or input) path through a symlink loop: the loop named, before any work
        "fault/score-out-symlink-loop": C(
            lambda i, o: [*_score(i, o), "--out", str(_loop(o) / "s")],
            lambda i, o: [f"--out {_loop(o) / 's'}", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/score-activation-cache-symlink-loop": C(
            lambda i, o: [*_score(i, o), "--activation-cache", str(_loop(o) / "cache")],
            lambda i, o: ["--activation-cache", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/score-after-symlink-loop": C(
            lambda i, o: _score(i, o, after=_loop(o) / "after"),
            lambda i, o: [f"--after {_loop(o) / 'after'}", _LOOP],
            setup=_make_loop,
        ),
        "fault/attack-out-symlink-loop": C(
            lambda i, o: _attack(i, _loop(o) / "attack"), lambda i, o: ["--out", str(_loop(o)), _LOOP], setup=_make_loop
        ),
        "fault/attack-data-symlink-loop": C(
            lambda i, o: _attack(i, o, data=_loop(o) / "data"),
            lambda i, o: ["--data", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/diagnose-out-symlink-loop": C(
            lambda i, o: [*_diagnose(i, o), "--out", str(_loop(o) / "d")],
            lambda i, o: ["--out", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/reversibility-out-symlink-loop": C(
            lambda i, o: [*_rev(i, o), "--out", str(_loop(o) / "rev.json")],
            lambda i, o: ["--out", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/gate-json-symlink-loop": C(
            lambda i, o: [*_gate(i, o, "--max-leak", "0.5"), "--json", str(_loop(o) / "g.json")],
            lambda i, o: ["--json", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/gate-junit-symlink-loop": C(
            lambda i, o: _gate(i, o, "--max-leak", "0.5", "--junit", str(_loop(o) / "g.xml")),
            lambda i, o: ["--junit", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/run-out-symlink-loop": C(
            lambda i, o: ["run", "--preset", "smoke", "--out", str(_loop(o) / "run")],
            lambda i, o: ["--out", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/demo-out-symlink-loop": C(
            lambda i, o: ["demo", "--testbed", str(i.fake_testbed), "--out", str(_loop(o) / "demo")],
            lambda i, o: ["--out", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/build-testbed-out-symlink-loop": C(
            lambda i, o: ["build-testbed", "--preset", "smoke", "--out", str(_loop(o) / "tb")],
            lambda i, o: ["--out", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
        "fault/data-generate-out-symlink-loop": C(
            lambda i, o: ["data", "generate", *_DATA_ARGS, "--out", str(_loop(o) / "data")],
            lambda i, o: ["--out", str(_loop(o)), _LOOP],
            setup=_make_loop,
        ),
    }
)

# -- a flag and --set of one setting (issue 37 item 5): different values are refused, naming both -----------------

_RULE = "different values"
CASES.update(
    {
        "precedence/run-seeds": C(
            lambda i, o: ["run", "--seeds", "1,2", "--set", "seeds=[3]", "--out", str(o)],
            lambda i, o: ["--seeds 1,2", "--set seeds=[3]", _RULE],
        ),
        "precedence/demo-field": C(
            lambda i, o: ["demo", "--field", "email", "--set", "fields=[phone]", "--out", str(o)],
            lambda i, o: ["--field email", "--set fields=[phone]", _RULE],
        ),
        "precedence/demo-seed": C(
            lambda i, o: ["demo", "--seed", "1", "--set", "testbed_seed=2", "--out", str(o)],
            lambda i, o: ["--seed 1", "--set testbed_seed=2", _RULE],
        ),
        "precedence/demo-preset": C(
            lambda i, o: ["demo", "--preset", "smoke", "--set", "preset=mini", "--out", str(o)],
            lambda i, o: ["--preset smoke", "--set preset=mini", _RULE],
        ),
        "precedence/demo-testbed": C(
            lambda i, o: ["demo", "--testbed", str(i.fake_testbed), "--set", f"testbed={i.root}", "--out", str(o)],
            lambda i, o: [f"--testbed {i.fake_testbed}", f"--set testbed={i.root}", _RULE],
        ),
        "precedence/build-testbed-seed": C(
            lambda i, o: ["build-testbed", "--preset", "smoke", "--seed", "1", "--set", "seed=2", "--out", str(o)],
            lambda i, o: ["--seed 1", "--set seed=2", _RULE],
        ),
        "precedence/attack-seed": C(
            lambda i, o: _attack(i, o, "--seed", "1", "--set", "seed=2"),
            lambda i, o: ["--seed 1", "--set seed=2", _RULE],
        ),
        "precedence/attack-protocol": C(
            lambda i, o: _attack(i, o, "--protocol", "relearn", "--set", "attack=relearn_lora"),
            lambda i, o: ["--protocol relearn", "--set attack=relearn_lora", _RULE],
        ),
        "precedence/attack-field": C(
            lambda i, o: _attack(i, o, "--field", "email", "--set", "field=phone"),
            lambda i, o: ["--field email", "--set field=phone", _RULE],
        ),
        "precedence/attack-source": C(
            lambda i, o: _attack(i, o, "--source", "forget", "--set", "source=retain"),
            lambda i, o: ["--source forget", "--set source=retain", _RULE],
        ),
        "precedence/attack-budget": C(
            lambda i, o: _attack(i, o, "--budget", "forget", "--set", "budget=10"),
            lambda i, o: ["--budget forget", "--set budget=10", _RULE],
        ),
        "precedence/attack-model": C(
            lambda i, o: _attack(i, o, "--set", f"model={i.after}"),
            lambda i, o: [f"--model {i.before}", f"--set model={i.after}", _RULE],
        ),
        "precedence/attack-data": C(
            lambda i, o: _attack(i, o, "--set", f"data={i.data_duplicate_id}"),
            lambda i, o: [f"--data {i.data}", f"--set data={i.data_duplicate_id}", _RULE],
        ),
        "precedence/attack-out": C(
            lambda i, o: _attack(i, o, "--set", f"output_dir={o}_other"),
            lambda i, o: [f"--out {o}", f"--set output_dir={o}_other", _RULE],
        ),
        "precedence/attack-force": C(
            lambda i, o: _attack(i, o, "--force", "--set", "force=false"),
            lambda i, o: ["--force", "--set force=false", _RULE],
        ),
    }
)


def _left_behind(out: Path) -> list[Path]:
    """Anything a refused command wrote: its output, a ``.partial`` beside it, a staging directory in it."""
    found = [p for p in (out, out.with_name(out.name + ".partial")) if p.exists()]
    return found + list(out.parent.glob(".staging-*"))
