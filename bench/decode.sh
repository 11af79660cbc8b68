#!/usr/bin/env bash
# The kernels of a decoding step on GPT-2 124M's shape (`cleave bench-decode`,
# kernels/decode_bench.h; docs/inference.md and docs/performance.md quote it), ROUNDS runs, each
# printed, then the median over the runs of each ratio:
#   1. one layer's paged attention for 16 decoding sequences of 100-655 tokens, from a bf16
#      key/value cache against an fp32 one (serve.kv_cache_dtype): the time ratio;
#   2. the 48 bf16 products of a step with row tiles on (batch invariance on AMX), one call per
#      linear against one call per 16-row tile: the time ratio at 32, 48, 64 and 96 rows;
#   3. the spread of identical runs: p99/p50 of the 48 products at 16 rows (a 16-client decoding
#      step) and of arithmetic on registers alone sized to the same median, which no memory,
#      lock or neighbour of ours can lengthen: the machine's own floor for a p99 / p50 target
#      (bench/serve.sh's target at 16 clients is 2x).
# The two sides of each comparison alternate call by call inside a run.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/decode.sh [ROUNDS=3] [SECONDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} seconds=${2:-3}
source bench/common.sh
[ "$smoke" = 1 ] && rounds=1 seconds=0.05

for r in $(seq "$rounds"); do
  echo "--- round $r of $rounds"
  OMP_NUM_THREADS=2 "$cleave" bench-decode --seconds "$seconds" --threads 2 | tee "$work/round$r"
done

echo
echo "Medians over $rounds round(s):"
ratio() {  # a line's pattern (grep -E) and its field holding the ratio
  for f in "$work"/round*; do grep -E "$1" "$f" | awk -v k="$2" '{sub("x$", "", $k); print $k}'; done |
    median
}
printf '%-40s %6.2fx\n' "attention, bf16 cache / fp32 cache" "$(ratio '^bf16 cache / fp32 cache:' 6)"
for rows in 32 48 64 96; do
  printf '%-40s %6.2fx\n' "products at $rows rows, one call / tiles" "$(ratio "^$rows " 4)"
done
printf '%-40s %6.2fx\n' "p99/p50, the 48 products at 16 rows" "$(ratio '^the 48 products at 16 rows' 11)"
printf '%-40s %6.2fx\n' "p99/p50, arithmetic on registers alone" "$(ratio '^arithmetic on registers alone' 9)"
