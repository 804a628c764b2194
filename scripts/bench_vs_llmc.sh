#!/usr/bin/env bash
# gptforge against llm.c on the same GPU, in one command: build llm.c's train_gpt2cu from a checkout,
# run it and `gptforge bench` at the same B, T and total batch on the same token shard, one after the
# other in this process tree, then print both tokens/s, MFU (llm.c's formula, one peak) and peak
# memory, the ratio, and a JSON file (parsing and the report: src/gptforge/bench/llmc.py).
#
#   scripts/bench_vs_llmc.sh ../shared/reference/llm.c                      # GPT-2 124M, B 64, T 1024, 524288
#   scripts/bench_vs_llmc.sh LLMC_DIR -b 32 -x 20 --cudnn 1 -- --switch model.fused_ce=true
#
# Options: -b B (64)  -t T (1024)  -d total batch tokens (524288)  -x steps per system (16)
#          -w warm-up steps left out of both medians (3)  --cudnn auto|0|1 (auto: when the cuDNN headers
#          and the cudnn-frontend include dir are found; CUDNN_FRONTEND_PATH names the latter)
#          --arch auto|NN|none (auto: the GPU's compute capability, e.g. 90; none: nvcc's default target)
#          --llmc-args "ARGS" (appended to train_gpt2cu's flags, e.g. "-ge 2": GELU in cuBLASLt's epilogue)
#          --out DIR (runs/bench_vs_llmc)  --python PY ($PYTHON or python3)
#          -- ARGS: passed on to `gptforge bench` (e.g. --switch model.fused_ce=true, --train.compile_mode ...)
# llm.c is built in a copy under DIR (never in the checkout, never in this repository). Its Makefile means
# to detect the GPU's architecture but never does (its file_exists_in_path is `$(which ...)`, a make
# variable that is always empty, and the query lacks `$(shell ...)`), so `make` alone compiles for nvcc's
# default, compute_75 PTX that the driver JIT-compiles for Hopper: MAX_1024_THREADS_BLOCKS is 1 instead
# of 2 (the fused classifier's launch bounds) and float->bf16 conversions are emulated. --arch auto passes
# GPU_COMPUTE_CAPABILITY (sm_90 on H100/H200): the best llm.c this machine builds.
set -euo pipefail
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "bench_vs_llmc.sh: error: $*" >&2; exit 2; }

[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
LLMC_DIR=$1; shift
B=64; T=1024; D=524288; X=16; W=3; CUDNN=auto; ARCH=auto; LLMC_ARGS=""; OUT=runs/bench_vs_llmc; PY=${PYTHON:-python3}; EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    -b) B=$2; shift 2 ;;  -t) T=$2; shift 2 ;;  -d) D=$2; shift 2 ;;  -x) X=$2; shift 2 ;;  -w) W=$2; shift 2 ;;
    --cudnn) CUDNN=$2; shift 2 ;;  --out) OUT=$2; shift 2 ;;  --python) PY=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;  --llmc-args) LLMC_ARGS=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
for v in B T D X W; do [[ ${!v} =~ ^[0-9]+$ ]] || die "-$(echo "$v" | tr 'A-Z' 'a-z') ${!v}: expected a positive integer"; done
[ "$X" -gt "$W" ] || die "-x $X must exceed the warm-up steps -w $W"
[ $((D % (B * T))) -eq 0 ] || die "-d $D is not a multiple of B*T = $((B * T))"
[ -f "$LLMC_DIR/train_gpt2.cu" ] && [ -f "$LLMC_DIR/Makefile" ] || die "$LLMC_DIR is not an llm.c checkout (no train_gpt2.cu and Makefile)"
case "$CUDNN" in auto|0|1) ;; *) die "--cudnn $CUDNN: expected auto, 0 or 1" ;; esac
[[ $ARCH =~ ^(auto|none|[0-9]{2,3})$ ]] || die "--arch $ARCH: expected auto, none or a compute capability such as 90"
[[ $LLMC_ARGS =~ ^[-a-zA-Z0-9.\ ]*$ ]] || die "--llmc-args '$LLMC_ARGS': expected train_gpt2cu flags such as '-ge 2'"

# --- a GPU and a CUDA compiler, or nothing runs ---------------------------------------------------------
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
  || die "no NVIDIA GPU here (nvidia-smi missing or sees none): this comparison needs one GPU; nothing was run"
NVCC=$(command -v nvcc || true); [ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; }
[ -n "$NVCC" ] || die "no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin: llm.c cannot be built; nothing was run"
export PATH="$(dirname "$NVCC"):$PATH"
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || die "$PY's torch sees no CUDA device: gptforge would run on CPU; nothing was run"

mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
BUILD="$OUT/llmc-build"
echo "[bench_vs_llmc] building llm.c from $LLMC_DIR in $BUILD" >&2
rm -rf "$BUILD"; mkdir -p "$BUILD"
(cd "$LLMC_DIR" && tar --exclude=./build --exclude='./train_gpt2cu*' -cf - .) | tar -xf - -C "$BUILD"
MAKE_ARGS=(train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1)
if [ "$ARCH" = auto ]; then
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES:-0}" | head -n 1 | tr -d '. ')
  [[ $ARCH =~ ^[0-9]{2,3}$ ]] || die "nvidia-smi gave no compute capability ('$ARCH'); pass --arch 90 (or none)"
fi
[ "$ARCH" = none ] || MAKE_ARGS+=("GPU_COMPUTE_CAPABILITY=$ARCH")  # see the header: llm.c's own detection is broken
echo "[bench_vs_llmc] llm.c target: ${ARCH/none/nvcc default (compute_75 on CUDA 13)}" >&2
CUDNN_LIB=""
if [ "$CUDNN" != 0 ]; then
  CUDNN_ROOT=$("$PY" -c "import glob, sys; print(next((h.rsplit('/include/', 1)[0] for p in sys.path for h in glob.glob(p + '/nvidia/cudnn/include/cudnn.h')), ''))")
  FRONTEND=${CUDNN_FRONTEND_PATH:-}
  [ -n "$FRONTEND" ] || for d in "$BUILD/cudnn-frontend/include" "$HOME/cudnn-frontend/include"; do [ -d "$d" ] && FRONTEND=$d && break; done
  if [ -n "$CUDNN_ROOT" ] && [ -n "$FRONTEND" ]; then
    mkdir -p "$OUT/cudnnlib" && ln -sf "$CUDNN_ROOT/lib/libcudnn.so.9" "$OUT/cudnnlib/libcudnn.so"
    export CPATH="$CUDNN_ROOT/include${CPATH:+:$CPATH}" LIBRARY_PATH="$OUT/cudnnlib:/usr/local/cuda/lib64${LIBRARY_PATH:+:$LIBRARY_PATH}"
    MAKE_ARGS+=(USE_CUDNN=1 "CUDNN_FRONTEND_PATH=$FRONTEND" "NVCC_LDLIBS=-lnvrtc -lcuda")
    CUDNN_LIB="$CUDNN_ROOT/lib"; CUDNN=1
  elif [ "$CUDNN" = 1 ]; then
    die "--cudnn 1: need torch's nvidia/cudnn package (found: ${CUDNN_ROOT:-none}) and the cudnn-frontend headers (set CUDNN_FRONTEND_PATH; found: ${FRONTEND:-none})"
  else
    echo "[bench_vs_llmc] cuDNN headers or cudnn-frontend not found: llm.c without cuDNN attention (slower)" >&2; CUDNN=0
  fi
fi
echo "make -C $BUILD ${MAKE_ARGS[*]}" > "$OUT/llmc-build.cmd"  # the build, as run (the report names it)
make -C "$BUILD" "${MAKE_ARGS[@]}" > "$OUT/llmc-build.log" 2>&1 || { tail -30 "$OUT/llmc-build.log" >&2; die "llm.c build failed (log: $OUT/llmc-build.log)"; }

# --- the same tokens for both: a uniform-random GPT-2 shard in the llm.c format -------------------------
SHARD="$OUT/tokens_train.bin"
"$PY" -m gptforge.bench.llmc shard "$SHARD" --tokens $((D * X + B * T + 1 > 20000000 ? 20000000 : D * X + B * T + 1))

sample_memory() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" -lms 250 > "$1" & echo $!; }

echo "[bench_vs_llmc] llm.c: B $B T $T total $D, $X steps (cuDNN $CUDNN, arch $ARCH${LLMC_ARGS:+, $LLMC_ARGS})" >&2
SMI=$(sample_memory "$OUT/llmc.smi"); sleep 1
(cd "$BUILD" && LD_LIBRARY_PATH="${CUDNN_LIB:+$CUDNN_LIB:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ./train_gpt2cu -i "$SHARD" -j "$SHARD" -e d12 -b "$B" -t "$T" -d "$D" -x "$X" -z 0 -c 0.1 -l 0.0006 -q 0.0 \
  -u 700 -n 0 -v 100000 -s 0 -h 0 -r 0 $LLMC_ARGS) > "$OUT/llmc.log" 2>&1 || { kill "$SMI"; tail -20 "$OUT/llmc.log" >&2; die "train_gpt2cu failed (log: $OUT/llmc.log)"; }
kill "$SMI"

echo "[bench_vs_llmc] gptforge: the same shape, $((X - W)) timed steps after $W warm-up steps" >&2
SMI=$(sample_memory "$OUT/gptforge.smi"); sleep 1
"$PY" -m gptforge bench --preset gpt2-124m --train.micro_batch "$B" --train.seq_len "$T" \
  --train.total_batch_tokens "$D" --steps $((X - W)) --warmup "$W" --json "$OUT/gptforge.json" "${EXTRA[@]}" \
  > "$OUT/gptforge.log" 2>&1 || { kill "$SMI"; tail -20 "$OUT/gptforge.log" >&2; die "gptforge bench failed (log: $OUT/gptforge.log)"; }
kill "$SMI"

"$PY" -m gptforge.bench.llmc report --llmc-log "$OUT/llmc.log" --gptforge-json "$OUT/gptforge.json" --skip "$W" \
  --llmc-smi "$OUT/llmc.smi" --gptforge-smi "$OUT/gptforge.smi" --json "$OUT/compare.json"
