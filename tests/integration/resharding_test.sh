#!/usr/bin/env bash
# Checkpoints move between very different layouts (docs/checkpoints.md, Resharding): each pair
# trains 10 steps in one layout, saves, and resumes in the other for steps 11-20, which must give
# the one-process reference's losses and parameters within compare_runs.py's bounds of the
# dtype. Every axis (tp with SP, pp under each schedule, cp ring and Ulysses, ep, ZeRO 1-3, HSDP,
# activation checkpointing) is a source and a target at least once, in fp32, bf16 and FP8 with
# delayed scaling, whose amax history moves with the checkpoint.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}")
moe=(--set model.family=llama --set model.n_kv_heads=2 --set model.moe_experts=4
     --set model.moe_top_k=4 --set model.moe_ffn_hidden=64 --set model.moe_shared_experts=1)

# reshard REF NAME RANKS1 "FIRST" RANKS2 "SECOND" [--set ...]: like layouts.sh's resume, against
# the reference run REF, with the dtype and model settings after the layouts given to both.
reshard() {
  local ref=$1 name=$2 np1=$3 np2=$5; read -r -a first <<<"$4"; read -r -a second <<<"$6"
  shift 6
  run "$name" "$np1" "$@" "${first[@]}" --exit-after 10
  run "$name" "$np2" "$@" "${second[@]}" --resume latest
  grep -q "resumed at step 10" "$work/$name.log" || { echo "FAIL: $name did not resume"; exit 1; }
  $compare "$work/$ref" "$work/$name" --from-step 11
  echo "ok   $name"
}
tp2sp="--set parallel.tp=2 --set parallel.sequence_parallel=true"
zero() { echo "--set parallel.dp_shard=$1 --set parallel.zero_stage=$2"; }
pp2() { echo "--set parallel.pp=2 --set parallel.pp_schedule=$1"; }
cp2() { echo "--set parallel.cp=2 --set parallel.cp_mode=$1"; }
hsdp="--set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3"
ac="--set train.activation_checkpointing=selective"

run fp32 1
reshard fp32 fp32-tp2sp-z1-to-pp2-z3 4 "$tp2sp $(zero 2 1)" 4 "$(pp2 1f1b) $(zero 2 3)"
reshard fp32 fp32-pp2zb1p-to-cp2ring-tp2 2 "$(pp2 zb1p)" 4 "$(cp2 ring) --set parallel.tp=2"
reshard fp32 fp32-cp2ulysses-to-hsdp 2 "$(cp2 ulysses)" 4 "$hsdp $ac"
reshard fp32 fp32-hsdp-to-one 4 "$hsdp" 1 ""
reshard fp32 fp32-one-to-tp4 1 "$ac" 4 "--set parallel.tp=4"

run bf16 1 --set train.dtype=bf16
reshard bf16 bf16-z2-ac-to-tp2-pp2gpipe 4 "$(zero 4 2) $ac" 4 "--set parallel.tp=2 $(pp2 gpipe)" \
  --set train.dtype=bf16
reshard bf16 bf16-tp2pp2-to-cp2-z1 4 "--set parallel.tp=2 $(pp2 1f1b)" 4 "$(cp2 ring) $(zero 2 1)" \
  --set train.dtype=bf16

fp8=(--set train.dtype=fp8 --set train.fp8_recipe=delayed)
run fp8 1 "${fp8[@]}"
reshard fp8 fp8-tp2-to-z3 2 "$tp2sp" 2 "$(zero 2 3)" "${fp8[@]}"
reshard fp8 fp8-pp2-to-one 2 "$(pp2 1f1b)" 1 "" "${fp8[@]}"
reshard fp8 fp8-one-to-cp2-tp2 1 "" 4 "$(cp2 ring) --set parallel.tp=2" "${fp8[@]}"

run moe 1 "${moe[@]}"
reshard moe moe-ep2-to-tp2 2 "$(zero 2 1) --set parallel.ep=2" 2 "--set parallel.tp=2" "${moe[@]}"
reshard moe moe-pp2-to-ep2 2 "$(pp2 1f1b)" 4 "$(zero 4 0) --set parallel.ep=2" "${moe[@]}"
echo "every pair resumed with the reference's losses and parameters"
