"""Assigning people to LACUNA's splits and writing a dataset directory.

:func:`build_splits` turns profiles (and, for a testbed, the questions a model memorized) into the forget / retain /
paraphrased / validation / relearn QA splits (``docs/definitions.md#memorization-test-and-splits``), plus the
held-out ``retain_eval`` splits on request (not in LACUNA; ``docs/tasks.md``). :func:`write_dataset` validates and
writes them atomically with a manifest whose fingerprint is the loader's. Seeded streams come from
:mod:`lacuna_tasks.seeding`, so the same seed gives the same splits in every process.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lacuna_tasks.loader import fingerprint as loader_fingerprint
from lacuna_tasks.prompts import full_name, lacuna_question
from lacuna_tasks.schema import (
    FIELDS,
    FORGET_GROUPS,
    MISSING_VALUES,
    NUM_GROUPS,
    QA_COLUMNS,
    RETAIN_GROUPS,
    ROLE_QA_TUNING,
    ROLE_TARGET,
    SPLITS,
    get_field,
    validate_rows,
)
from lacuna_tasks.seeding import stable_rng
from lacuna_tasks.synth.profiles import GENERATOR_NAME, GENERATOR_VERSION, MAX_REDRAWS, PROFILE_COLUMNS, faker_version
from lacuna_tasks.validate import RETAIN_EVAL_SPLITS

#: Fields that get a validation split (LACUNA tunes hyper-parameters on these two;
#: docs/definitions.md#memorization-test-and-splits).
VALIDATION_FIELDS: tuple[str, ...] = ("email", "drivers_license")
#: A person needs this many distinct memorized questions for a field to be eligible
#: (docs/definitions.md#memorization-test-and-splits).
MIN_MEMORIZED_QUESTIONS = 2
#: Cap on the default number of people per side (LACUNA: 100 forget / 100 retain per field).
DEFAULT_MAX_PEOPLE = 100


def _is_missing(value: Any) -> bool:
    return value is None or str(value).strip() in MISSING_VALUES


def _distinct_questions(profile: Mapping[str, Any], key: str, seed: int, k: int) -> list[str]:
    rng = stable_rng(GENERATOR_NAME, "questions", seed, profile["Unique ID"], key)
    questions: list[str] = []
    for _ in range(MAX_REDRAWS):
        q = lacuna_question(profile, key, rng)
        if q not in questions:
            questions.append(q)
            if len(questions) == k:
                return questions
    raise ValueError(f"cannot draw {k} distinct questions about {full_name(profile)!r} for field {key!r}")


def _row(profile: Mapping[str, Any], key: str, question: str) -> dict[str, Any]:
    field = FIELDS[key]
    return {
        "ID": str(profile["Unique ID"]),
        "question": question,
        "answer": str(profile[field.column]),
        "field": field.column,
        "group_id": int(profile["group_id"]),
    }


def _memorized_questions(
    memorized: Mapping[tuple[str, str], Sequence[str]], people: Mapping[str, Mapping[str, Any]], all_ids: set[str]
) -> dict[tuple[str, str], list[str]]:
    """Normalize keys to (ID, field key); dedupe and sort questions so input order does not matter."""
    out: dict[tuple[str, str], list[str]] = {}
    for (pid, field_name), questions in memorized.items():
        pid = str(pid)
        if pid not in all_ids:
            raise ValueError(f"memorized questions given for unknown person ID {pid!r} (not in the profiles)")
        if pid not in people:  # qa_tuning people are excluded from every split (docs/definitions.md#qa-tuning)
            continue
        if isinstance(questions, str):
            raise ValueError(f"memorized[({pid!r}, {field_name!r})] must be a sequence of questions, not a string")
        key = get_field(field_name).key
        merged = set(out.get((pid, key), [])) | {q for q in questions if isinstance(q, str) and q.strip()}
        out[(pid, key)] = sorted(merged)
    return out


def build_splits(
    profiles: Sequence[Mapping[str, Any]],
    *,
    seed: int = 42,
    people_per_field: int | None = None,
    validation_people: int | None = None,
    memorized: Mapping[tuple[str, str], Sequence[str]] | None = None,
    retain_eval_people: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """LACUNA's forget / retain / paraphrased / validation / relearn splits
    (docs/definitions.md#memorization-test-and-splits), plus held-out retain-eval.

    Only ``role == "target"`` people take part. A person is eligible for a field iff it has >= 2
    distinct ``memorized`` questions for it (keys ``(Unique ID, field key)``); without
    ``memorized`` every non-N/A value counts as memorized with 2 generated questions.

    Counts are per side, as in LACUNA (``num_people=200`` -> 100 forget + 100 retain):
    ``people_per_field`` forget people (groups 0,2,4) and as many retain people (1,3,5) per field.
    The default is ``min(100, m // 3)`` with ``m`` the smaller side's eligible count, which gives
    LACUNA's 100 at full scale and leaves people for validation and relearn on small data.
    People eligible for all four fields come first so the same persons recur across fields. Each
    person's first question goes to forget/retain, the second to the ``_paraphrased`` split.

    ``validation`` (Email Address and Driver's License only): ``validation_people`` further people
    per side (default ``min(100, available // 2)``, so relearn keeps people too), one question each,
    disjoint from every main split.
    ``retain_eval`` / ``retain_eval_paraphrased`` (not in LACUNA; ``docs/tasks.md``): ``retain_eval_people``
    held-out people per field, drawn after the main splits from the retain groups only (the count is per
    field and one-sided, unlike the per-side counts above), memorized like the retain people but in no
    main split of any field, so no unlearning loss ever trains on them: retain accuracy measured on them
    can fail. Questions as for ``retain``. The default 0 adds neither split (the output, and so every
    fingerprint, stays what it was); validation and relearn people are then drawn from the rest.
    ``relearn``: every memorized question of people in no main, retain-eval or validation split of any
    field (LACUNA's held-out relearning data, docs/definitions.md#lacuna-relearning). Raises ValueError if a split would
    be empty.
    """
    all_ids: set[str] = set()
    people: dict[str, Mapping[str, Any]] = {}
    for i, p in enumerate(profiles):
        if "Unique ID" not in p or "group_id" not in p:
            raise ValueError(f"profile {i} lacks 'Unique ID' or 'group_id'; profiles must come from generate_profiles")
        pid = str(p["Unique ID"])
        if pid in all_ids:
            raise ValueError(f"duplicate Unique ID {pid!r} in profiles")
        all_ids.add(pid)
        if int(p["group_id"]) not in range(NUM_GROUPS):
            raise ValueError(f"profile {pid!r} has group_id {p['group_id']!r}, expected 0..{NUM_GROUPS - 1}")
        if p.get("role", ROLE_TARGET) == ROLE_TARGET:
            people[pid] = p
    for name, value in (("people_per_field", people_per_field), ("validation_people", validation_people)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value}")
    if isinstance(retain_eval_people, bool) or not isinstance(retain_eval_people, int) or retain_eval_people < 0:
        raise ValueError(f"retain_eval_people must be an integer >= 0, got {retain_eval_people!r}")

    # Questions per (person, field): the memorized ones, or 2 generated ones per non-N/A value.
    questions: dict[tuple[str, str], list[str]]
    if memorized is None:
        questions = {
            (pid, key): _distinct_questions(p, key, seed, MIN_MEMORIZED_QUESTIONS)
            for pid, p in people.items()
            for key, field in FIELDS.items()
            if not _is_missing(p.get(field.column))
        }
    else:
        questions = {
            k: qs
            for k, qs in _memorized_questions(memorized, people, all_ids).items()
            if qs and not _is_missing(people[k[0]].get(FIELDS[k[1]].column))
        }
    eligible = {
        key: {pid for pid in people if len(questions.get((pid, key), ())) >= MIN_MEMORIZED_QUESTIONS} for key in FIELDS
    }
    all_four = set.intersection(*eligible.values())

    order = sorted(people)
    stable_rng(GENERATOR_NAME, "people-order", seed).shuffle(order)
    side_of = {pid: "forget" if int(people[pid]["group_id"]) in FORGET_GROUPS else "retain" for pid in order}

    def ranked(candidates: set[str], preferred: set[str], side: str) -> list[str]:
        pool = [pid for pid in order if pid in candidates and side_of[pid] == side]
        return [pid for pid in pool if pid in preferred] + [pid for pid in pool if pid not in preferred]

    def pick(pid: str, key: str, k: int) -> list[str]:
        qs = questions[(pid, key)]
        return stable_rng(GENERATOR_NAME, "pick", seed, pid, key, *qs).sample(qs, k)

    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    main_people: dict[str, set[str]] = {}
    for key, field in FIELDS.items():
        sides = {side: ranked(eligible[key], all_four, side) for side in ("forget", "retain")}
        smaller = min(len(v) for v in sides.values())
        count = people_per_field if people_per_field is not None else min(DEFAULT_MAX_PEOPLE, smaller // 3)
        for side, pool in sides.items():
            if count > len(pool):
                raise ValueError(
                    f"field {field.column!r}: people_per_field={count} but only {len(pool)} eligible {side} people "
                    f"(groups {FORGET_GROUPS if side == 'forget' else RETAIN_GROUPS})"
                )
        if count == 0:
            raise ValueError(
                f"field {field.column!r}: splits 'forget'/'retain' would be empty "
                f"({len(sides['forget'])} eligible forget and {len(sides['retain'])} eligible retain people)"
            )
        main_people[key] = set()
        for side, pool in sides.items():
            for pid in pool[:count]:
                first, second = pick(pid, key, 2)
                splits[side].append(_row(people[pid], key, first))
                splits[f"{side}_paraphrased"].append(_row(people[pid], key, second))
                main_people[key].add(pid)

    in_any_main = set().union(*main_people.values())
    in_retain_eval: set[str] = set()
    if retain_eval_people:
        for split in RETAIN_EVAL_SPLITS:
            splits[split] = []
        for key, field in FIELDS.items():  # same order and preference as the main splits: people recur across fields
            pool = ranked(eligible[key] - in_any_main, all_four, "retain")
            if retain_eval_people > len(pool):
                raise ValueError(
                    f"field {field.column!r}: retain_eval_people={retain_eval_people} but only {len(pool)} eligible "
                    f"retain people (groups {RETAIN_GROUPS}) are outside the main splits; lower people_per_field "
                    "or retain_eval_people"
                )
            for pid in pool[:retain_eval_people]:
                first, second = pick(pid, key, 2)
                splits[RETAIN_EVAL_SPLITS[0]].append(_row(people[pid], key, first))
                splits[RETAIN_EVAL_SPLITS[1]].append(_row(people[pid], key, second))
                in_retain_eval.add(pid)

    held_out = in_any_main | in_retain_eval
    validation_eligible = set.intersection(*(eligible[k] for k in VALIDATION_FIELDS))
    used = set(held_out)
    for key in VALIDATION_FIELDS:
        column = FIELDS[key].column
        sides = {side: ranked(eligible[key] - held_out, validation_eligible, side) for side in ("forget", "retain")}
        available = min(len(v) for v in sides.values())
        count = validation_people if validation_people is not None else min(DEFAULT_MAX_PEOPLE, available // 2)
        if count == 0:
            raise ValueError(
                f"field {column!r}: split 'validation' would be empty: no eligible people outside the main and "
                f"retain-eval splits ({len(sides['forget'])} forget, {len(sides['retain'])} retain); lower "
                "people_per_field or retain_eval_people"
            )
        if count > available:
            raise ValueError(
                f"field {column!r}: validation_people={count} but only {len(sides['forget'])} forget and "
                f"{len(sides['retain'])} retain eligible people are outside the main and retain-eval splits"
            )
        for side in ("forget", "retain"):
            for pid in sides[side][:count]:
                splits["validation"].append(_row(people[pid], key, pick(pid, key, 1)[0]))
                used.add(pid)

    for key in FIELDS:
        for pid in order:
            if pid not in used:
                splits["relearn"].extend(_row(people[pid], key, q) for q in questions.get((pid, key), ()))
    if not splits["relearn"]:
        raise ValueError(
            "split 'relearn' would be empty for every field: all people with memorized questions are used by the "
            "main, retain-eval or validation splits; lower people_per_field, retain_eval_people or validation_people"
        )
    return splits


# --------------------------------------------------------------------------------------------- writing


def _jsonl_bytes(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    return "".join(json.dumps({c: r[c] for c in columns}, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def _atomic_write(path: Path, data: bytes, *, shown: Path | None = None) -> None:
    """Write via a temp file in the same directory + os.replace: readers never see half a file. A write error
    names ``shown`` (default ``path``): a full disk's names no file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; data files are meant to be shared and packaged
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(shown or path)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _publish(out: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` into a staging directory inside ``out``, then move them in, in order (the manifest last):
    after a failure (a full disk) ``out`` holds nothing new, and an ``out`` this call created is removed."""
    import shutil

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        for name, data in files.items():
            _atomic_write(staging / name, data, shown=out / name)
        for name in files:
            os.replace(staging / name, out / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def dataset_splits(splits: Mapping[str, Any]) -> tuple[str, ...]:
    """The split names to write: every LACUNA split, plus both retain-eval splits or neither (ValueError otherwise)."""
    eval_present = [s for s in RETAIN_EVAL_SPLITS if s in splits]
    allowed = (*SPLITS, *RETAIN_EVAL_SPLITS)
    missing = [s for s in SPLITS if s not in splits]
    extra = [s for s in splits if s not in allowed]
    if missing or extra:
        raise ValueError(
            f"splits must be exactly {list(SPLITS)} (optionally with {list(RETAIN_EVAL_SPLITS)}); "
            f"missing {missing}, unexpected {extra}"
        )
    if eval_present and len(eval_present) != len(RETAIN_EVAL_SPLITS):
        absent = [s for s in RETAIN_EVAL_SPLITS if s not in splits]
        raise ValueError(f"splits give {eval_present} without {absent}: the retain-eval splits come together")
    return (*SPLITS, *eval_present)


def write_dataset(
    out_dir: str | os.PathLike[str],
    profiles: Sequence[Mapping[str, Any]],
    splits: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    manifest: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``profiles.jsonl``, one ``<split>.jsonl`` per split and ``manifest.json`` into ``out_dir``.

    The splits are LACUNA's six, plus ``retain_eval`` and ``retain_eval_paraphrased`` when given (both or neither).

    Rows are validated first (a bad row must not become a silent score of 0 later). The files are written to a
    staging directory and moved in, the manifest last, so its fingerprint only ever describes complete split
    files and a failed write (a full disk) leaves nothing new. Overwrites a previous dataset (a directory with ``manifest.json``) but refuses any
    other non-empty directory, so a typo in ``--out`` cannot clobber unrelated files.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"dataset output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise FileExistsError(
            f"refusing to write a dataset into {out}: the directory is not empty and holds no manifest.json "
            "(not a previous LACUNA dataset); choose an empty or new directory"
        )
    names = dataset_splits(splits)
    clean = {s: validate_rows(splits[s], source=str(out), split=s) for s in names}

    profile_columns = PROFILE_COLUMNS if all(c in p for p in profiles for c in PROFILE_COLUMNS) else None
    profile_bytes = "".join(
        json.dumps({c: p[c] for c in profile_columns} if profile_columns else dict(p), ensure_ascii=False) + "\n"
        for p in profiles
    ).encode("utf-8")
    blobs = {"profiles.jsonl": profile_bytes, **{f"{s}.jsonl": _jsonl_bytes(clean[s], QA_COLUMNS) for s in names}}
    files = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in blobs.items()}

    counts = {
        split: {
            "rows": len(rows),
            "people": len({r["ID"] for r in rows}),
            "by_field": {f.column: sum(r["field"] == f.column for r in rows) for f in FIELDS.values()},
        }
        for split, rows in clean.items()
    }
    roles = [p.get("role", ROLE_TARGET) for p in profiles]
    content: dict[str, Any] = dict(manifest or {})
    content.update(
        {
            "generator": GENERATOR_NAME,
            "generator_version": GENERATOR_VERSION,
            "faker_version": faker_version(),
            "profiles": {
                "total": len(profiles),
                "target": roles.count(ROLE_TARGET),
                "qa_tuning": roles.count(ROLE_QA_TUNING),
            },
            "counts": counts,
            "files": files,
            # One fingerprint for the whole project: the loader's (canonical JSON, format independent),
            # the same value every evaluation result records.
            "fingerprint": loader_fingerprint({s: [{c: r[c] for c in QA_COLUMNS} for r in clean[s]] for s in names}),
        }
    )
    content.setdefault("seed", None)
    blobs["manifest.json"] = (json.dumps(content, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    _publish(out, blobs)
    return out
