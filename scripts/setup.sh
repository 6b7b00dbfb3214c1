#!/usr/bin/env bash
# Create .venv and install lacuna-bench (editable) with its test extras.
# torch goes first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build,
# while torch==2.13.0 resolves to the CPU wheel on the project's machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[test]"
