#!/usr/bin/env bash
# train.init_from under other layouts (docs/checkpoints.md, "Hugging Face import"): a model
# trained a few steps, exported and imported again; runs under tp 2, pp 2 with the embedding tied
# across the stages, and ZeRO-3 with the experts over ep 2 start from the original run's
# checkpoint and from the imported one with bitwise the same losses, and with the first loss
# (before any update) of a one-rank run from the imported checkpoint, within fp32's spread: each
# rank reads its share of the parameters, and a fresh optimizer.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set train.val_interval=0 --set train.log_interval=1 --set train.threads=1)
gpt2=(--set model.family=gpt2)
llama_tied=(--set model.family=llama --set model.n_kv_heads=2 --set model.tie_embeddings=true)
mixtral=(--set model.family=llama --set model.n_kv_heads=2 --set model.moe_experts=4
         --set model.moe_top_k=2 --set model.moe_ffn_hidden=64)
steps=(--set train.steps=3)
first_loss() { grep -o '"loss":[^,}]*' "$work/$1/metrics.jsonl" | head -1 | cut -d: -f2; }
same_numbers() {
  diff <(numbers "$work/$1") <(numbers "$work/$2") > /dev/null \
    || { echo "FAIL: $1 and $2 differ"; diff <(numbers "$work/$1") <(numbers "$work/$2") | head; exit 1; }
}

# Each layout from the original run and from the imported checkpoint, bitwise alike, and the first
# loss (before any update) the one-rank run's within fp32's spread.
layout_init() {  # variant name ranks [--set ...]
  local variant=$1 name=$2 np=$3; shift 3
  declare -n m=$variant
  run "$variant" 1 "${m[@]}" "${steps[@]}"
  "$cleave" export "$work/$variant" "$work/$variant-hf" > /dev/null
  "$cleave" import "$work/$variant-hf" "$work/$variant-imported" > /dev/null
  run "$name-one" 1 "${m[@]}" "${steps[@]}" --set train.init_from="$work/$variant-imported"
  run "$name-original" "$np" "${m[@]}" "${steps[@]}" --set train.init_from="$work/$variant" "$@"
  run "$name-imported" "$np" "${m[@]}" "${steps[@]}" --set train.init_from="$work/$variant-imported" "$@"
  grep -q "^initialised from $work/$variant-imported " "$work/$name-imported.log" \
    || { echo "FAIL $name: no initialised line"; exit 1; }
  same_numbers "$name-original" "$name-imported"
  awk -v a="$(first_loss "$name-one")" -v b="$(first_loss "$name-imported")" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' \
    || { echo "FAIL $name: first loss $(first_loss "$name-imported"), one rank's $(first_loss "$name-one")"; exit 1; }
  echo "$name: init_from the original and the imported checkpoint alike, first loss $(first_loss "$name-imported") (one rank: $(first_loss "$name-one"))"
}
layout_init gpt2 gpt2-tp2 2 --set parallel.tp=2
layout_init llama_tied llama-tied-pp2 2 --set parallel.pp=2
layout_init mixtral mixtral-zero3-ep2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3 \
  --set parallel.ep=2
