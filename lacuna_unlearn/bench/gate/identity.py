"""Which checkpoint a gated result describes: lm-eval's ``pretrained=`` against a score.json's ``after``.

lm-eval results and their ``--score`` are paired only when the checkpoint lm-eval evaluated (fingerprinted where
it is now) has the content fingerprint the score.json recorded (docs/ci.md, "Checkpoint identity").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lacuna_metrics import SCHEMAS, read_schema
from lacuna_unlearn.bench.gate.criteria import GateError, _get, _is_number

__all__ = ["Identity", "fingerprint_memo", "verify_pair"]

#: The newest score.json this gate knows.
SCORE_SCHEMA_VERSION = SCHEMAS["score"][1]
_FINGERPRINTED_SCORE_VERSION = 2  # the first whose fingerprints cover every byte of the weights

_STALE_SLACK_SECONDS = 2.0  # timestamp granularity and clock slack for "weights written after the evaluation"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")
#: ``model_args`` that change the evaluated weights beyond ``pretrained``: not a checkpoint directory.
_ADAPTER_ARGS = ("peft", "delta", "gguf_file")


@dataclass
class Identity:
    """The checkpoint a results file describes: its path and content fingerprint as far as known, and why
    it cannot be verified (``problems``, empty when verified)."""

    path: str | None
    fingerprint: str | None
    problems: list[str] = dataclasses.field(default_factory=list)


#: Fingerprints already computed during one gate run (``_collect_subjects``), by resolved directory.
_MEMO: dict[str, str] | None = None


@contextmanager
def fingerprint_memo() -> Iterator[None]:
    """Within the block, a checkpoint named by several inputs of one gate run is hashed once."""
    global _MEMO
    _MEMO = {}
    try:
        yield
    finally:
        _MEMO = None


def _fingerprint(directory: Path, what: str) -> tuple[str, list[Path]]:
    """Content fingerprint (:meth:`Checkpoint.fingerprint`) and weight files of ``directory``; GateError if unreadable.

    Within one gate run a checkpoint named by several inputs is hashed once.
    """
    from lacuna_metrics import Checkpoint, CheckpointError

    try:
        ckpt = Checkpoint(directory)
        key = str(directory)
        fingerprint = _MEMO.get(key) if _MEMO is not None else None
        if fingerprint is None:
            fingerprint = ckpt.fingerprint()
            if _MEMO is not None:
                _MEMO[key] = fingerprint
        return fingerprint, ckpt.files
    except (CheckpointError, OSError) as exc:
        detail = " ".join(str(exc).split())
        raise GateError(f"{directory}: cannot fingerprint {what}: {detail}") from None


def _short(fingerprint: str | None) -> str:
    return "no fingerprint" if not fingerprint else fingerprint[: len("sha256:") + 12] + "…"


def _model_args(doc: Mapping[str, Any]) -> dict[str, str]:
    """lm-eval's ``config.model_args`` (a ``k=v,k=v`` string or a dict) as a dict of strings."""
    config = doc.get("config")
    args = config.get("model_args") if isinstance(config, Mapping) else None
    if isinstance(args, Mapping):
        return {str(k): str(v) for k, v in args.items() if v is not None}
    out: dict[str, str] = {}
    if isinstance(args, str):
        for part in args.split(","):
            key, sep, value = part.partition("=")
            if sep and key.strip():
                out[key.strip()] = value.strip()
    return out


def _hub_snapshot(name: str, args: Mapping[str, str], doc: Mapping[str, Any]) -> tuple[Path | None, str]:
    """The local Hugging Face cache snapshot of hub model ``name`` at the commit lm-eval recorded, or why not."""
    if not _REPO_ID_RE.match(name) or name.startswith(".") or ".." in name:
        return None, f"lm-eval evaluated {name}, which does not exist here (run the gate where the checkpoint is)"
    config = doc.get("config") if isinstance(doc.get("config"), Mapping) else {}
    pins = (config.get("model_sha"), config.get("model_revision"), args.get("revision"))
    commit = next((c for c in pins if isinstance(c, str) and _COMMIT_RE.match(c)), None)
    if commit is None:
        return None, (
            f"lm-eval evaluated {name}, which is no local directory here, and the results pin no hub commit "
            "(config.model_sha) to find that model in the Hugging Face cache"
        )
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
    except ImportError:
        return None, f"lm-eval evaluated the hub model {name}@{commit[:12]} and huggingface_hub is not installed"
    snapshot = cache / ("models--" + name.replace("/", "--")) / "snapshots" / commit
    if args.get("subfolder"):
        snapshot = snapshot / args["subfolder"]
    if not snapshot.is_dir():
        return None, f"lm-eval evaluated the hub model {name}@{commit[:12]}, which is not in the local cache {cache}"
    return snapshot, ""


def _lm_eval_identity(path: Path, doc: Mapping[str, Any]) -> Identity:
    """The checkpoint lm-eval results describe: ``pretrained=`` of ``config.model_args`` (a relative path is
    taken from the current directory; a hub id from the local HF cache at the recorded commit), fingerprinted
    as it is now. A local checkpoint whose weight files are newer than the evaluation (``date``) is unverified."""
    args = _model_args(doc)
    pretrained = args.get("pretrained")
    if not pretrained:
        return Identity(
            None, None, [f"{path}: these lm-eval results name no checkpoint (no pretrained= in model_args)"]
        )
    adapters = [f"{k}={args[k]}" for k in _ADAPTER_ARGS if args.get(k)]
    if adapters:
        return Identity(
            pretrained,
            None,
            [
                f"{path}: lm-eval evaluated {pretrained} with {', '.join(adapters)}, which is not one checkpoint directory"
            ],
        )
    local = Path(pretrained).expanduser()
    if args.get("subfolder"):
        local = local / args["subfolder"]
    hub = not local.exists()
    if hub:
        snapshot, problem = _hub_snapshot(pretrained, args, doc)
        if snapshot is None:
            return Identity(pretrained, None, [f"{path}: {problem}"])
        directory = snapshot
    else:
        directory = local.resolve()
    fingerprint, files = _fingerprint(directory, f"the checkpoint lm-eval evaluated ({path})")
    problems = []
    started = doc.get("date")
    if not hub and _is_number(started) and files:  # hub snapshots are immutable; their mtime is the download
        newest = max(f.stat().st_mtime for f in files)
        if newest > started + _STALE_SLACK_SECONDS:
            problems.append(
                f"{path}: {directory} was rewritten after lm-eval evaluated it (weights modified {_iso(newest)}, "
                f"evaluation started {_iso(started)}), so these results may describe an earlier checkpoint"
            )
    return Identity(str(directory), fingerprint, problems)


def _iso(timestamp: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc).isoformat(timespec="seconds")


def _score_version_notes(score: Mapping[str, Any], label: str | Path) -> list[str]:
    version = read_schema(score)[1]
    if _is_number(version) and version > SCORE_SCHEMA_VERSION:
        return [f"{label}: score.json schema_version {version}, this gate knows {SCORE_SCHEMA_VERSION}"]
    return []


def _score_identity(score: Mapping[str, Any], label: str) -> Identity:
    """The ``after`` checkpoint a score.json recorded; unverified unless schema 2+ with a content fingerprint."""
    version = read_schema(score)[1]
    after = _get(score, "manifest.inputs.after")
    path = after.get("path") if isinstance(after, Mapping) else None
    fingerprint = after.get("fingerprint") if isinstance(after, Mapping) else None
    path = str(path) if path is not None else None
    newer = _is_number(version) and version >= _FINGERPRINTED_SCORE_VERSION
    if not newer or not isinstance(fingerprint, str) or not fingerprint.startswith("sha256:"):
        return Identity(
            path,
            None,
            [
                f"{label}: score.json schema_version {version!r} does not record the content fingerprint of the "
                f"checkpoint it scored; re-score it (lacuna score --after {path or 'CKPT'} ...) to get one"
            ],
        )
    return Identity(path, fingerprint)


def verify_pair(
    results: Path,
    doc: Mapping[str, Any],
    score_label: str,
    score: Mapping[str, Any],
    *,
    allow_unverified: bool = False,
) -> dict[str, Any]:
    """Check that lm-eval ``results`` (parsed: ``doc``) and a score.json describe the same checkpoint.

    Refuses (GateError) when both fingerprints are known and differ, whatever ``allow_unverified``; when the
    pair cannot be verified, refuses unless ``allow_unverified``, which then still compares the lm-eval
    checkpoint with what is now at an old score's ``after`` path. Returns the JSON-ready record: ``path`` and
    ``fingerprint`` of the evaluated checkpoint, the score's ``after``, ``verified`` and ``problems``.
    """
    evaluated = _lm_eval_identity(results, doc)
    scored = _score_identity(score, score_label)

    def mismatch(score_fp: str | None, how: str) -> GateError:
        return GateError(
            f"checkpoint mismatch: {results} are lm-eval results of {evaluated.path} ({_short(evaluated.fingerprint)}), "
            f"but {score_label} {how} {scored.path} ({_short(score_fp)}); score the evaluated checkpoint "
            f"(lacuna score --after {evaluated.path} ...) or give the score.json of {evaluated.path}"
        )

    if evaluated.fingerprint and scored.fingerprint and evaluated.fingerprint != scored.fingerprint:
        raise mismatch(scored.fingerprint, "scored")
    problems = evaluated.problems + scored.problems
    if problems and not allow_unverified:
        raise GateError("; ".join(problems) + "; or pass --allow-unverified to gate the pair anyway")
    if evaluated.fingerprint and scored.fingerprint is None and scored.path and Path(scored.path).exists():
        now, _ = _fingerprint(Path(scored.path), f"the score's after checkpoint ({score_label})")
        if now != evaluated.fingerprint:  # not what was scored, but what is there now: still a contradiction
            raise mismatch(now, "was computed for the checkpoint at")
    return {
        "path": evaluated.path,
        "fingerprint": evaluated.fingerprint,
        "score": score_label,
        "score_after": {"path": scored.path, "fingerprint": scored.fingerprint},
        "verified": not problems,
        "problems": problems,
    }


def _run_method_identity(path: Path, name: str, entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """``methods.NAME.checkpoint`` (the model evaluated and attacked) against ``methods.NAME.score_checkpoint``
    (the score's ``after``), when the run recorded them: results of two checkpoints in one entry are refused."""
    evaluated, scored = entry.get("checkpoint"), entry.get("score_checkpoint")
    if not isinstance(evaluated, Mapping):
        return None
    record = {"path": evaluated.get("path"), "fingerprint": evaluated.get("fingerprint")}
    if isinstance(scored, Mapping):
        a, b = evaluated.get("fingerprint"), scored.get("fingerprint")
        if isinstance(a, str) and isinstance(b, str) and a != b:
            raise GateError(
                f"checkpoint mismatch: {path}: method {name} was evaluated on {evaluated.get('path')} ({_short(a)}) "
                f"but scored on {scored.get('path')} ({_short(b)}); re-run lacuna run (a stale stage?)"
            )
        record["score_after"] = {"path": scored.get("path"), "fingerprint": b}
    return record
