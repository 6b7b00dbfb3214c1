"""Test helpers, not tests: the tiny memorizing LM (``tiny_lm``), the in-process gate (``gate_cli``), the scripts
that tests launch by path (``lm_eval_cpu_dp.py``, ``accelerate_cpu_fsdp.py``) and the presets snapshot.

Importable as ``helpers`` from every test folder (``tests/`` is on ``sys.path``: see ``pythonpath`` in
pyproject.toml). ``HELPERS`` is this folder, ``REPO`` the repository root, whatever folder a test lives in.
"""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
REPO = HELPERS.parents[1]
