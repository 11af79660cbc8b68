#!/usr/bin/env bash
# Context parallelism (docs/context_parallel.md): every sequence cut into 2 x cp zigzag chunks,
# attention exchanging keys and values in each mode (ring, allgather, ulysses, hybrid). Each
# layout reproduces the single process within compare_runs.py's bounds for 20 steps and its rerun
# is bitwise: cp 2 and 4 in each mode for GPT-2 (learned positions) and Llama (RoPE, GQA: 2 kv
# heads, split over 2 Ulysses ranks and replicated over 4), hybrid at cp 4 with 2 Ulysses ranks;
# cp with tp (with and without SP), DDP, ZeRO-1, ZeRO-3, pp and HSDP; bf16; document masking in each mode. A cp 2 checkpoint
# resumes at cp 4 in another mode and in one process; the cp bytes the trainer measures are what
# `cleave mesh` predicts; bad input is an error naming the numbers.
# The model is the 2-layer one compare_runs.py's bounds were measured on: at 4 layers GPT-2's
# blocks.2.norm2.weight, whose gradient nearly cancels, sits at 0.4-0.5 of the bound under plain
# DDP already and at 0.8-1.2 with cp (its attention sums run in another order).
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}"
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
llama=(--set model.family=llama --set model.n_kv_heads=2)
docs=(--set data.document_mask=true --set data.reset_positions=true)
cp() { echo "--set parallel.cp=$1 --set parallel.cp_mode=$2${3:+ --set parallel.cp_ulysses=$3}"; }

run ref 1
run ref-llama 1 "${llama[@]}"
for mode in ring allgather ulysses; do
  for n in 2 4; do
    # shellcheck disable=SC2046
    layout ref "cp$n-$mode" "$n" $(cp "$n" "$mode")
    # shellcheck disable=SC2046
    layout ref-llama "llama-cp$n-$mode" "$n" "${llama[@]}" $(cp "$n" "$mode")
  done
done
# shellcheck disable=SC2046
layout ref cp4-hybrid 4 $(cp 4 hybrid 2)
# shellcheck disable=SC2046
layout ref-llama llama-cp4-hybrid 4 "${llama[@]}" $(cp 4 hybrid 2)
echo "cp 2 and 4 in every mode reproduce the single process (GPT-2 and Llama), reruns bitwise"

# Compositions.
# shellcheck disable=SC2046
layout ref-llama llama-cp2-tp2-sp 4 "${llama[@]}" $(cp 2 ring) --set parallel.tp=2 \
  --set parallel.sequence_parallel=true
# shellcheck disable=SC2046
layout ref-llama llama-cp2-ulysses-tp2 4 "${llama[@]}" $(cp 2 ulysses) --set parallel.tp=2
# shellcheck disable=SC2046
layout ref cp2-ddp2 4 $(cp 2 ulysses) --set parallel.dp_shard=2 --set parallel.zero_stage=0
# shellcheck disable=SC2046
layout ref cp2-zero1-2 4 $(cp 2 ring) --set parallel.dp_shard=2 --set parallel.zero_stage=1
# shellcheck disable=SC2046
layout ref cp2-zero3-2 4 $(cp 2 allgather) --set parallel.dp_shard=2 --set parallel.zero_stage=3
# shellcheck disable=SC2046
layout ref-llama llama-cp2-pp2 4 "${llama[@]}" $(cp 2 ring) --set parallel.pp=2 \
  --set parallel.pp_schedule=zb1p
# shellcheck disable=SC2046
layout ref hsdp-cp2 8 $(cp 2 ring) --set parallel.dp_replicate=2 --set parallel.dp_shard=2 \
  --set parallel.zero_stage=2
run ref-bf16 1 --set train.dtype=bf16
# shellcheck disable=SC2046
layout ref-bf16 cp2-bf16 2 --set train.dtype=bf16 $(cp 2 ring)
# shellcheck disable=SC2046
layout ref-bf16 cp2-ulysses-bf16 2 --set train.dtype=bf16 $(cp 2 ulysses)
echo "cp composes with tp (+ SP), DDP, ZeRO-1, ZeRO-3, pp and HSDP, and runs in bf16"

# Document masking: attention stays inside each document in every mode.
run ref-docs 1 "${docs[@]}"
for mode in ring allgather ulysses; do
  # shellcheck disable=SC2046
  layout ref-docs "docs-cp2-$mode" 2 "${docs[@]}" $(cp 2 "$mode")
done
# shellcheck disable=SC2046
layout ref-docs docs-cp4-hybrid 4 "${docs[@]}" $(cp 4 hybrid 2)
echo "document masking at cp 2 in every mode (and hybrid at cp 4) reproduces the single process"

# The bytes each mode sends on cp, measured, are what the run predicted.
for name in cp2-ring cp4-ring cp2-allgather cp4-ulysses cp4-hybrid llama-cp4-ulysses; do
  axis_bytes cp "$name"
done
echo "the cp bytes measured are those each run predicted"

# Resume across cp degrees and modes.
resume cp2-ring-to-cp4-ulysses 2 "$(cp 2 ring)" 4 "$(cp 4 ulysses)"
resume cp2-ring-to-one 2 "$(cp 2 ring)" 1 ""
echo "a cp 2 ring checkpoint resumes at cp 4 ulysses and in one process"

# Bad input: one message each, exactly.
# shellcheck disable=SC2046
expect_error 4 "train.seq_len = 36 cannot be cut into 2 x parallel.cp = 8 equal chunks (the zigzag split of context parallelism)" \
  $(cp 4 ring) --set train.seq_len=36
# shellcheck disable=SC2046
expect_error 4 "parallel.cp_mode = \"ulysses\" with 4 Ulysses ranks: model.n_heads = 6 (6 per tp rank at parallel.tp = 1) do not divide by 4" \
  $(cp 4 ulysses) --set model.n_heads=6 --set model.d_model=48
expect_error 2 "parallel.cp_mode = \"zigzag\" is not a context-parallel mode (ring, allgather, ulysses, hybrid)" \
  --set parallel.cp=2 --set parallel.cp_mode=zigzag
# shellcheck disable=SC2046
expect_error 4 "parallel.cp_mode = \"hybrid\" needs parallel.cp_ulysses to divide parallel.cp = 4 and lie between 2 and 2 (Ulysses groups inside a ring of at least two), not 4" \
  $(cp 4 hybrid 4)
expect_error 2 "parallel.cp_ulysses = 2 is for parallel.cp_mode = \"hybrid\" only (the mode is \"ring\")" \
  --set parallel.cp=2 --set parallel.cp_ulysses=2
echo "context parallelism reproduces the single process in every mode and composition"
