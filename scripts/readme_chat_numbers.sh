#!/usr/bin/env bash
# The chat guide's SFT -> RL numbers (docs/chat.md, section "Measured"), from its own commands, on the model
# the default job makes. Runs: the default job (if runs/shakespeare-cpu is missing), the guide's
# `prepare conversations` and `sft` (400-step schedule, a checkpoint every 50), `eval --tasks compare
# --limit 200` on each checkpoint, then `rl` from SFT step ${RL_FROM:-300} for ${RL_STEPS:-60} steps with
# the guide's settings at sampling temperature ${RL_TEMP:-0.7}, and `eval` of the RL run. Prints one table (greedy exact match, 95% interval)
# and writes it to ${OUT:-runs/readme_numbers}/table.md. One thread, as the guide's timings.
# Several hours on a 2-core CPU (SFT ~15 min, each eval ~1 min, RL ~20 s a step).
set -euo pipefail
cd "$(dirname "$0")/.."
GF=.venv/bin/gptforge
OUT=${OUT:-runs/readme_numbers}; RL_FROM=${RL_FROM:-300}; RL_STEPS=${RL_STEPS:-60}; RL_TEMP=${RL_TEMP:-0.7}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
[ -d runs/shakespeare-cpu/checkpoints ] || bash scripts/default_job.sh
[ -f "$OUT/conv.jsonl" ] || $GF prepare conversations compare --n 4000 --seed 1 --out "$OUT/conv.jsonl"
if [ ! -d "$OUT/sft/checkpoints/step_000400" ]; then
  args=(--train.seq_len 64 --train.micro_batch 16 --train.total_batch_tokens 1024 --train.max_steps 400
        --optim.lr 3e-3 --optim.warmup_steps 20 --train.ckpt_every 50 --train.keep_ckpts 0)
  if [ -d "$OUT/sft/checkpoints" ]; then $GF sft --out "$OUT/sft" --resume
  else $GF sft --init-from runs/shakespeare-cpu --data "$OUT/conv.jsonl" --out "$OUT/sft" --base-loss "${args[@]}"; fi
fi
row() {  # name, checkpoint
  local j="$OUT/eval_${1// /_}.json"
  [ -f "$j" ] || $GF eval --tasks compare --ckpt "$2" --limit 200 --json "$j" >/dev/null
  .venv/bin/python - "$1" "$j" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
t = next(r for r in json.load(open(path)) if r["task"] == "compare")
lo, hi = t["acc_ci95"]
print(f"| {name} | {t['accuracy'] * 100:.1f}% | {lo * 100:.1f}-{hi * 100:.1f}% | {t['n']} |")
PY
}
{
  echo "| model | compare greedy exact match | 95% interval | n |"
  echo "|---|---|---|---|"
  for s in 100 150 200 250 300 350 400; do row "sft step $s" "$OUT/sft/checkpoints/step_$(printf %06d $s)"; done
} | tee "$OUT/table.md"
RL="$OUT/rl_from${RL_FROM}_${RL_STEPS}$([ "$RL_TEMP" = 0.7 ] || echo "_t$RL_TEMP")"
[ -d "$RL/checkpoints" ] || $GF rl --init-from "$OUT/sft/checkpoints/step_$(printf %06d "$RL_FROM")" --task compare \
  --out "$RL" --steps "$RL_STEPS" --prompts 16 --group 8 --lr 2e-4 --warmup-steps 10 --updates-per-batch 2 \
  --temperature "$RL_TEMP" --max-new-tokens 20
row "rl $RL_STEPS steps from sft step $RL_FROM at temperature $RL_TEMP" "$RL" | tee -a "$OUT/table.md"
