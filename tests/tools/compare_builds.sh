#!/usr/bin/env bash
# compare_builds.sh OLD_CLEAVE NEW_CLEAVE SRC DATA: runs every layout (one process, data, tensor
# and pipeline parallelism and their compositions, fp32 and bf16) with two builds of cleave and
# checks that losses, gradient norms and checkpoint files are bitwise identical; context
# parallelism, MoE with ep, fp16, FP8, activation checkpointing and the chunked loss too. For changes that
# must not move a bit (the step-as-instructions rewrite, the model's modules): build the old
# commit in its own folder (git worktree) and pass both binaries.
set -euo pipefail
old=$1 new=$2 src=$3 data=$4
source "$src/tests/integration/layouts.sh"
common=(--set train.steps=8 --set train.log_interval=1 --set train.val_interval=4
        --set train.checkpoint_interval=8 --set train.threads=1
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2)

check() {  # name ranks [--set ...]
  local name=$1 np=$2; shift 2
  cleave=$old run "$name-old" "$np" "$@"
  cleave=$new run "$name-new" "$np" "$@"
  diff <(numbers "$work/$name-old") <(numbers "$work/$name-new") > /dev/null \
    || { echo "FAIL: $name: the builds logged different losses or norms"; exit 1; }
  for f in "$work/$name-old"/step_00000008/*.safetensors; do
    cmp -s "$f" "$work/$name-new/step_00000008/$(basename "$f")" \
      || { echo "FAIL: $name: the builds wrote different $(basename "$f")"; exit 1; }
  done
  echo "same bits: $name"
}

llama=(--set model.family=llama --set model.n_kv_heads=2)
bf16=(--set train.dtype=bf16)
check one 1
check one-llama 1 "${llama[@]}"
check one-bf16 1 "${bf16[@]}"
check one-llama-bf16 1 "${llama[@]}" "${bf16[@]}"
check ddp2-bf16 2 --set parallel.dp_shard=2 "${bf16[@]}"
check ddp2 2 --set parallel.dp_shard=2
check zero1 2 --set parallel.dp_shard=2 --set parallel.zero_stage=1
check zero2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=2
check zero3 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
check zero3-llama 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3 "${llama[@]}"
check hsdp 4 --set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
check tp2-zero3 4 --set parallel.tp=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
check tp2-sp-zero2 4 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set parallel.dp_shard=2 --set parallel.zero_stage=2 "${llama[@]}"
check tp2 2 --set parallel.tp=2 "${llama[@]}"
check tp2-sp-bf16 2 --set parallel.tp=2 --set parallel.sequence_parallel=true "${bf16[@]}"
# Every pipeline schedule, on 4 layers and 4 micro-batches (zbv needs 2 x pp - 1), GPT-2 (tied)
# and Llama; then with tp and data parallelism, and in bf16.
pp=(--set model.n_layers=4 --set train.grad_accum_steps=4 --set parallel.pp=2)
for schedule in gpipe 1f1b interleaved zb1p zbv; do
  check pp2-$schedule 2 "${pp[@]}" --set parallel.pp_schedule=$schedule
  check pp2-$schedule-llama 2 "${pp[@]}" --set parallel.pp_schedule=$schedule "${llama[@]}"
done
check pp2-tp2-sp 4 "${pp[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true "${llama[@]}"
check pp2-zero3x2 4 "${pp[@]}" --set parallel.dp_shard=2 --set parallel.zero_stage=3 \
  --set parallel.pp_schedule=interleaved
check pp2-tp2-zero2x2 8 "${pp[@]}" --set parallel.tp=2 --set parallel.dp_shard=2 \
  --set parallel.zero_stage=2 --set parallel.pp_schedule=zb1p
check pp2-bf16 2 "${pp[@]}" "${bf16[@]}" --set parallel.pp_schedule=zb1p
check pp2-tp2-bf16 4 "${pp[@]}" --set parallel.tp=2 "${bf16[@]}" "${llama[@]}"
# Context parallelism in each mode, alone and with tp; MoE (one process, ep, ep x pp, bf16); the
# other precisions and memory tools.
check cp2-ring 2 --set parallel.cp=2 "${llama[@]}"
check cp2-allgather 2 --set parallel.cp=2 --set parallel.cp_mode=allgather "${llama[@]}"
check cp2-ulysses 2 --set parallel.cp=2 --set parallel.cp_mode=ulysses "${llama[@]}"
check cp2-tp2-bf16 4 --set parallel.cp=2 --set parallel.tp=2 "${llama[@]}" "${bf16[@]}"
moe=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64 "${llama[@]}")
check moe 1 "${moe[@]}"
check moe-bf16 1 "${moe[@]}" "${bf16[@]}"
check moe-ep2 2 "${moe[@]}" --set parallel.dp_shard=2 --set parallel.ep=2
check moe-ep2-pp2 4 "${moe[@]}" --set parallel.dp_shard=2 --set parallel.ep=2 "${pp[@]}"
check fp16 2 --set train.dtype=fp16 --set parallel.dp_shard=2
check fp8-delayed 2 --set train.dtype=fp8 --set parallel.tp=2
check ac-full-zero3 2 --set train.activation_checkpointing=full --set parallel.dp_shard=2 \
  --set parallel.zero_stage=3
check ac-selective-pp2 2 --set train.activation_checkpointing=selective "${pp[@]}"
check chunked-loss-tp2 2 --set train.loss_chunk=40 --set parallel.tp=2
echo "every layout gave the same bits with both builds"
