#!/usr/bin/env bash
# Every figure the README and the guides state, made again by the commands they show, and judged against
# its stated range: prints claimed against measured, exits 1 when a figure falls outside (the claims, their
# pages and their commands are in src/gptforge/bench/readme_numbers.py). One CPU thread, as the docs' figures.
#   bash scripts/readme_numbers.sh                                  # everything: hours on a 2-core CPU
#   bash scripts/readme_numbers.sh --only default_job,plan          # some journeys (minutes)
#   bash scripts/readme_numbers.sh --only chat --seeds 11,12,13     # the chat path with your own seeds
#   bash scripts/readme_numbers.sh --list                           # the figures and their ranges
# Journeys write under --out (default runs/readme_numbers) and a rerun continues where one stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS-data,gguf} bash scripts/setup.sh  # the tokenizer journey trains with rustbpe (extra data); export gguf
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m gptforge.bench.readme_numbers "$@"
