#!/usr/bin/env bash
# The test suite: install (scripts/setup.sh), then the fast CPU pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
