"""Seeded randomness: every random choice in LACUNA data and prompts derives from stable hashes.

A stream is named by its parts (a purpose string, the seed, a person ID, a field, ...) and seeded with the
first 64 bits of SHA-256 over them, never Python's ``hash()`` (salted per process) and never the clock, so
profiles, splits, prompts and probes are identical across processes, machines and Python versions
(``docs/definitions.md#profiles-and-pii-fields``).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

__all__ = ["stable_rng", "stable_seed"]


def stable_seed(*parts: Any) -> int:
    """A 64-bit seed from SHA-256 of the parts (process-independent, unlike ``hash()``)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def stable_rng(*parts: Any) -> random.Random:
    """A ``random.Random`` seeded by ``stable_seed(*parts)``."""
    return random.Random(stable_seed(*parts))
