#!/usr/bin/env bash
# Generation under tensor parallelism (docs/inference.md): each rank reads its slices of a
# checkpoint one process wrote, and greedy decoding gives the one-process tokens at tp 2 and 4
# for GPT-2, Llama with grouped-query attention (tp 4 replicates its 2 kv heads) and a mixture of
# experts, in fp32 and with bf16 weights; seeded sampling and a batch of sequences alike.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
cfg=$src/tests/configs/tiny_train.toml
prompt="5 9 33 2 7 101 64"

declare -A models=(
  [gpt2]="--set model.family=gpt2"
  [llama_gqa]="--set model.family=llama --set model.n_kv_heads=2"
  [moe]="--set model.family=llama --set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64"
)
gen() {  # NP MODEL ARGS...: the token ids rank 0 prints
  local np=$1 model=$2
  shift 2
  mpirun --oversubscribe -np "$np" "$cleave" generate "$work/$model" --prompt-ids "$prompt" \
    --max-new-tokens 24 --set parallel.tp="$np" "$@" 2> "$work/err" || { cat "$work/err"; exit 1; }
}
for model in gpt2 llama_gqa moe; do
  # shellcheck disable=SC2086  # the model's --set options
  "$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/$model" \
    --set train.steps=20 --set train.val_interval=0 --set train.checkpoint_interval=20 \
    --set train.threads=1 ${models[$model]} > /dev/null
  for dtype in fp32 bf16; do
    for mode in "--temperature 0" "--temperature 1 --top-k 0 --seed 7" "--temperature 0 --batch 3"; do
      # shellcheck disable=SC2086  # the mode's options
      want=$(gen 1 "$model" --dtype "$dtype" $mode)
      [ "$(wc -w <<<"$want")" -gt 24 ] || { echo "FAIL $model: no tokens: $want"; exit 1; }
      for tp in 2 4; do
        # shellcheck disable=SC2086
        got=$(gen "$tp" "$model" --dtype "$dtype" $mode)
        [ "$got" = "$want" ] || {
          printf 'FAIL %s %s (%s) at tp %s:\n  tp 1: %s\n  tp %s: %s\n' "$model" "$dtype" "$mode" \
            "$tp" "$want" "$tp" "$got"
          exit 1
        }
      done
      echo "$model $dtype ($mode): tp 1, 2, 4 agree: ${want%%$'\n'*}"
    done
  done
done
# A layout the ranks do not make is refused, naming both.
if out=$(mpirun --oversubscribe -np 2 "$cleave" generate "$work/gpt2" --prompt-ids "$prompt" \
           --set parallel.tp=4 2>&1); then
  echo "FAIL: tp 4 on 2 ranks ran"; exit 1
fi
grep -q "parallel.tp = 4 but 2 ranks" <<<"$out" || { echo "FAIL: unclear error: $out"; exit 1; }
echo "generate layouts: ok"
