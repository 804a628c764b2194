#!/usr/bin/env bash
# Create .venv (if needed) and install gptforge with its test dependencies, plus the offline
# GPT-2 tokenizer ranks. Idempotent; safe to re-run.
#   TORCH_SPEC  torch requirement (default torch==2.13.0, the CPU build on the project machines;
#               on a GPU machine with torch already in the venv nothing is reinstalled)
#   VENV        virtual environment folder (default .venv)
#   EXTRAS      optional dependency groups to install (default dev: everything the tests need;
#               the default job sets it empty: torch, numpy, tiktoken, safetensors, tqdm only)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "$TORCH_SPEC"
fi
EXTRAS=${EXTRAS-dev}
"$PY" -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}"
"$VENV/bin/gptforge" assets tokenizer
