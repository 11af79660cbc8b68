#!/usr/bin/env bash
# Document masking (data.document_mask, data.reset_positions): attention stays inside each
# document of a window (documents end at cleave tokenize's end-of-text id), positions restart at
# each. The flags change the run, and every layout reproduces the single process with them, its
# rerun bitwise; a separator outside the vocabulary is an error.
# The model is the 2-layer one compare_runs.py's bounds were measured on: at 4 layers, Llama with
# document masking parts from itself within 20 steps on the test corpus (one process accumulating
# 2 micro-batches of 4 against one of 8: 2.4x the fp32 bound; at 2 layers 0.02x).
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}" --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
docs=(--set data.document_mask=true --set data.reset_positions=true)
llama=(--set model.family=llama --set model.n_kv_heads=2)

run whole 1
run ref 1 "${docs[@]}"
run mask-only 1 --set data.document_mask=true
for pair in "whole ref" "mask-only ref" "whole mask-only"; do
  read -r a b <<< "$pair"
  if diff -q <(numbers "$work/$a") <(numbers "$work/$b") > /dev/null; then
    echo "FAIL: $a and $b logged the same losses: a document flag was ignored"; exit 1
  fi
done

layout ref dp2-zero2 2 "${docs[@]}" --set parallel.dp_shard=2 --set parallel.zero_stage=2
layout ref tp2-sp 2 "${docs[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
layout ref pp2-zb1p 2 "${docs[@]}" --set parallel.pp=2 --set parallel.pp_schedule=zb1p
run ref-llama 1 "${docs[@]}" "${llama[@]}"
layout ref-llama llama-pp2-tp2 4 "${docs[@]}" "${llama[@]}" --set parallel.pp=2 --set parallel.tp=2

expect_error 1 "$cfg: data.document_separator = 300 is no token id of model.vocab_size = 256" \
  "${docs[@]}" --set data.document_separator=300
echo "document masking reproduces the single process under every layout"
