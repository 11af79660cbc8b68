#!/usr/bin/env bash
# Chunked loss (train.loss_chunk): the LM head and the cross-entropy run that many tokens at a
# time, their gradients computed with the chunk's logits at hand, so the logits never exist whole.
# Against the unchunked run within compare_runs.py's bounds (the weight gradient sums its chunks in
# another order): one process with a ragged last chunk, DDP 2, tp 2 (vocabulary-parallel), tp 2
# with SP, pp 2 under zb1p, Llama's untied head at tp 2, and bf16; reruns bitwise. A chunk as large
# as the micro-batch is no chunking: bitwise the unchunked run.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}"
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
llama=(--set model.family=llama --set model.n_kv_heads=2)
chunk=(--set train.loss_chunk=48)  # 128 tokens per micro-batch in one process: 48, 48, 32

run ref 1
layout ref chunk48 1 "${chunk[@]}"
run whole 1 --set train.loss_chunk=128
diff <(numbers "$work/ref") <(numbers "$work/whole") > /dev/null \
  || { echo "FAIL: a chunk of the whole micro-batch changed the run"; exit 1; }
layout ref ddp2-chunk48 2 "${chunk[@]}" --set parallel.dp_shard=2
layout ref tp2-chunk48 2 "${chunk[@]}" --set parallel.tp=2
layout ref tp2-sp-chunk48 2 "${chunk[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
layout ref pp2-chunk40 2 --set train.loss_chunk=40 --set parallel.pp=2 --set parallel.pp_schedule=zb1p
run ref-llama 1 "${llama[@]}"
layout ref-llama llama-tp2-chunk48 2 "${llama[@]}" "${chunk[@]}" --set parallel.tp=2
run ref-bf16 1 --set train.dtype=bf16
layout ref-bf16 bf16-chunk48 1 --set train.dtype=bf16 "${chunk[@]}"
echo "the chunked loss reproduces the unchunked run in every layout"
