#!/usr/bin/env bash
# The heavy lane: real-model checks that take minutes (SmolLM2-135M-Instruct trained by every recipe,
# resumed and exported back; HellaSwag rows against transformers). Not in the default run (the `lane`
# marker is deselected there, to keep it near 10 minutes on 2 cores); CI does not run it.
#   bash scripts/test_lane.sh                 # every lane test
#   bash scripts/test_lane.sh -k hellaswag    # some of them
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -m lane "$@"
