#!/usr/bin/env bash
# Peak resident memory per rank of the data-parallel layouts, for GPT-2 124M's shape at vocab 8192
# (91M parameters, P), against the model state each layout should hold: DDP 16P bytes (fp32
# values, gradients, AdamW m and v), ZeRO-1 8P + 8P/N, ZeRO-2 8P + 12P/N (cleave keeps the full
# gradient buffer backward accumulates into), ZeRO-3 ~20P/N (shard values, gradients, m, v, plus
# the reduced gradient shard) + the few units gathered at a time. Everything else (activations,
# the prepacked weights of fp32 GEMMs: 8 bytes per resident parameter, buffers) is the remainder.
# Usage: bench/memory.sh [RANKS=4]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 bench/random_tokens.py "$work" 8192 2000000
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
P=$(./build/cleave train configs/gpt2_124m.toml --set data.dir="$work" --set train.steps=0 \
      --set train.peak_gflops=1 --set train.out_dir="$work/count" 2>/dev/null |
    sed -n 's/.*model, \([0-9]*\) parameters.*/\1/p')
printf "P = %s parameters, %s ranks, micro-batch 4 x 256 tokens, fp32\n" "$P" "$ranks"
printf "%-8s %14s %16s %14s\n" layout "peak RSS/rank" "model state" "remainder"
for zero in 0 1 2 3; do
  name=$([ $zero = 0 ] && echo DDP || echo "ZeRO-$zero")
  mpirun --oversubscribe -np "$ranks" /usr/bin/time -f "RSS %M" ./build/cleave train configs/gpt2_124m.toml \
    --set data.dir="$work" --set train.steps=2 --set train.threads=1 --set train.log_interval=1 \
    --set train.val_interval=0 --set train.checkpoint_interval=-1 --set train.peak_gflops=1 \
    --set parallel.dp_shard="$ranks" --set parallel.zero_stage=$zero --set train.out_dir="$work/z$zero" \
    > "$work/z$zero.log" 2>&1 || { tail "$work/z$zero.log"; exit 1; }
  rss=$(grep '^RSS' "$work/z$zero.log" | awk '{print $2}' | sort -n | tail -1)
  state=$(awk -v p="$P" -v n="$ranks" -v z=$zero 'BEGIN {
    b = (z == 0) ? 16 * p : (z == 1) ? 8 * p + 8 * p / n : (z == 2) ? 8 * p + 12 * p / n : 20 * p / n;
    print b / 1048576 }')
  printf "%-8s %10.0f MiB %12.0f MiB %10.0f MiB\n" "$name" "$((rss / 1024))" "$state" "$(awk -v r="$rss" -v s="$state" 'BEGIN {print r / 1024 - s}')"
  rm -rf "$work/z$zero"
done
