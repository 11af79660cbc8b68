#!/usr/bin/env bash
# FP8's current, blockwise and mxfp8 recipes (docs/precision.md#fp8): each layout of fp8_layouts.sh
# against its one-process run within compare_runs.py's bounds for the recipe, its rerun bitwise;
# ZeRO-3's FP8 gathers under current scaling bitwise its fp32 gathers; Llama at tp 2 with the
# tile recipes. Loss parity on real text, shortened (bench/precision.sh
# runs it in full): the test model as a Llama, 300 steps on the test corpus, the final validation
# loss of bf16 within 2% of fp32's and each recipe's, delayed included, within 1% of bf16's. The
# current scales of tp 2 and cp 2 after one step are one process's.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
source "$src/tests/integration/fp8_layouts.sh"
common=("${twenty_steps[@]}")
llama=(--set model.family=llama --set model.n_kv_heads=2)

for r in current blockwise mxfp8; do
  fp8_layouts $r
  echo "fp8 $r: every layout matches its one-process run"
done
# ZeRO-3's FP8 gathers under current scaling: the same bits as fp32 gathers.
run current-zero3x2-fp8gather 2 --set train.dtype=fp8 --set train.fp8_recipe=current \
  --set train.micro_batch_size=4 --set train.grad_accum_steps=2 --set parallel.dp_shard=2 \
  --set parallel.zero_stage=3 --set parallel.fp8_allgather=true
same_bits current-zero3x2 current-zero3x2-fp8gather 20
echo "current: FP8 gathers give the fp32 gathers' bits"

for r in blockwise mxfp8; do
  run "$r-llama" 1 "${llama[@]}" --set train.dtype=fp8 --set train.fp8_recipe=$r
  layout "$r-llama" "$r-llama-tp2" 2 "${llama[@]}" --set train.dtype=fp8 --set train.fp8_recipe=$r \
    --set parallel.tp=2
done
echo "Llama at tp 2 matches one process under the tile recipes"

common=(--set train.steps=300 --set train.val_interval=300 --set train.val_batches=8
        --set train.log_interval=50 --set train.checkpoint_interval=-1 --set train.threads=1
        --set optim.warmup_steps=30 "${llama[@]}")
val() { grep -o '"val_loss":[0-9.]*' "$work/$1/metrics.jsonl" | tail -1 | cut -d: -f2; }
within() {  # name reference percent
  local got want
  got=$(val "$1") want=$(val "$2")
  awk -v a="$got" -v b="$want" -v p="$3" 'BEGIN {d = 100 * (a / b - 1); exit !(d <= p && d >= -p)}' \
    || { echo "FAIL: $1's validation loss $got is not within $3% of $2's $want"; exit 1; }
  echo "$1: validation loss $got, $(awk -v a="$got" -v b="$want" 'BEGIN {printf "%+.2f%%", 100 * (a / b - 1)}') of $2's"
}
run parity-fp32 1
run parity-bf16 1 --set train.dtype=bf16
within parity-bf16 parity-fp32 2
for r in delayed current blockwise mxfp8; do
  run parity-$r 1 --set train.dtype=fp8 --set train.fp8_recipe=$r
  within parity-$r parity-bf16 1
done

# Current scales after one step, as each checkpoint records them (the latest products' scales of
# every linear, the largest over the ranks): tp and cp complete every amax, so their ranks took
# one process's scales, within rounding; a rank that took its shard's own would show.
common=(--set train.steps=1 --set train.val_interval=0 --set train.checkpoint_interval=1
        --set train.threads=1 --set train.dtype=fp8 --set train.fp8_recipe=current)
run one-step 1
run one-step-tp2 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
run one-step-cp2 2 --set parallel.cp=2
run one-step-llama 1 "${llama[@]}"
run one-step-llama-tp2 2 "${llama[@]}" --set parallel.tp=2
/usr/bin/python3 - "$work" "$src/tests/integration" <<'PY'
import glob, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from fp8_state import fp8_state
def scales(run):
    state = fp8_state(sorted(glob.glob(f"{work}/{run}/step_*"))[-1])
    return {name: t["scales"] for name, t in state.items()}
for ref, runs in [("one-step", ["one-step-tp2", "one-step-cp2"]),
                  ("one-step-llama", ["one-step-llama-tp2"])]:
    want = scales(ref)
    assert len(want) == 8, f"{ref} records {len(want)} linears, not 8"
    for run in runs:
        got = scales(run)
        assert got.keys() == want.keys(), f"{run} records {sorted(got)}"
        for name in want:
            for g, w in zip(got[name], want[name]):
                assert abs(g - w) <= 1e-5 * w, f"{run} {name}: scales {got[name]} against {want[name]}"
print("tp and cp take one process's current scales")
PY
