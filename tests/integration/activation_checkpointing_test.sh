#!/usr/bin/env bash
# Activation checkpointing (train.activation_checkpointing = "full" or "selective",
# train.ac_every): a checkpointed block drops what it saved after its forward (full: all but its
# input; selective: the norms' outputs and the MLP's activation) and rebuilds it just before its
# backward (full: its forward again; selective: those parts, no product), instructions of the step
# program. Every run is bitwise the run without it, losses, gradient norms and checkpoint files,
# in both modes: one process (GPT-2 and Llama, every block and every second one, fp32 and bf16),
# tp 2 with and without SP, pp 2 under 1f1b and zb1p (recompute before the input half), ZeRO-3
# (the recompute gathers the block's parameters), cp 2. Unknown modes are errors.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set train.steps=12 --set train.log_interval=1 --set train.val_interval=6
        --set train.checkpoint_interval=12 --set train.threads=1 --set parallel.comm_timeout_s=60
        --set model.n_layers=4 --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
llama=(--set model.family=llama --set model.n_kv_heads=2)
full=(--set train.activation_checkpointing=full)

pair() {  # name ranks [--set ...]: the layout without checkpointing and with each mode, bitwise
  local name=$1 np=$2 mode; shift 2
  run "$name" "$np" "$@"
  for mode in full selective; do
    run "$name-$mode" "$np" "$@" --set train.activation_checkpointing=$mode
    same_bits "$name" "$name-$mode" 12
    grep -q '"tokens_per_s"' "$work/$name-$mode/metrics.jsonl" || { echo "FAIL: $name-$mode logged nothing"; exit 1; }
  done
}

pair one 1
run one-ac2 1 "${full[@]}" --set train.ac_every=2
same_bits one one-ac2 12
run one-selective2 1 --set train.activation_checkpointing=selective --set train.ac_every=2
same_bits one one-selective2 12
pair bf16 1 --set train.dtype=bf16
# The recomputes ran, in both modes: a traced step has a span per recompute
# ("<stage>R<micro-batch>"), 4 blocks x 2 micro-batches of them at ac_every 1 and half as many at
# 2, none without checkpointing. (Selective run as full would send full's tp bytes: below.)
recomputes() { grep -o '"name": *"0R[0-9]*"' "$work/$1/trace_step_3.json" | wc -l; }
run none-trace 1 --set train.trace_step=3 --set train.steps=3
[ "$(recomputes none-trace)" -eq 0 ] || { echo "FAIL: recompute spans without checkpointing"; exit 1; }
for mode in full selective; do
  for every in 1 2; do
    run "$mode$every-trace" 1 --set train.trace_step=3 --set train.steps=3 \
      --set train.activation_checkpointing=$mode --set train.ac_every=$every
    [ "$(recomputes "$mode$every-trace")" -eq $((8 / every)) ] \
      || { echo "FAIL: $mode every $every: $(recomputes "$mode$every-trace") recompute spans, not $((8 / every))"; exit 1; }
  done
done
pair llama 1 "${llama[@]}"
pair tp2 2 --set parallel.tp=2 --set parallel.dp_shard=1
pair tp2-sp 2 --set parallel.tp=2 --set parallel.dp_shard=1 --set parallel.sequence_parallel=true
pair pp2-1f1b 2 --set parallel.pp=2
pair pp2-zb1p 2 "${llama[@]}" --set parallel.pp=2 --set parallel.pp_schedule=zb1p
pair zero3-2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
pair cp2-ring 2 --set parallel.cp=2 --set parallel.dp_shard=1
pair cp2-ulysses 2 --set parallel.cp=2 --set parallel.dp_shard=1 --set parallel.cp_mode=ulysses
echo "activation checkpointing is bitwise the run without it in every layout"
# A recomputed block communicates its forward again: cleave mesh counts it.
axis_bytes tp tp2-full
axis_bytes tp tp2-sp-full
axis_bytes cp cp2-ring-full
axis_bytes cp cp2-ulysses-full

expect_error 1 'train.activation_checkpointing = "some" is not a mode (none, full, selective)' \
  --set train.activation_checkpointing=some
# Selective recompute runs no product and no collective: the bytes of the run without it.
axis_bytes tp tp2-sp-selective
echo "cleave mesh counts the recomputed forwards' tp and cp bytes; bad modes are errors"
