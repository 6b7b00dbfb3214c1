"""``lacuna data generate``: profiles, splits and the dataset directory in one call.

The pieces live in their own modules: :mod:`lacuna_tasks.synth.profiles` (synthetic PANORAMA-style people),
:mod:`lacuna_tasks.synth.bios` (the texts written about them), :mod:`lacuna_tasks.synth.splits` (forget / retain / ... splits
and writing the dataset) and :mod:`lacuna_tasks.seeding` (the seeded streams). Their public names stay importable
from here (``docs/definitions.md#profiles-and-pii-fields``, ``#memorization-test-and-splits``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lacuna_tasks.schema import FORGET_GROUPS, RETAIN_GROUPS, ROLE_QA_TUNING, ROLE_TARGET
from lacuna_tasks.synth.bios import BIO_CONTENT_TYPES, bio_texts
from lacuna_tasks.synth.profiles import (
    GENERATOR_NAME,
    GENERATOR_VERSION,
    LOCALES,
    MIN_PROFILES,
    PANORAMA_COLUMNS,
    PROFILE_COLUMNS,
    QA_TUNING_PORTION,
    REFERENCE_DATE,
    faker_version,
    generate_profiles,
)
from lacuna_tasks.synth.splits import (
    DEFAULT_MAX_PEOPLE,
    MIN_MEMORIZED_QUESTIONS,
    VALIDATION_FIELDS,
    build_splits,
    dataset_splits,
    write_dataset,
)

__all__ = [
    "BIO_CONTENT_TYPES",
    "DEFAULT_MAX_PEOPLE",
    "GENERATOR_NAME",
    "GENERATOR_VERSION",
    "LOCALES",
    "MIN_MEMORIZED_QUESTIONS",
    "MIN_PROFILES",
    "PANORAMA_COLUMNS",
    "PROFILE_COLUMNS",
    "QA_TUNING_PORTION",
    "REFERENCE_DATE",
    "ROLE_QA_TUNING",
    "ROLE_TARGET",
    "VALIDATION_FIELDS",
    "bio_texts",
    "build_splits",
    "dataset_splits",
    "faker_version",
    "generate_dataset",
    "generate_profiles",
    "write_dataset",
]


def generate_dataset(
    out_dir: str | os.PathLike[str],
    *,
    profiles: int = 1200,
    seed: int = 42,
    people_per_field: int | None = 100,
    validation_people: int | None = 100,
    retain_eval_people: int = 0,
) -> Path:
    """Generate profiles, build the splits and write the dataset (``lacuna data generate``)."""
    rows = generate_profiles(profiles, seed=seed)
    splits = build_splits(
        rows,
        seed=seed,
        people_per_field=people_per_field,
        validation_people=validation_people,
        retain_eval_people=retain_eval_people,
    )
    parameters: dict[str, Any] = {
        "profiles": profiles,
        "people_per_field": people_per_field,
        "validation_people": validation_people,
    }
    if retain_eval_people:  # recorded only when used: the manifests of existing datasets stay as they were
        parameters["retain_eval_people"] = retain_eval_people
    manifest = {
        "seed": seed,
        "parameters": {
            **parameters,
            "locales": list(LOCALES),
            "reference_date": REFERENCE_DATE.isoformat(),
            "qa_tuning_portion": QA_TUNING_PORTION,
            "forget_groups": list(FORGET_GROUPS),
            "retain_groups": list(RETAIN_GROUPS),
        },
    }
    return write_dataset(out_dir, rows, splits, manifest=manifest)
