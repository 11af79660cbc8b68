#!/usr/bin/env bash
# The same config and seed twice: bitwise identical losses and checkpoints. A run interrupted
# after 5 steps and resumed: bitwise identical losses and final checkpoint to the uninterrupted
# run. In fp32 and in bf16.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=$src/tests/configs/tiny_train.toml

losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,}]*\).*/\1/'; }
val_losses() { grep '"val_loss"' "$1/metrics.jsonl" | sed 's/.*"val_loss":\([^,}]*\).*/\1/'; }

for dtype in fp32 bf16; do
  run() { "$cleave" train "$cfg" --set data.dir="$data" --set train.dtype=$dtype --set train.out_dir="$work/$dtype-$1" "${@:2}" > "$work/$dtype-$1.log"; }
  run a
  run b
  run c --exit-after 5
  grep -q "exiting after 5 steps" "$work/$dtype-c.log"
  run c --resume latest
  grep -q "resumed at step 5" "$work/$dtype-c.log"
  ! grep -q "^resume:" "$work/$dtype-c.log" || { echo "FAIL $dtype: the same config's resume reports a change"; exit 1; }

  [ "$(losses "$work/$dtype-a" | wc -l)" -ge 6 ] || { echo "FAIL $dtype: too few loss lines"; exit 1; }
  diff <(losses "$work/$dtype-a") <(losses "$work/$dtype-b") || { echo "FAIL $dtype: rerun losses differ"; exit 1; }
  diff <(val_losses "$work/$dtype-a") <(val_losses "$work/$dtype-b") || { echo "FAIL $dtype: rerun val losses differ"; exit 1; }
  cmp "$work/$dtype-a/step_00000012/model-rank00000.safetensors" "$work/$dtype-b/step_00000012/model-rank00000.safetensors" \
    || { echo "FAIL $dtype: rerun checkpoints differ"; exit 1; }
  # The resumed run logged steps 2, 4 before the exit and 6.. after: together they are the
  # uninterrupted run's lines.
  diff <(losses "$work/$dtype-a") <(losses "$work/$dtype-c") || { echo "FAIL $dtype: resumed losses differ"; exit 1; }
  cmp "$work/$dtype-a/step_00000012/model-rank00000.safetensors" "$work/$dtype-c/step_00000012/model-rank00000.safetensors" \
    || { echo "FAIL $dtype: resumed final checkpoint differs"; exit 1; }
  # The loss falls.
  first=$(losses "$work/$dtype-a" | head -1) last=$(losses "$work/$dtype-a" | tail -1)
  awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' || { echo "FAIL $dtype: loss did not fall ($first -> $last)"; exit 1; }
  echo "$dtype: reruns and resume bitwise identical; loss $first -> $last"
done

# A resume under another seed and global batch runs, and says that its batches are not the
# checkpointed run's.
ck=$work/fp32-a/step_00000012
"$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/changed" --set train.steps=13 \
  --set train.seed=7 --set train.grad_accum_steps=1 --resume "$ck" > "$work/changed.log"
key() { sed -n "s/^$1 = //p" "$cfg"; }
batch=$(( $(key micro_batch_size) * $(key grad_accum_steps) ))
for line in "train.seed is 7, $(key seed) in checkpoint $ck" \
    "the global batch (train.micro_batch_size x train.grad_accum_steps) is $(key micro_batch_size), $batch in checkpoint $ck"; do
  grep -qxF "resume: $line: the batches from step 13 on are not those the checkpointed run would have drawn" "$work/changed.log" \
    || { echo "FAIL: the changed resume does not say: $line"; cat "$work/changed.log"; exit 1; }
done
