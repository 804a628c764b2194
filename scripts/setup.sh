#!/usr/bin/env bash
# Create .venv (if needed) and install gptforge with its test dependencies, plus the offline
# GPT-2 tokenizer ranks. Idempotent and quick to re-run: pip runs only when pyproject.toml or the
# extras changed since the last install (a stamp in the venv).
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
# pip's own lines (Collecting, Downloading with a bar, Installing) show the minutes it takes: no -q
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC into $VENV (about 1 GB the first time: a few minutes) ..."
  "$PY" -m pip install "$TORCH_SPEC"
fi
EXTRAS=${EXTRAS-dev}
# Reinstall only when something it depends on changed: pyproject.toml, the extras asked for, or where
# the editable install points (a venv reused from another checkout). A stamp in the venv remembers.
STAMP="$VENV/.gptforge-install"
WANT="$(cat pyproject.toml) extras=[$EXTRAS] src=$PWD/src"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/gptforge" ] \
   && "$PY" -c "import gptforge, sys; sys.exit(not gptforge.__file__.startswith('$PWD/src/'))" 2>/dev/null; then
  echo "gptforge is installed and up to date in $VENV (pyproject.toml and extras unchanged)"
else
  echo "setup: installing gptforge (editable, extras [$EXTRAS]) into $VENV with: $("$PY" -c '
import sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = [e for e in sys.argv[1].split(",") if e]
print(", ".join(d for d in p["dependencies"] + [d for e in extras for d in p.get("optional-dependencies", {}).get(e, [])]))
' "$EXTRAS" 2>/dev/null || echo "the dependencies in pyproject.toml") ..."
  "$PY" -m pip install -e ".${EXTRAS:+[$EXTRAS]}"
  printf '%s' "$WANT" > "$STAMP"
fi
"$VENV/bin/gptforge" assets tokenizer
