#!/usr/bin/env bash
# Issue 58, "know the anchor", one device call (~8 min): llm.c (cuDNN) as built until now (nvcc's default
# target, compute_75 PTX JIT-compiled for Hopper, because llm.c's Makefile never detects the GPU) against
# llm.c built for the GPU (GPU_COMPUTE_CAPABILITY=90), each beside gptforge's defaults in the same call;
# then the sm_90 build once more with -ge 2 (GELU in cuBLASLt's epilogue, forward and backward).
# Run from the checkout's root with gpu/ carried (gpu/llmc: ../shared/reference/llm.c, see CHECKLIST.md).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src GPTFORGE_CACHE=$PWD/gpu/cache HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
lscpu | grep -E "Model name|^CPU\(s\)"; df -h . | tail -1
for arch in none auto; do
  timeout 240 bash scripts/bench_vs_llmc.sh gpu/llmc --cudnn 1 --arch $arch -x 10 -w 3 --out "$OUT/llmc_$arch" \
    2>&1 | tee "$OUT/llmc_$arch.log" | tail -6
done
B=$OUT/llmc_auto/llmc-build
if [ -x "$B/train_gpt2cu" ]; then  # the sm_90 build again, -ge 2, from the same shard; its report beside the same gptforge run
  CUDNN=$(python3 -c "import glob, sys; print(next((h.rsplit('/include/', 1)[0] for p in sys.path for h in glob.glob(p + '/nvidia/cudnn/include/cudnn.h')), ''))")
  (cd "$B" && LD_LIBRARY_PATH="$CUDNN/lib:/usr/local/cuda/lib64" timeout 90 ./train_gpt2cu -i ../tokens_train.bin \
    -j ../tokens_train.bin -e d12 -b 64 -t 1024 -d 524288 -x 10 -z 0 -c 0.1 -l 0.0006 -q 0.0 -u 700 -n 0 \
    -v 100000 -s 0 -h 0 -r 0 -ge 2) > "$OUT/llmc_ge2.log" 2>&1
  python3 -m gptforge.bench.llmc report --llmc-log "$OUT/llmc_ge2.log" --gptforge-json "$OUT/llmc_auto/gptforge.json" \
    --skip 3 --json "$OUT/llmc_ge2_compare.json" 2>&1 | tail -6
fi
grep -h "GPU_COMPUTE\|make -C" "$OUT"/llmc_*/llmc-build.cmd
rm -rf "$OUT"/llmc_*/llmc-build "$OUT"/llmc_*/tokens_train.bin "$OUT"/llmc_*/cudnnlib
