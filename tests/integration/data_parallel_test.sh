#!/usr/bin/env bash
# Data-parallel layouts against the single-process reference (docs/architecture.md, Equivalence):
# DDP, ZeRO-1, ZeRO-2, ZeRO-3 on 2 and 4 ranks, HSDP (dp_replicate 2 x dp_shard 2, ZeRO-3) and
# hybrid ZeRO-1, with and without gradient accumulation, in fp32 and bf16; the same layout twice is
# bitwise identical; a checkpoint of one layout resumes under another with the reference's losses.
# compare_runs.py holds the bounds, measured from honest runs (docs/data_parallel.md,
# "Equivalence bounds"), and picks fp32's or bf16's from the checkpoints.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set data.dir="$data" --set train.steps=20 --set train.log_interval=1
        --set train.val_interval=10 --set train.checkpoint_interval=10 --set train.threads=1
        --set parallel.comm_timeout_s=60)
one_micro=(--set train.micro_batch_size=8 --set train.grad_accum_steps=1)

for accum in 1 2; do
  set_batch=(--set train.micro_batch_size=$((8 / accum)) --set train.grad_accum_steps=$accum)
  run ref-a$accum 1 "${set_batch[@]}"
  for layout in "2 ddp 1 2 0" "2 zero1 1 2 1" "2 zero2 1 2 2" "2 zero3 1 2 3" "4 ddp 1 4 0" \
                "4 zero1 1 4 1" "4 zero2 1 4 2" "4 zero3 1 4 3" "4 hsdp 2 2 3" "4 hybrid-zero1 2 2 1"; do
    read -r np name replicate shard zero <<<"$layout"
    run "$name$np-a$accum" "$np" "${set_batch[@]}" --set parallel.dp_replicate=$replicate \
      --set parallel.dp_shard=$shard --set parallel.zero_stage=$zero
    $compare "$work/ref-a$accum" "$work/$name$np-a$accum"
    # Every stage's collectives, measured, are what the run predicted for its stage: ZeRO-1 adds
    # the gathers of the updated shards, ZeRO-3 gathers each unit as often as the step program
    # says, HSDP all-reduces the shards over the replicas. (ZeRO-2 sends what DDP does, a
    # reduce-scatter and an all-gather being an all-reduce; its one file per shard tells them apart
    # below.)
    axis_bytes dp "$name$np-a$accum"
  done
done

# The same layout and seed twice: bitwise identical losses and checkpoints.
run zero2-4-again 4 "${one_micro[@]}" --set parallel.dp_shard=4 --set parallel.zero_stage=2
diff <(numbers "$work/zero24-a1") <(numbers "$work/zero2-4-again") \
  || { echo "FAIL: rerun of zero2 x4 gave other losses"; exit 1; }
[ "$(ls "$work/zero24-a1/step_00000020" | grep -c safetensors)" = 4 ] \
  || { echo "FAIL: a ZeRO-2 x4 checkpoint should hold one file per shard"; exit 1; }
for f in "$work"/zero24-a1/step_00000020/*.safetensors; do
  cmp "$f" "$work/zero2-4-again/step_00000020/$(basename "$f")" \
    || { echo "FAIL: rerun of zero2 x4 gave another checkpoint"; exit 1; }
done

# Resume across layouts: DDP x2 stops at step 10 and ZeRO-2 x4 resumes; ZeRO-3 x4 stops and
# HSDP 2x2 resumes.
run cross 2 "${one_micro[@]}" --set parallel.dp_shard=2 --set parallel.zero_stage=0 --exit-after 10
run cross 4 "${one_micro[@]}" --set parallel.dp_shard=4 --set parallel.zero_stage=2 --resume latest
grep -q "resumed at step 10" "$work/cross.log" || { echo "FAIL: cross-layout resume did not resume"; exit 1; }
$compare "$work/ref-a1" "$work/cross" --from-step 11
run cross3 4 "${one_micro[@]}" --set parallel.dp_shard=4 --set parallel.zero_stage=3 --exit-after 10
run cross3 4 "${one_micro[@]}" --set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3 --resume latest
$compare "$work/ref-a1" "$work/cross3" --from-step 11

# bf16: a layout against the bf16 reference, within bf16's tolerance.
run ref-bf16 1 "${one_micro[@]}" --set train.dtype=bf16
for layout in "2 ddp 1 2 0" "2 zero1 1 2 1" "2 zero2 1 2 2" "2 zero3 1 2 3" "4 hsdp 2 2 3"; do
  read -r np name replicate shard zero <<<"$layout"
  run "$name$np-bf16" "$np" "${one_micro[@]}" --set train.dtype=bf16 --set parallel.dp_replicate=$replicate \
    --set parallel.dp_shard=$shard --set parallel.zero_stage=$zero
  $compare "$work/ref-bf16" "$work/$name$np-bf16"
done
# bf16 reruns are bitwise identical too (HSDP: sharded and replicated groups both in play).
run hsdp4-bf16-again 4 "${one_micro[@]}" --set train.dtype=bf16 --set parallel.dp_replicate=2 \
  --set parallel.dp_shard=2 --set parallel.zero_stage=3
diff <(numbers "$work/hsdp4-bf16") <(numbers "$work/hsdp4-bf16-again") \
  || { echo "FAIL: rerun of HSDP 2x2 bf16 gave other losses"; exit 1; }
echo "data-parallel layouts match the reference"

# mpirun's default binding of 2 ranks puts each on one core, shared with its communication
# progress thread: the run says so and which flag to pass; unbound, it says nothing.
bound() {  # BIND: rank 0's start-up note under mpirun --bind-to BIND
  mpirun --bind-to "$1" -np 2 "$cleave" train "$cfg" --set data.dir="$data" "${twenty_steps[@]}" \
    --set train.steps=1 --set train.checkpoint_interval=-1 --set train.out_dir="$work/bind-$1" 2>&1 |
    grep -c "cleave: note: rank 0 is bound to one CPU, .*; under mpirun --bind-to none is faster" || true
}
if [ "$(nproc)" -gt 1 ]; then
  [ "$(bound core)" = 1 ] || { echo "FAIL: no note on a rank bound to one core"; exit 1; }
  [ "$(bound none)" = 0 ] || { echo "FAIL: a note on unbound ranks"; exit 1; }
  echo "a rank bound to one core is told to launch with --bind-to none"
fi
# A rank bound to fewer CPUs than its threads is warned, with mpirun's options.
mpirun --bind-to core -np 1 "$cleave" train "$cfg" --set data.dir="$data" "${twenty_steps[@]}" \
  --set train.threads=2 --set train.steps=1 --set train.checkpoint_interval=-1 \
  --set train.out_dir="$work/bind-threads" > "$work/bind-threads.log" 2>&1 \
  || { cat "$work/bind-threads.log"; echo "FAIL: the 2-thread run bound to one core"; exit 1; }
grep -q "cleave: warning: rank 0 may run on 1 CPU(s) but uses 2 threads; under mpirun pass --bind-to none or --map-by slot:PE=2" \
  "$work/bind-threads.log" || { cat "$work/bind-threads.log"; echo "FAIL: no warning on 2 threads bound to one core"; exit 1; }
echo "2 threads bound to one core are told mpirun's options"
