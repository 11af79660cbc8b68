# Sourced by pipeline_parallel_test.sh and pipeline_composed_test.sh after setting cleave, src and
# data: layouts.sh, the tests' common settings (8 micro-batches of 2 sequences a step: m = 8 for
# every schedule), Llama's, and the single-process references ref (GPT-2) and ref-llama.
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}"
        --set model.n_layers=8 --set train.micro_batch_size=2 --set train.grad_accum_steps=8)
llama=(--set model.family=llama --set model.n_kv_heads=2)
run ref 1
run ref-llama 1 "${llama[@]}"
