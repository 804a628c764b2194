#!/usr/bin/env bash
# Issue 58 on a lent GPU, one device call (~9 min; timeouts sum to 590 s): the fused kernels against torch.compile alone, then
# GPT-2 124M, B 64, T 1024, 524,288 tokens a step with the new defaults (model.fused_ce=auto: on) beside
# the old default (fused_ce false) and each new switch, all in one `gptforge bench` process.
# Run from the checkout's root with gpu/ carried (see ../shared/gpu/CHECKLIST.md):
#   bash scripts/gpu_fused_switches.sh          # writes $OUT/fused_block.json, $OUT/switches58.json, logs
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src GPTFORGE_CACHE=$PWD/gpu/cache HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# 1. the kernels alone (and their CUDA correctness checks first: a wrong kernel is not worth timing)
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts='' -m gpu tests/kernels/test_fused_block.py 2>&1 | tee "$OUT/fused_block_tests.log" | tail -3
timeout 80 python3 scripts/bench_fused_block.py --json "$OUT/fused_block.json" 2>&1 | tee "$OUT/fused_block.log"
# 2. the training step, each switch beside the defaults (the first row) in one process
timeout 420 python3 -m gptforge bench --preset gpt2-124m --train.micro_batch 64 --train.seq_len 1024 \
  --train.total_batch_tokens 524288 --steps 8 --warmup 3 --json "$OUT/switches58.json" \
  --switch model.fused_ce=false \
  --switch model.fused_ln_residual=true \
  --switch model.fused_bias_gelu=true \
  --switch model.fused_ln_residual=true,model.fused_bias_gelu=true \
  2>&1 | tee "$OUT/switches58.log" | tail -25
