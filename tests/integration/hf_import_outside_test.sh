#!/usr/bin/env bash
# cleave import of Hugging Face folders written outside cleave (docs/checkpoints.md, "Hugging Face
# import"): hf_folder.py writes tiny GPT-2 (OpenAI's layout: no "transformer." prefix, the causal
# mask buffers attn.bias beside the parameters), Llama with grouped-query attention (untied and
# tied) and Mixtral models with config.json as transformers writes it, in BF16 shards listed by
# model.safetensors.index.json (and in F16 and F32 single files). Each imports with its
# tokenizer.model (which moves with the checkpoint); every parameter is what Python wrote, widened
# exactly to fp32 (the imported checkpoint's export, bit for bit), and from each BF16 one cleave
# generates greedily the tokens the PyTorch reference generates from those weights
# (torch_reference.py --greedy).
# A folder cleave cannot import is refused with a message naming the file and the key or tensor
# at fault, and a config.json that asks for a huge model fails at its first tensor without
# allocating it.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
hf="/usr/bin/python3 $src/tests/integration/hf_folder.py"

declare -A ours  # folder -> cleave's greedy continuation
imported() {  # kind dtype shards
  local kind=$1 dtype=$2 shards=$3 name=$1-$2-$3
  $hf write "$kind" "$work/$name" --dtype "$dtype" --shards "$shards"
  cp "$data/tokenizer.model" "$work/$name/"
  "$cleave" import "$work/$name" "$work/$name-ck" > "$work/$name.log"
  local upper=${dtype^^}
  grep -q "^imported .* from $work/$name: [0-9]* parameters in [0-9]* tensors ([0-9]* $upper) of $shards file" "$work/$name.log" \
    && grep -q "^copied $work/$name/tokenizer.model to $work/$name-ck/tokenizer.model" "$work/$name.log" \
    || { echo "FAIL $name: the import does not say what it read"; cat "$work/$name.log"; exit 1; }
  "$cleave" export "$work/$name-ck" "$work/$name-export" > /dev/null
  $hf compare "$work/$name" "$work/$name-export" > /dev/null \
    || { echo "FAIL $name: the imported parameters are not what Python wrote"; $hf compare "$work/$name" "$work/$name-export"; exit 1; }
  echo "$name: imported, every parameter what Python wrote, widened to fp32 bitwise"
  [ "$dtype" = bf16 ] || return 0
  ours[$name]=$("$cleave" generate "$work/$name-ck" --prompt "KING" --ids --temperature 0 --max-new-tokens 12)
}
imported gpt2 bf16 2
grep -q "^left out 2 buffers that are no parameters (h.0.attn.bias, ...)" "$work/gpt2-bf16-2.log" \
  || { echo "FAIL: GPT-2's attn.bias buffers are not reported"; cat "$work/gpt2-bf16-2.log"; exit 1; }
imported llama_gqa bf16 3
imported llama_gqa_tied bf16 2
imported mixtral bf16 3
imported llama_gqa f16 1
imported gpt2 f32 1
# The checkpoint keeps its tokenizer when it moves.
mv "$work/llama_gqa_tied-bf16-2-ck" "$work/moved"
[ "$("$cleave" generate "$work/moved" --prompt "KING" --ids --temperature 0 --max-new-tokens 12)" = \
  "${ours[llama_gqa_tied-bf16-2]}" ] || { echo "FAIL: the moved checkpoint generates otherwise"; exit 1; }
# The same prompt for all: one process of the PyTorch reference decodes every folder.
names=(gpt2-bf16-2 llama_gqa-bf16-3 llama_gqa_tied-bf16-2 mixtral-bf16-3)
prompt=${ours[gpt2-bf16-2]%%|*}
exports=()
for name in "${names[@]}"; do exports+=("$work/$name-export"); done
mapfile -t theirs < <(/usr/bin/python3 "$src/tests/integration/torch_reference.py" --greedy \
  "${exports[@]}" --prompt-ids "$prompt" --max-new-tokens 12)
for i in "${!names[@]}"; do
  name=${names[$i]} mine=${ours[${names[$i]}]}
  [ "${mine%%|*}" = "$prompt" ] || { echo "FAIL $name: another prompt: $mine"; exit 1; }
  # cleave stops at the end-of-text token; the reference does not.
  n=$(echo "${mine#*|}" | wc -w)
  [ "$n" -ge 4 ] || { echo "FAIL $name: generated only $n tokens: $mine"; exit 1; }
  [ "$(echo "${theirs[$i]#*|}" | cut -d' ' -f1-$((n + 1)))" = "${mine#*|}" ] \
    || { echo "FAIL $name: cleave continues $mine, the PyTorch reference ${theirs[$i]}"; exit 1; }
  echo "$name: greedy like PyTorch: $mine"
done

# Refused folders: each a copy of a good one with one fault.
refused() {  # folder expected-text
  if "$cleave" import "$1" "$work/out" > "$work/refused.log" 2>&1; then
    echo "FAIL: imported $1"; exit 1
  fi
  grep -qF "$2" "$work/refused.log" \
    || { echo "FAIL: the error for $1 does not say: $2"; cat "$work/refused.log"; exit 1; }
  [ ! -e "$work/out" ] || { echo "FAIL: a refused import left $work/out"; exit 1; }
}
damaged() {  # name source: a fresh copy of a good folder
  rm -rf "$work/$1"
  cp -r "$work/$2" "$work/$1"
  echo "$work/$1"
}
one=llama_gqa-f16-1
f=$(damaged bad-type $one)
sed -i 's/"model_type": "llama"/"model_type": "bert"/' "$f/config.json"
refused "$f" "$f/config.json: model_type \"bert\" is not one cleave imports"
f=$(damaged bad-json $one)
echo '{"model_type": ' > "$f/config.json"
refused "$f" "$f/config.json is not JSON"
f=$(damaged bad-rope $one)
sed -i 's/"rope_scaling": null/"rope_scaling": {"type": "linear", "factor": 4.0}/' "$f/config.json"
refused "$f" "$f/config.json: rope_scaling = {\"factor\":4.0,\"type\":\"linear\"} is not supported"
f=$(damaged missing-tensor $one)
$hf edit "$f/model.safetensors" drop model.layers.1.self_attn.k_proj.weight
refused "$f" "$f: no tensor model.layers.1.self_attn.k_proj.weight [32, 64] in model.safetensors"
f=$(damaged extra-tensor $one)
$hf edit "$f/model.safetensors" add model.layers.0.self_attn.q_norm.weight
refused "$f" "$f/model.safetensors holds tensor model.layers.0.self_attn.q_norm.weight, which a llama model of $f/config.json does not have"
f=$(damaged tied-head llama_gqa_tied-bf16-2)
$hf edit "$f/model-00002-of-00002.safetensors" add lm_head.weight
$hf index "$f" lm_head.weight model-00002-of-00002.safetensors
refused "$f" "holds tensor lm_head.weight, which a llama model of $f/config.json does not have (tie_word_embeddings is true"
f=$(damaged bad-shape $one)
$hf edit "$f/model.safetensors" transpose model.layers.0.mlp.up_proj.weight
refused "$f" "$f/model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape [64, 96], but config.json makes it [96, 64]"
f=$(damaged bad-dtype $one)
$hf edit "$f/model.safetensors" f64 model.norm.weight
refused "$f" "$f/model.safetensors: tensor model.norm.weight is F64; import reads F32, BF16 and F16"
f=$(damaged no-weights $one)
rm "$f/model.safetensors"
refused "$f" "$f has no model.safetensors and no model.safetensors.index.json"
sharded=mixtral-bf16-3
f=$(damaged missing-shard $sharded)
rm "$f/model-00002-of-00003.safetensors"
refused "$f" "in model-00002-of-00003.safetensors, which is missing"
grep -qF "$f/model.safetensors.index.json lists tensor model." "$work/refused.log" \
  || { echo "FAIL: the missing shard's error names no tensor"; cat "$work/refused.log"; exit 1; }
f=$(damaged wrong-shard $sharded)
$hf index "$f" model.norm.weight model-00001-of-00003.safetensors
refused "$f" "$f/model.safetensors.index.json lists tensor model.norm.weight in model-00001-of-00003.safetensors, which does not hold it"
f=$(damaged outside-shard $sharded)
$hf index "$f" model.norm.weight ../model-00003-of-00003.safetensors
refused "$f" "$f/model.safetensors.index.json: tensor model.norm.weight is in \"../model-00003-of-00003.safetensors\", which is not the name of a file in the folder"
f=$(damaged unlisted $sharded)
/usr/bin/python3 - "$f/model.safetensors.index.json" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
del index["weight_map"]["model.norm.weight"]
json.dump(index, open(sys.argv[1], "w"))
PY
refused "$f" "$f/model-00003-of-00003.safetensors holds tensor model.norm.weight, which $f/model.safetensors.index.json does not list"
refused "$work/nowhere" "Hugging Face folder $work/nowhere does not exist"
mkdir "$work/out"
if "$cleave" import "$work/$one" "$work/out" > "$work/refused.log" 2>&1 \
    || ! grep -qF "cleave import: $work/out exists" "$work/refused.log"; then
  echo "FAIL: import into an existing folder"; cat "$work/refused.log"; exit 1
fi
rmdir "$work/out"
# A config.json that asks for the largest model [model] allows (a 2^24 vocabulary of 2^16
# dimensions: 4 TiB of fp32) beside the tiny files fails at its first tensor, in little memory.
f=$(damaged huge $one)
sed -i -e 's/"vocab_size": 256/"vocab_size": 16777216/' -e 's/"hidden_size": 64/"hidden_size": 65536/' \
  -e 's/"head_dim": 16/"head_dim": 16384/' -e 's/"num_hidden_layers": 2/"num_hidden_layers": 1024/' "$f/config.json"
# Its peak resident memory in KiB, as the kernel counts it for a waited-for child (no /usr/bin/time:
# a fresh Debian has none).
rss=$(/usr/bin/python3 -c 'import resource, subprocess, sys
with open(sys.argv[1], "w") as log:
    subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$work/refused.log" "$cleave" import "$f" "$work/out")
grep -qF "$f/model.safetensors: tensor model.embed_tokens.weight has shape [256, 64], but config.json makes it [16777216, 65536]" "$work/refused.log" \
  || { echo "FAIL: the huge config"; cat "$work/refused.log"; exit 1; }
[ "$rss" -lt 300000 ] || { echo "FAIL: the huge config took $rss KiB"; exit 1; }
echo "refused folders name the file and the key or tensor; the huge config.json failed in $rss KiB"
