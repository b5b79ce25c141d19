#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with textgym installed (editable) and the
# tools its tests and linters need. Safe to run again. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "textgym is installed in .venv; run the tests with: .venv/bin/python -m pytest"
