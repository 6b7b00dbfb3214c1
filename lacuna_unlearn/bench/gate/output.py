"""The verdicts of ``lacuna gate`` as output: the text table, JUnit XML for CI reporters, and the JSON report
(stamped with the ``gate`` schema of :data:`lacuna_metrics.schemas.SCHEMAS`)."""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lacuna_metrics import schema_stamp
from lacuna_unlearn.bench.gate.criteria import FAIL, MISSING, PASS, Criterion, Subject, Verdict, _fmt, exit_code

__all__ = ["format_table", "verdicts_json", "write_junit"]


def format_table(verdicts: Sequence[Verdict], *, allow_missing: bool = False) -> str:
    """The verdicts as an aligned text table with a one-line summary."""
    header = ("criterion", "metric", "subject", "measured", "threshold", "verdict")
    rows = [
        (
            v.criterion.name if not v.criterion.name.startswith("check ") else "check",
            v.criterion.metric,
            v.subject,
            _fmt(v.value, v.criterion.threshold),
            f"{v.criterion.op} {_fmt(v.criterion.threshold)}",
            v.status + (" (allowed)" if v.status == MISSING and allow_missing else ""),
        )
        for v in verdicts
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = {s: sum(v.status == s for v in verdicts) for s in (PASS, FAIL, MISSING)}
    code = exit_code(verdicts, allow_missing=allow_missing)
    lines.append("")
    lines.append(
        f"{'PASSED' if code == 0 else 'FAILED'}: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[MISSING]} missing"
        + (" (missing allowed)" if allow_missing and counts[MISSING] else "")
    )
    return "\n".join(lines)


def write_junit(path: str | os.PathLike[str], verdicts: Sequence[Verdict], *, allow_missing: bool = False) -> Path:
    """Write the verdicts as JUnit XML atomically: one testcase per criterion × subject (class
    ``lacuna.gate.<subject, sanitized>``), a ``<failure>`` for FAIL (and MISSING unless
    ``allow_missing``, else ``<skipped>``)."""
    from lacuna_metrics import write_text

    failures = sum(v.status == FAIL or (v.status == MISSING and not allow_missing) for v in verdicts)
    skipped = sum(v.status == MISSING and allow_missing for v in verdicts)
    attrs = {"name": "lacuna gate", "tests": str(len(verdicts)), "failures": str(failures), "errors": "0"}
    suites = ET.Element("testsuites", attrs)
    suite = ET.SubElement(suites, "testsuite", {**attrs, "skipped": str(skipped)})
    for v in verdicts:
        case = ET.SubElement(
            suite,
            "testcase",
            {
                # reporters split class names on dots: keep the subject (often a path) in one segment
                "classname": "lacuna.gate." + (re.sub(r"[^\w-]+", "_", v.subject).strip("_") or "subject"),
                "name": f"{v.subject}: {v.criterion.metric} {v.criterion.op} {_fmt(v.criterion.threshold)}",
                "file": v.source,
            },
        )
        if v.status == FAIL or (v.status == MISSING and not allow_missing):
            failure = ET.SubElement(case, "failure", {"message": v.message, "type": v.status})
            failure.text = f"{v.criterion.name} on {v.subject}: {v.message}"
        elif v.status == MISSING:
            ET.SubElement(case, "skipped", {"message": v.message})
        else:
            ET.SubElement(case, "system-out").text = v.message
    ET.indent(suites)
    return write_text(path, '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n")


def verdicts_json(
    verdicts: Sequence[Verdict], subjects: Sequence[Subject], *, allow_missing: bool = False
) -> dict[str, Any]:
    """The verdicts as a JSON-ready dict (non-finite values become null, with ``value_text``)."""
    criteria: list[Criterion] = list(dict.fromkeys(v.criterion for v in verdicts))
    sources = list(dict.fromkeys(str(s.document.path) for s in subjects))
    code = exit_code(verdicts, allow_missing=allow_missing)

    def value(v: Verdict) -> Any:
        n = v.number
        return n if n is not None and math.isfinite(n) else None

    from lacuna_metrics import build_manifest, file_fingerprint

    return {
        "schema": schema_stamp("gate"),
        # which bytes were judged: every input file's fingerprint, with the versions and hardware of the run
        "manifest": build_manifest(input_fingerprints={p: file_fingerprint(p) for p in sources if Path(p).is_file()}),
        "passed": code == 0,
        "exit_code": code,
        "allow_missing": allow_missing,
        "inputs": [_input_json(p, [s for s in subjects if str(s.document.path) == p]) for p in sources],
        "criteria": [
            {
                "name": c.name,
                "metric": c.metric,
                "op": c.op,
                "threshold": c.threshold if math.isfinite(c.threshold) else str(c.threshold),
            }
            for c in criteria
        ],
        "counts": {s.lower(): sum(v.status == s for v in verdicts) for s in (PASS, FAIL, MISSING)},
        "verdicts": [
            {
                "criterion": v.criterion.name,
                "metric": v.criterion.metric,
                "op": v.criterion.op,
                "threshold": v.criterion.threshold
                if math.isfinite(v.criterion.threshold)
                else str(v.criterion.threshold),
                "subject": v.subject,
                "source": v.source,
                "value": value(v),
                "value_text": None if v.value is None else _fmt(v.value),
                "status": v.status,
                "message": v.message,
            }
            for v in verdicts
        ],
    }


def _input_json(path: str, members: Sequence[Subject]) -> dict[str, Any]:
    """One input of the JSON report: path, kind and the checkpoint(s) it describes."""
    kind = members[0].document.kind
    entry: dict[str, Any] = {"path": path, "kind": kind}
    if kind == "run":
        recorded = {s.name: s.checkpoint for s in members if s.checkpoint is not None}
        if recorded:
            entry["checkpoints"] = recorded
    elif members[0].checkpoint is not None:
        entry["checkpoint"] = members[0].checkpoint
    return entry
