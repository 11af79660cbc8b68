#!/usr/bin/env bash
# generate: the same seed gives the same text, another seed other text, greedy decoding through
# the key/value cache equals greedy decoding without it (checked inside cleave's unit tests too);
# export: a Hugging Face folder whose tensors have the GPT-2 / Llama names and shapes; a version 1
# checkpoint still loads. A mixture of experts exported in Mixtral's layout (and in cleave's own,
# with sigmoid_bias's biases and shared experts) continues a prompt greedily, in the PyTorch
# reference (torch_reference.py --greedy), exactly as cleave's own generation does.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=$src/tests/configs/tiny_train.toml

for family in gpt2 llama; do
  "$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/$family" \
    --set model.family=$family --set train.steps=4 --set train.val_interval=0 > /dev/null
  gen() { "$cleave" generate "$work/$family" --prompt "KING" --max-new-tokens 20 --tokenizer "$data/tokenizer.model" "$@"; }
  a=$(gen --seed 1) b=$(gen --seed 1) c=$(gen --seed 2)
  [ "$a" = "$b" ] || { echo "FAIL $family: same seed, different text"; exit 1; }
  [ "$a" != "$c" ] || { echo "FAIL $family: seeds 1 and 2 gave the same text"; exit 1; }
  [[ "$a" == KING* ]] || { echo "FAIL $family: output does not start with the prompt: $a"; exit 1; }
  [ ${#a} -gt 4 ] || { echo "FAIL $family: nothing generated"; exit 1; }

  "$cleave" export "$work/$family" "$work/$family-hf" > /dev/null
  /usr/bin/python3 - "$work/$family-hf" "$family" <<'PY'
import json, struct, sys
folder, family = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{folder}/config.json"))
with open(f"{folder}/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
names = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
d, V = 64, 256
if family == "gpt2":
    assert cfg["model_type"] == "gpt2" and cfg["n_embd"] == d and cfg["n_layer"] == 2, cfg
    assert names["transformer.wte.weight"] == [V, d]
    assert names["transformer.h.1.attn.c_attn.weight"] == [d, 3 * d]  # Conv1D: [in, out]
    assert names["transformer.h.0.mlp.c_proj.weight"] == [4 * d, d]
    assert "lm_head.weight" not in names  # tied
    assert len(names) == 2 + 2 * 12 + 2
else:
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] == d, cfg
    ffn = cfg["intermediate_size"]
    assert names["model.layers.0.self_attn.q_proj.weight"] == [d, d]
    assert names["model.layers.1.mlp.gate_proj.weight"] == [ffn, d]
    assert names["model.layers.1.mlp.down_proj.weight"] == [d, ffn]
    assert names["lm_head.weight"] == [V, d]  # untied by default
    assert len(names) == 1 + 2 * 9 + 2
print(f"{family}: export ok, {len(names)} tensors")
PY
  echo "$family: generate deterministic: $a"
done

# A version 1 checkpoint (one file, whole tensors, each tensor's "file" in meta.json) still loads:
# rewrite the newest gpt2 checkpoint's meta.json in that form and export it again.
ck=$(ls -d "$work"/gpt2/step_* | tail -1)
cp -r "$ck" "$work/v1"
/usr/bin/python3 - "$work/v1/meta.json" "$src/tests/integration" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
from old_format import whole_file_checksums
meta = json.load(open(sys.argv[1]))
assert meta["version"] == 4 and len(meta["files"]) == 1, meta["files"]
for t in meta["tensors"].values():
    (piece,) = t.pop("pieces")
    t["file"] = piece["file"]
whole_file_checksums(meta, sys.argv[1].rsplit("/", 1)[0], version=1)
json.dump(meta, open(sys.argv[1], "w"))
PY
"$cleave" export "$work/v1" "$work/v1-hf" > /dev/null
cmp "$work/v1-hf/model.safetensors" "$work/gpt2-hf/model.safetensors" \
  || { echo "FAIL: a version 1 checkpoint exported other tensors"; exit 1; }
echo "version 1 checkpoint: loads and exports the same tensors"
# A version 2 checkpoint (pieces as element ranges of the whole tensor, no boxes) still loads.
cp -r "$ck" "$work/v2"
/usr/bin/python3 - "$work/v2/meta.json" "$src/tests/integration" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
from old_format import whole_file_checksums
meta = json.load(open(sys.argv[1]))
for t in meta["tensors"].values():
    for piece in t["pieces"]:
        for key in ("key", "offset", "box"):
            del piece[key]
whole_file_checksums(meta, sys.argv[1].rsplit("/", 1)[0], version=2)
json.dump(meta, open(sys.argv[1], "w"))
PY
"$cleave" export "$work/v2" "$work/v2-hf" > /dev/null
cmp "$work/v2-hf/model.safetensors" "$work/gpt2-hf/model.safetensors" \
  || { echo "FAIL: a version 2 checkpoint exported other tensors"; exit 1; }

# Mixtures of experts: the export continues greedily like cleave's own generation.
moe=(--set model.family=llama --set model.moe_experts=4 --set model.moe_top_k=2
     --set model.moe_ffn_hidden=64 --set model.moe_aux_loss_coef=0.01)
for variant in mixtral cleave_moe; do
  extra=()
  [ $variant = cleave_moe ] && extra=(--set model.moe_router=sigmoid_bias --set model.moe_shared_experts=1)
  "$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/$variant" "${moe[@]}" \
    "${extra[@]}" --set train.steps=6 --set train.val_interval=0 > /dev/null
  "$cleave" export "$work/$variant" "$work/$variant-hf" > /dev/null
  grep -q "\"model_type\": \"$variant\"" "$work/$variant-hf/config.json" \
    || { echo "FAIL: $variant export has another model_type"; cat "$work/$variant-hf/config.json"; exit 1; }
  ours=$("$cleave" generate "$work/$variant" --prompt "KING" --ids --temperature 0 \
         --max-new-tokens 12 --tokenizer "$data/tokenizer.model")
  prompt=${ours%%|*}
  theirs=$(/usr/bin/python3 "$src/tests/integration/torch_reference.py" --greedy "$work/$variant-hf" \
           --prompt-ids "$prompt" --max-new-tokens 12)
  # cleave stops at the end-of-text token; the reference does not.
  n=$(echo "${ours#*|}" | wc -w)
  [ "$n" -ge 4 ] || { echo "FAIL: $variant generated only $n tokens: $ours"; exit 1; }
  [ "$(echo "${theirs#*|}" | cut -d' ' -f1-$((n + 1)))" = "${ours#*|}" ] \
    || { echo "FAIL: $variant: cleave continues $ours, its export in PyTorch $theirs"; exit 1; }
  echo "$variant export continues greedily like cleave: $ours"
done
grep -q '"num_local_experts": 4' "$work/mixtral-hf/config.json" && grep -q '"num_experts_per_tok": 2' "$work/mixtral-hf/config.json" \
  || { echo "FAIL: the Mixtral config lacks num_local_experts or num_experts_per_tok"; exit 1; }
