"""One home for the schema names and versions of every artifact lacuna-bench writes, so a schema bump is declared
once: ``score.json``, ``results.json``, the gate's, the attack's and the diagnostics' JSON (docs/report.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SCHEMAS", "read_schema", "schema_stamp"]


#: Artifact kind -> (schema name, newest version this package writes and reads).
SCHEMAS: dict[str, tuple[str, int]] = {
    # lacuna run's results.json (2: every ci.<metric> is an exact interval {low, high, k, n, level, method} over
    # persons, was a [low, high] percentile bootstrap)
    "run": ("lacuna-bench/run", 2),
    # lacuna score's score.json (2: fingerprints cover every weight byte; 3: null calibration at the update's own
    # scale, with draws and spread: null_calibration.targets.*.families.*.{null_sd, z, sample_auc})
    "score": ("lacuna-bench/score", 3),
    "gate": ("lacuna-bench/gate", 1),  # lacuna gate --json
    "attack": ("lacuna-bench/attack", 3),  # 3: Success@N under a named judge (default lacuna)
    "diagnose": ("lacuna-bench/diagnose", 2),  # 2: mean_pca_distance averages the transformer layers 1..L only
    "meta": ("lacuna-bench/meta", 1),  # lacuna meta's meta.json
    # the provenance sidecar of a file written in LACUNA's key names (lacuna_unlearn.bench.report.lacuna_keys)
    "lacuna_files": ("lacuna-bench/lacuna-files", 1),
}


def schema_stamp(kind: str) -> dict[str, Any]:
    """``{"name": ..., "version": ...}`` for a new artifact of ``kind`` (a :data:`SCHEMAS` key)."""
    if kind not in SCHEMAS:
        raise KeyError(f"unknown artifact kind {kind!r}; known: {', '.join(SCHEMAS)}")
    name, version = SCHEMAS[kind]
    return {"name": name, "version": version}


def read_schema(doc: Mapping[str, Any]) -> tuple[str | None, Any]:
    """(schema name, version) of a JSON document in either shape this package has written:
    ``"schema": {"name", "version"}`` or ``"schema": NAME`` beside ``"schema_version"`` / ``"version"``."""
    schema = doc.get("schema")
    if isinstance(schema, Mapping):
        return schema.get("name"), schema.get("version")
    if isinstance(schema, str):
        return schema, doc.get("schema_version", doc.get("version"))
    return None, None
