#!/usr/bin/env bash
# Issue 58, "know the anchor", one device call (~8 min). Why llm.c ran at 407-460K tokens/s, not 525K:
#  1. the build: llm.c as built until now (nvcc's default target, compute_75 PTX JIT-compiled for Hopper,
#     because llm.c's Makefile never detects the GPU) against llm.c built for sm_90, each beside gptforge's
#     defaults in the same call (scripts/bench_vs_llmc.sh --arch none / auto);
#  2. the sm_90 build with -ge 2 (GELU in cuBLASLt's epilogue, forward and backward);
#  3. the tokens: the uniform-random shard (every run so far) against a Zipf-distributed one shaped like
#     text: llm.c's encoder backward buckets each micro-step's tokens on the CPU (an unordered_map of
#     vectors, 3 per distinct token), ~110K buckets for 65,536 uniform tokens against ~30K for text;
#  4. the machine: runtime (uname -r 4.4.0 is gVisor, whose syscall interception taxes llm.c's
#     synchronous host work: 3 pageable cudaMemcpy, 2 cudaDeviceSynchronize and the bucketing per
#     micro-step), CPU model, GPU clocks and power limit, SM utilisation sampled during each llm.c run.
# Run from the checkout's root with gpu/ carried (gpu/llmc: ../shared/reference/llm.c, see CHECKLIST.md).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src GPTFORGE_CACHE=$PWD/gpu/cache HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ uname -r; nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)"; df -h . | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } 2>&1 | tee "$OUT/machine.txt"
for arch in none auto; do
  timeout 220 bash scripts/bench_vs_llmc.sh gpu/llmc --cudnn 1 --arch $arch -x 10 -w 3 --out "$OUT/llmc_$arch" \
    2>&1 | tee "$OUT/llmc_$arch.log" | tail -6
done
B=$OUT/llmc_auto/llmc-build
if [ -x "$B/train_gpt2cu" ]; then
  CUDNN=$(python3 -c "import glob, sys; print(next((h.rsplit('/include/', 1)[0] for p in sys.path for h in glob.glob(p + '/nvidia/cudnn/include/cudnn.h')), ''))")
  python3 -c "
import numpy as np; from pathlib import Path; from gptforge.data.shards import write_shard
rng = np.random.default_rng(0); n = 6_000_000
ranks = rng.zipf(1.1, 4 * n); ranks = ranks[ranks <= 50257][:n] - 1  # Zipf(1.1) over the vocabulary, like text
write_shard(Path('$OUT/llmc_auto/tokens_zipf.bin'), rng.permutation(50257)[ranks].astype(np.int64))
print('zipf shard: distinct tokens in the first 65,536:', len(np.unique(ranks[:65536])))"
  for run in "ge2 tokens_train.bin -ge 2" "zipf tokens_zipf.bin -ge 0"; do
    set -- $run; name=$1; shard=$2; shift 2
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/llmc_$name.util" & SMI=$!
    (cd "$B" && LD_LIBRARY_PATH="$CUDNN/lib:/usr/local/cuda/lib64" timeout 60 ./train_gpt2cu -i ../$shard \
      -j ../$shard -e d12 -b 64 -t 1024 -d 524288 -x 10 -z 0 -c 0.1 -l 0.0006 -q 0.0 -u 700 -n 0 \
      -v 100000 -s 0 -h 0 -r 0 "$@") > "$OUT/llmc_$name.log" 2>&1
    kill $SMI
    echo "== llm.c sm_90, $name ($*): utilization samples $(sort -n "$OUT/llmc_$name.util" | uniq -c | tr '\n' ' ')"
    python3 -m gptforge.bench.llmc report --llmc-log "$OUT/llmc_$name.log" \
      --gptforge-json "$OUT/llmc_auto/gptforge.json" --skip 3 --json "$OUT/llmc_${name}_compare.json" 2>&1 | tail -5
  done
fi
grep -h "make -C" "$OUT"/llmc_*/llmc-build.cmd
rm -rf "$OUT"/llmc_*/llmc-build "$OUT"/llmc_*/tokens_*.bin "$OUT"/llmc_*/cudnnlib
