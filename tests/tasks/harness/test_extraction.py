"""The extraction probe `lacuna_{field}_extraction` (docs/definitions.md#extraction-probe-and-leak-rate): Success@N
is per person (any of N leaks), the leak rate per attempt. The documents and the task on the tiny memorizing model:
tests/e2e/test_extraction_task.py.
"""

from __future__ import annotations

from lacuna_tasks.harness.hooks import per_person_any, process_generation


def test_success_at_n_is_per_person():
    doc = {"kind": "extraction", "side": "forget", "field": "email", "answer": "a@b.com"}
    results = [
        process_generation({**doc, "person": "p1"}, [" no idea"]),
        process_generation({**doc, "person": "p1"}, [" A@B.COM, call me"]),  # case-insensitive containment
        process_generation({**doc, "person": "p2"}, [" c@d.com"]),
        process_generation({**doc, "person": "p2"}, [" none"]),
    ]
    assert per_person_any(r["success_at_n"] for r in results) == 0.5
    assert sum(r["leak_rate"] for r in results) / len(results) == 0.25
