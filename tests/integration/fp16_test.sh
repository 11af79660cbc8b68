#!/usr/bin/env bash
# fp16 with the dynamic loss scaler (docs/precision.md). Each layout against the one-process fp16
# run within compare_runs.py's fp16 bounds, its rerun bitwise, with accumulation 2: DDP 2, ZeRO-1
# x 2, ZeRO-3 x 2, HSDP 2x2, tp 2 with SP, pp 2 under 1f1b, cp 2 (ring), and Llama at tp 2. A
# resumed run (the scaler's state in the checkpoint, its scale growing every 4 steps) is bitwise
# the run that did not stop. Overflows: from a scale of 2^30 the first steps overflow and are
# skipped, the same steps on every layout, and the runs agree afterwards. A loss scale key
# without fp16 is an error.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}"
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2 --set train.dtype=fp16)
llama=(--set model.family=llama --set model.n_kv_heads=2)
scales() { grep -o '"loss_scale":[^,}]*\|"skipped_steps":[^,}]*' "$work/$1/metrics.jsonl"; }

run ref 1
layout ref ddp2 2 --set parallel.dp_shard=2
layout ref zero1x2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=1
layout ref zero3x2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
layout ref hsdp2x2 4 --set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
layout ref tp2-sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
layout ref pp2 2 --set parallel.pp=2 --set parallel.pp_schedule=1f1b
layout ref cp2 2 --set parallel.cp=2
run ref-llama 1 "${llama[@]}"
layout ref-llama llama-tp2 2 "${llama[@]}" --set parallel.tp=2
echo "fp16 layouts match the one-process fp16 run"

grow=(--set train.loss_scale_growth_interval=4)
run grow 1 "${grow[@]}"
run grow-resumed 1 "${grow[@]}" --exit-after 10
run grow-resumed 1 "${grow[@]}" --resume latest
diff <(scales grow) <(scales grow-resumed) > /dev/null \
  || { echo "FAIL: the resumed run's loss scales differ"; scales grow-resumed; exit 1; }
grep -q '"loss_scale":1048576' "$work/grow/metrics.jsonl" \
  || { echo "FAIL: the scale did not grow to 2^20 in 20 steps at an interval of 4"; exit 1; }
same_bits grow grow-resumed 20
echo "a resumed fp16 run continues the scaler bitwise"

overflow=(--set train.loss_scale_initial=1073741824.0 --set train.loss_scale_hysteresis=1)
run overflow 1 "${overflow[@]}"
skipped=$(grep -o '"skipped_steps":[0-9]*' "$work/overflow/metrics.jsonl" | tail -1 | cut -d: -f2)
[ "$skipped" -gt 0 ] && [ "$skipped" -lt 20 ] \
  || { echo "FAIL: from 2^30, $skipped steps were skipped (expected some, not all)"; exit 1; }
grep -q "skipped: the gradients overflowed at loss scale 1.07374e+09; the scale is now 5.36871e+08" \
  "$work/overflow.log" || { echo "FAIL: no skip logged"; exit 1; }
for l in "ddp2 2 --set parallel.dp_shard=2" "tp2 2 --set parallel.tp=2" \
         "pp2 2 --set parallel.pp=2" "zero3x2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3"; do
  read -r name np set <<<"$l"
  run overflow-$name "$np" "${overflow[@]}" $set
  diff <(scales overflow) <(scales overflow-$name) > /dev/null \
    || { echo "FAIL: $name skipped other steps than one process"; exit 1; }
  $compare "$work/overflow" "$work/overflow-$name"
done
echo "from 2^30, $skipped steps overflow and are skipped alike on every layout"

expect_error 1 "$cfg: train.loss_scale_initial is set but train.dtype = \"bf16\": the loss scaler serves fp16 only" \
  --set train.dtype=bf16 --set train.loss_scale_initial=1024.0
echo "a loss scale key without fp16 is an error"
