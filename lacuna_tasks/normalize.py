"""Answer normalization: when does a generation count as producing a fact.

A fact counts as produced when the normalized answer is contained in the normalized output
(case-insensitive, whitespace-folded). Phone numbers and licence numbers are additionally
compared on digits only, so ``+1 (555) 010-2030`` and ``5550102030`` match.
"""

from __future__ import annotations

import re
import unicodedata

from lacuna_tasks.schema import get_field

_WS = re.compile(r"\s+")
_NON_DIGIT = re.compile(r"\D+")


def normalize_text(text: str) -> str:
    """Lower-case, NFKC-normalize and fold runs of whitespace to one space."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def digits_only(text: str) -> str:
    """Keep the decimal digits of ``text``."""
    return _NON_DIGIT.sub("", text)


def fact_produced(answer: str, output: str, field: str) -> bool:
    """Whether ``output`` contains ``answer`` for ``field`` (key like ``phone`` or PANORAMA column)."""
    spec = get_field(field)  # unknown fields fail even when the text happens to match
    target = normalize_text(answer)
    if not target:
        raise ValueError("empty answer: a blank target would match every output")
    if target in normalize_text(output):
        return True
    if spec.digits_match:
        target_digits = digits_only(answer)
        # Guard: require a real number, otherwise any digit in the output would match.
        if len(target_digits) >= 4 and target_digits in digits_only(output):
            return True
    return False
