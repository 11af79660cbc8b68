#!/usr/bin/env bash
# Generation under tensor, pipeline and expert parallelism (docs/inference.md): each rank reads its
# slices of a checkpoint one process wrote, and decoding 60 tokens after a prompt of 7 (past the
# first 64-token block of the key/value pool) gives the one-process tokens at tp 2, tp
# 4, pp 2 and tp 2 x pp 2 for GPT-2 (its tied head on the last stage), Llama with grouped-query
# attention (tp 4 replicates its 2 kv heads) and a mixture of experts, which also runs at ep 2,
# ep 4 (3 sequences: one rank idles, stepping with the others), tp 2 x ep 2 and pp 2 x ep 2:
# greedy and seeded sampling in fp32, a batch of 3 seeded sequences prefilled in chunks of 3
# tokens with bf16 weights (and so a bf16 key/value cache).
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
gen() {  # TP PP EP MODEL ARGS...: the token ids rank 0 prints
  local tp=$1 pp=$2 ep=$3 model=$4
  shift 4
  mpirun --oversubscribe -np $((tp * pp * ep)) "$cleave" generate "$work/$model" \
    --prompt-ids "$prompt" --max-new-tokens 60 --set parallel.tp="$tp" --set parallel.pp="$pp" \
    --set parallel.ep="$ep" "$@" 2> "$work/err" || { cat "$work/err" >&2; exit 1; }
}
for model in gpt2 llama_gqa moe; do
  # shellcheck disable=SC2086  # the model's --set options
  "$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/$model" \
    --set train.steps=20 --set train.val_interval=0 --set train.checkpoint_interval=20 \
    --set train.threads=1 --set model.max_seq_len=96 ${models[$model]} > /dev/null
  for mode in "--dtype fp32 --temperature 0" "--dtype fp32 --temperature 1 --top-k 0 --seed 7" \
              "--dtype bf16 --temperature 1 --top-k 0 --seed 3 --batch 3 --prefill-chunk 3"; do
    # shellcheck disable=SC2086  # the mode's options
    want=$(gen 1 1 1 "$model" $mode)
    [ "$(wc -w <<<"$want")" -gt 60 ] || { echo "FAIL $model: no tokens: $want"; exit 1; }
    kv=fp32
    [[ $mode != *bf16* ]] || kv=bf16
    grep -q "key/value cache $kv, as needed" "$work/err" || { echo "FAIL: no $kv cache:"; cat "$work/err"; exit 1; }
    layouts=("2 1 1" "4 1 1" "1 2 1" "2 2 1")
    [ "$model" != moe ] || layouts+=("1 1 2" "1 1 4" "2 1 2" "1 2 2")
    for layout in "${layouts[@]}"; do
      # shellcheck disable=SC2086  # tp pp, and the mode's options
      got=$(gen $layout "$model" $mode)
      [ "$got" = "$want" ] || {
        printf 'FAIL %s (%s) at tp pp ep %s:\n  one process: %s\n  %s: %s\n' "$model" "$mode" \
          "$layout" "$want" "$layout" "$got"
        exit 1
      }
    done
    echo "$model ($mode): tp pp ep in ${layouts[*]} agree with one process: ${want%%$'\n'*}"
  done
done
# A layout the ranks do not make is refused, naming both.
if out=$(mpirun --oversubscribe -np 2 "$cleave" generate "$work/gpt2" --prompt-ids "$prompt" \
           --set parallel.tp=2 --set parallel.pp=2 2>&1); then
  echo "FAIL: tp 2 x pp 2 on 2 ranks ran"; exit 1
fi
grep -q "parallel.tp = 2 x parallel.pp = 2 x parallel.ep = 1 makes 4 ranks, but 2 were started" \
  <<<"$out" || { echo "FAIL: unclear error: $out"; exit 1; }
if out=$(mpirun --oversubscribe -np 2 "$cleave" generate "$work/gpt2" --prompt-ids "$prompt" \
           --set parallel.ep=2 2>&1); then
  echo "FAIL: ep 2 of a dense model ran"; exit 1
fi
grep -q "parallel.ep = 2 needs a mixture of experts" <<<"$out" ||
  { echo "FAIL: unclear error: $out"; exit 1; }
echo "generate layouts: ok"
