#!/usr/bin/env bash
# Peak resident memory per rank of the data-parallel layouts on 2 and 4 ranks, for GPT-2 124M's
# shape at vocab 8192 (P = 92M parameters), fp32, against the model state each layout should hold:
#   DDP 16P bytes (values, gradients, AdamW m and v), ZeRO-1 8P + 8P/N (m and v sharded),
#   ZeRO-2 4P + 12P/N (the gradients too), ZeRO-3 16P/N (everything sharded).
# Every rank takes one sequence per step whatever N, so activations are the same at N = 2 and 4:
# what changes between the two is the model state, and the script compares the measured change
# of the peak with the predicted one. The remainder (peak minus model state) is activations, the
# prepacked copies of fp32 GEMM weights (8 bytes per resident matmul parameter), the units ZeRO-2/3
# hold in flight, communication buffers and the runtime. CLEAVE_BENCH_SMOKE=1 (bench/common.sh):
# vocab 256, the tiny model, 1 step a run, on 1 and 2 ranks.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
vocab=8192 steps=3 model=() lo=2 hi=4
[ "$smoke" = 1 ] && vocab=256 steps=1 model=("${tiny[@]}") lo=1 hi=2
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000
common=(--set data.dir="$work" --set model.vocab_size="$vocab" "${model[@]}" --set train.dtype=fp32
        --set train.threads=1 --set train.peak_gflops=1 --set train.val_interval=0
        --set train.checkpoint_interval=-1 --set train.log_interval=1)
P=$("$cleave" train configs/gpt2_124m.toml "${common[@]}" --set train.steps=0 \
      --set train.out_dir="$work/count" | sed -n 's/.*model, \([0-9]*\) parameters.*/\1/p')
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
state() {  # zero_stage N -> predicted model-state bytes per rank
  awk -v p="$P" -v z="$1" -v n="$2" 'BEGIN {
    print (z == 0) ? 16 * p : (z == 1) ? 8 * p + 8 * p / n : (z == 2) ? 4 * p + 12 * p / n : 16 * p / n }'
}
printf "P = %s parameters, fp32, one sequence of 256 tokens per rank per step\n" "$P"
printf "%-7s %3s %15s %13s %11s\n" layout N "peak RSS/rank" "model state" remainder
declare -A peak
for zero in 0 1 2 3; do
  name=$([ $zero = 0 ] && echo DDP || echo "ZeRO-$zero")
  for n in $lo $hi; do
    log=$work/z$zero-n$n.log
    mpirun --oversubscribe -np "$n" "$cleave" train \
      configs/gpt2_124m.toml "${common[@]}" --set train.steps=$steps --set train.micro_batch_size="$n" \
      --set parallel.dp_shard="$n" --set parallel.zero_stage=$zero \
      --set train.out_dir="$work/z$zero-n$n" > "$log" 2>&1 || { tail "$log"; exit 1; }
    # Every rank's peak RSS as cleave measured it (metrics.jsonl, the last logged step): the largest.
    mib_peak=$(/usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "peak_rss_mib_per_rank" in l]
print(max(rows[-1]["peak_rss_mib_per_rank"]) if rows else "")' "$work/z$zero-n$n/metrics.jsonl")
    [ -n "$mib_peak" ] || { echo "no peak RSS in $work/z$zero-n$n/metrics.jsonl:"; tail "$log"; exit 1; }
    peak[$zero,$n]=$(awk -v m="$mib_peak" 'BEGIN { printf "%.0f", m * 1048576 }')
    s=$(state $zero "$n")
    printf "%-7s %3s %11s MiB %9s MiB %7s MiB\n" "$name" "$n" "$(mib "${peak[$zero,$n]}")" \
      "$(mib "$s")" "$(mib "$(awk -v a="${peak[$zero,$n]}" -v b="$s" 'BEGIN {print a - b}')")"
    rm -rf "$work/z$zero-n$n"
  done
done
echo
echo "change of the peak from N = $lo to N = $hi, measured against the model state's predicted change:"
for zero in 0 1 2 3; do
  name=$([ $zero = 0 ] && echo DDP || echo "ZeRO-$zero")
  measured=$((peak[$zero,$lo] - peak[$zero,$hi]))
  predicted=$(awk -v a="$(state $zero $lo)" -v b="$(state $zero $hi)" 'BEGIN {print a - b}')
  printf "%-7s %6s MiB predicted %6s MiB" "$name" "$(mib $measured)" "$(mib "$predicted")"
  awk -v m="$measured" -v p="$predicted" 'BEGIN {
    if (p > 0) printf "  (%+.1f%%)", 100 * (m - p) / p; print "" }'
done
