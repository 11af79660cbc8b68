#!/usr/bin/env bash
# cleave import of cleave's own exports (docs/checkpoints.md, "Hugging Face import"): for GPT-2,
# Llama with grouped-query attention and tied embeddings, Mixtral, and cleave's own MoE layout
# (sigmoid_bias's router biases, shared experts), export then import gives back bitwise the
# trained parameters and router biases, with zero AdamW moments at step 0, and exports bitwise the
# same folder again (tokenizer.model included).
# train.init_from: a run from the imported checkpoint has bitwise the losses of a run from the
# run folder it was exported from (each a fresh optimizer at step 0); its start says so, and its
# losses are not a fresh run's (init_from_layouts_test.sh: under other layouts). A [model] key that
# differs without changing a shape is reported; a missing folder or another shape fails naming
# train.init_from and the tensor; a resumed run does not read it.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set train.val_interval=0 --set train.log_interval=1 --set train.threads=1)
hf="/usr/bin/python3 $src/tests/integration/hf_folder.py"

gpt2=(--set model.family=gpt2)
llama_tied=(--set model.family=llama --set model.n_kv_heads=2 --set model.tie_embeddings=true)
mixtral=(--set model.family=llama --set model.n_kv_heads=2 --set model.moe_experts=4
         --set model.moe_top_k=2 --set model.moe_ffn_hidden=64)
cleave_moe=(--set model.family=gpt2 --set model.moe_experts=4 --set model.moe_router=sigmoid_bias
            --set model.moe_shared_experts=1 --set model.moe_every=2 --set model.moe_ffn_hidden=64)

for variant in gpt2 llama_tied mixtral cleave_moe; do
  declare -n model=$variant
  run "$variant" 1 "${model[@]}" --set train.steps=3
  "$cleave" export "$work/$variant" "$work/$variant-hf" > /dev/null
  "$cleave" import "$work/$variant-hf" "$work/$variant-imported" > "$work/$variant-import.log"
  grep -q "^wrote checkpoint $work/$variant-imported: step 0, empty optimizer state" "$work/$variant-import.log" \
    && grep -q "^copied $work/$variant-hf/tokenizer.model to" "$work/$variant-import.log" \
    || { echo "FAIL $variant: the import does not say what it wrote"; cat "$work/$variant-import.log"; exit 1; }
  $hf same-params "$work/$variant/step_00000003" "$work/$variant-imported" \
    || { echo "FAIL $variant: export then import changed the parameters"; exit 1; }
  $hf check-import "$work/$variant-imported" > /dev/null
  "$cleave" export "$work/$variant-imported" "$work/$variant-again" > /dev/null
  for f in model.safetensors config.json tokenizer.model; do
    cmp "$work/$variant-hf/$f" "$work/$variant-again/$f" \
      || { echo "FAIL $variant: the imported checkpoint exports another $f"; exit 1; }
  done
  echo "$variant: export, import and export again: bitwise the same"
done

first_loss() { grep -o '"loss":[^,}]*' "$work/$1/metrics.jsonl" | head -1 | cut -d: -f2; }
steps=(--set train.steps=3)
# One rank: from the original run's folder (its newest checkpoint) and from the imported one.
run gpt2-from-run 1 "${gpt2[@]}" "${steps[@]}" --set train.init_from="$work/gpt2"
run gpt2-from-import 1 "${gpt2[@]}" "${steps[@]}" --set train.init_from="$work/gpt2-imported" \
  --set model.init_std=0.05
run gpt2-fresh 1 "${gpt2[@]}" "${steps[@]}"
grep -qx "initialised from $work/gpt2/step_00000003 (train.init_from): its parameters, a fresh optimizer, step 0" "$work/gpt2-from-run.log" \
  && grep -qx "initialised from $work/gpt2-imported (train.init_from): its parameters, a fresh optimizer, step 0" "$work/gpt2-from-import.log" \
  || { echo "FAIL: a run from train.init_from does not say so"; grep -h initialised "$work"/gpt2-from-*.log; exit 1; }
grep -qx "train.init_from: model.init_std = 0.05 in this run, 0.02 in checkpoint $work/gpt2-imported" "$work/gpt2-from-import.log" \
  || { echo "FAIL: the [model] key that differs is not reported"; grep -h "train.init_from:" "$work/gpt2-from-import.log"; exit 1; }
! grep -q "initialised from" "$work/gpt2-fresh.log" || { echo "FAIL: a fresh run claims an init"; exit 1; }
diff <(numbers "$work/gpt2-from-run") <(numbers "$work/gpt2-from-import") \
  || { echo "FAIL: the run from the imported checkpoint differs from the run from the original"; exit 1; }
[ "$(first_loss gpt2-from-run)" != "$(first_loss gpt2-fresh)" ] \
  || { echo "FAIL: the run from train.init_from starts where a fresh run does"; exit 1; }
echo "init_from: the imported checkpoint trains bitwise as the original: $(first_loss gpt2-from-run) (fresh: $(first_loss gpt2-fresh))"

# Errors name train.init_from and what is at fault.
refused() {  # expected-text [--set ...]
  local expected=$1; shift
  if "$cleave" train "$cfg" --set data.dir="$data" "${common[@]}" --set train.out_dir="$work/refused" \
      "$@" > "$work/refused.log" 2>&1; then
    echo "FAIL: accepted $*"; exit 1
  fi
  grep -qF "$expected" "$work/refused.log" \
    || { echo "FAIL: the error for $* does not say: $expected"; cat "$work/refused.log"; exit 1; }
}
refused "train.init_from = $work/nothing: no such folder" "${gpt2[@]}" --set train.init_from="$work/nothing"
refused "train.init_from = $work/gpt2-imported: checkpoint $work/gpt2-imported: tensor param/embed.wte has shape [256, 64], the model's is [256, 32]" \
  "${gpt2[@]}" --set train.init_from="$work/gpt2-imported" --set model.d_model=32
refused "train.init_from = $work/gpt2-imported: checkpoint $work/gpt2-imported has tensor param/blocks.1." \
  "${gpt2[@]}" --set train.init_from="$work/gpt2-imported" --set model.n_layers=1
refused "train.init_from = $work/llama_tied-imported: checkpoint $work/llama_tied-imported has no tensor param/lm_head.weight" \
  "${llama_tied[@]}" --set model.tie_embeddings=false --set train.init_from="$work/llama_tied-imported"
# A resumed run continues from its own checkpoint and does not read train.init_from.
run gpt2-from-import 1 "${gpt2[@]}" --set train.steps=4 --set model.init_std=0.05 \
  --set train.init_from="$work/nothing" --resume latest
grep -q "resumed at step 3" "$work/gpt2-from-import.log" \
  && grep -q "train.init_from = $work/nothing is not read: the run continues from $work/gpt2-from-import/step_00000003" "$work/gpt2-from-import.log" \
  || { echo "FAIL: a resumed run with train.init_from"; cat "$work/gpt2-from-import.log"; exit 1; }
echo "init_from errors name the key and the tensor; a resumed run does not read it"
