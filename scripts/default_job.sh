#!/usr/bin/env bash
# The default job, end to end on whatever device is here: install, prepare Shakespeare, train a
# small GPT-2 (a few minutes on a 2-core CPU), save checkpoints, print samples.
# Re-running continues the run from its newest checkpoint instead of starting over.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS-} bash scripts/setup.sh  # core dependencies only
GF=".venv/bin/gptforge"
RUN=${RUN:-runs/shakespeare-cpu}
if [ ! -f data/shakespeare/shakespeare_train.bin ]; then
  "$GF" prepare shakespeare --out data/shakespeare
fi
if ls "$RUN"/checkpoints/step_* >/dev/null 2>&1; then
  "$GF" train --preset shakespeare-cpu --out "$RUN" --resume "$@"
else
  "$GF" train --preset shakespeare-cpu --out "$RUN" "$@"
fi
"$GF" sample --ckpt "$RUN" --prompt "ROMEO:" --num-samples 3 --max-new-tokens 60 --seed 42
