#!/usr/bin/env bash
# The layout search at scale (issue 32, docs/planner.md#search): `cleave plan --search` for Llama 3
# 405B on 16,384 H100s (configs/llama3_405b.toml, clusters/h100_sxm_ib.toml), the median wall time
# of 3 runs beside how many valid layouts the bounds dropped and how many were planned in full,
# and the best layout. The issue's target: under a minute. Smoke mode: the test suite's tiny
# model on 4 devices, one run.
# Usage: [CLEAVE_BENCH_SMOKE=1] bench/plan_search.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
cfg=configs/llama3_405b.toml world=16384 runs=3
[ "$smoke" = 1 ] && cfg=tests/configs/tiny_train.toml world=4 runs=1
times=()
for ((i = 0; i < runs; i++)); do
  start=$(date +%s%N)
  "$cleave" plan "$cfg" --world "$world" --cluster clusters/h100_sxm_ib.toml --search --top 3 \
    --json "$work/search.json" > "$work/out"
  times+=("$((($(date +%s%N) - start) / 1000000))")
done
grep -A4 "^search on" "$work/out"
seconds=$(printf '%s\n' "${times[@]}" | median)
/usr/bin/python3 - "$work/search.json" "$seconds" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["search"]
print(f'valid {s["valid"]}, beyond memory {s["beyond_memory"]}, beyond time {s["beyond_time"]}, '
      f'planned {s["planned"]} ({s["fitting"]} fit)')
print(f'search {float(sys.argv[2]) / 1000:.1f} s (median wall time)')
PY
