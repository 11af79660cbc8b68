#!/usr/bin/env bash
# The comparison every layout test relies on (compare_runs.py) is able to fail: honest layouts
# pass, and copies of them with one fault planted (tests/integration/perturb_run.py) fail, each
# with a message naming the tensor and the row or expert. The faults, each about one learning
# rate (RMS over the elements moved): one embedding row; the last vocabulary row, which tp 2
# leaves beside its padding (257 rows as 2 x 129); the same row of the untied LM head; one
# expert; one row of an expert; one row of a router (an expert's); one tp rank's half of a
# tensor; one pipeline stage's layer; and, in bf16 and FP8, one embedding row. Beside
# them one expert's sigmoid_bias balancing bias moved by one update step, and one logged loss
# by 1e-4 relative. The unperturbed copies, made by the same code, pass. The model: Llama, 2 kv
# heads, vocabulary 257, 4 experts (sigmoid_bias, top 2, one shared) in both layers (dense in
# bf16 and FP8); 4 steps. About 15 s on 2 cores (10 s of CPU).
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
perturb="/usr/bin/python3 $src/tests/integration/perturb_run.py"
"$cleave" tokenize "$cfg" --set data.corpus="$data/corpus.txt" --set data.dir="$work/v257" \
  --set model.vocab_size=257 > /dev/null
common=(--set train.steps=4 --set train.log_interval=1 --set train.val_interval=2
        --set train.checkpoint_interval=4 --set train.threads=1 --set parallel.comm_timeout_s=60
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2
        --set data.dir="$work/v257" --set model.vocab_size=257
        --set model.family=llama --set model.n_kv_heads=2)
moe=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64
     --set model.moe_shared_experts=1 --set model.moe_router=sigmoid_bias
     --set model.moe_bias_update_rate=0.01)
# run() of layouts.sh sets data.dir to the fixture first; common's data.dir comes after it.

# passes REF RUN: the comparison passes.
passes() {
  $compare "$work/$1" "$work/$2" > "$work/$2.compare" 2>&1 \
    || { echo "FAIL: the honest $2 failed the comparison"; cat "$work/$2.compare"; exit 1; }
}
# catches REF RUN MESSAGE: the comparison fails and its FAIL line holds MESSAGE.
catches() {
  if $compare "$work/$1" "$work/$2" > "$work/$2.compare" 2>&1; then
    echo "FAIL: the comparison passed $2"; cat "$work/$2.compare"; exit 1
  fi
  grep "^FAIL" "$work/$2.compare" | grep -qF -- "$3" \
    || { echo "FAIL: $2 failed without naming \"$3\""; cat "$work/$2.compare"; exit 1; }
  echo "caught $2: $(grep "^FAIL" "$work/$2.compare" | grep -o -- "$3[^;]*" | head -1)"
}

run ref 1 "${moe[@]}"
run tp2 2 "${moe[@]}" --set parallel.tp=2
run pp2 2 "${moe[@]}" --set parallel.pp=2
passes ref tp2
passes ref pp2
for r in tp2 pp2; do
  $perturb "$work/$r" "$work/$r-copy" param embed.wte --size 0 > /dev/null
  passes ref $r-copy
done

# The file of tp rank 1's vocabulary rows, and the file that holds pipeline stage 1's layer.
tp1=$(/usr/bin/python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
print(next(p["file"] for p in m["tensors"]["param/embed.wte"]["pieces"] if p["offset"][0] > 0))' \
  "$work/tp2/step_00000004/meta.json")
stage1=$(/usr/bin/python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
print(m["tensors"]["param/blocks.1.attn.out.weight"]["pieces"][0]["file"])' "$work/pp2/step_00000004/meta.json")

sabotage() {  # NAME FROM MESSAGE perturb_run.py-arguments...
  local name=$1 from=$2 message=$3; shift 3
  $perturb "$work/$from" "$work/$name" "$@" > /dev/null
  catches ref "$name" "$message"
}
# (The row is 0.4% of the tensor, under the whole-tensor RMS's trim of 0.5% when every element
# has a gradient. Where the 4 steps leave over 57 tokens unseen, their rows are left out as
# noise-only and the trim falls below the row: then the whole-tensor check sees it too. The
# message checked is the row check's own.)
sabotage row100 tp2 "embed.wte row 100:" param embed.wte --rows 100:101
sabotage padded-row tp2 "embed.wte row 256:" param embed.wte --rows 256:257
sabotage head-row tp2 "lm_head.weight row 256:" param lm_head.weight --rows 256:257
sabotage expert tp2 "blocks.1.moe.experts.2.fc.weight row " expert blocks.1.moe.experts.2
sabotage expert-row tp2 "blocks.0.moe.experts.3.proj.weight row 7:" param blocks.0.moe.experts.3.proj.weight --rows 7:8
sabotage router-row pp2 "blocks.1.moe.router.weight expert 1:" param blocks.1.moe.router.weight --rows 1:2
sabotage tp-half tp2 "blocks.0.attn.qkv.weight:" param blocks.0.attn.qkv.weight --file "$tp1"
sabotage pp-stage pp2 "blocks.1.attn.out.weight:" param blocks.1.attn.out.weight --file "$stage1"
sabotage moe-bias tp2 "moe_bias of layer 1 expert 0:" moe_bias 1 0
sabotage loss pp2 "loss error" loss 4

# bf16 (whose bounds fp16 shares) and FP8 (delayed), the dense model (with top 2, reduced
# precision flips routing choices between honest layouts, docs/moe.md): one embedding row moved
# by one lr fails its row bound, 3.3x over bf16's, 2x over FP8's.
for dtype in bf16 fp8; do
  run ref-$dtype 1 --set train.dtype=$dtype
  run tp2-$dtype 2 --set train.dtype=$dtype --set parallel.tp=2
  passes ref-$dtype tp2-$dtype
  $perturb "$work/tp2-$dtype" "$work/$dtype-row100" param embed.wte --rows 100:101 > /dev/null
  catches ref-$dtype $dtype-row100 "embed.wte row 100:"
done
echo "compare_runs.py passes the honest layouts and fails each planted fault, naming it"
