#!/usr/bin/env bash
# Bad input gets a clear error naming the key, file or fault, and a non-zero exit; never a crash.
set -uo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=$src/tests/configs/tiny_train.toml
failures=0

# expect_error "what" "substring" command...: the command must exit 1 (or 2 for usage) and print the substring.
expect_error() {
  local what=$1 want=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if { [ $rc -ne 1 ] && [ $rc -ne 2 ]; } || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $what: exit $rc, expected 1 or 2 and the message: $want"; echo "$out" | tail -5
    failures=$((failures + 1))
  else
    echo "ok   $what: $(grep -F -- "$want" <<<"$out" | head -1)"
  fi
}

train() { "$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/run" "$@"; }

expect_error "unknown key" "unknown key 'train.stpes' (did you mean 'train.steps'?)" train --set train.stpes=5
expect_error "misplaced key" "unknown key 'model.lr' (did you mean 'optim.lr'?)" train --set model.lr=0.1
printf '[model]\nfamily = "gpt2"\nd_modle = 64\n' > "$work/typo.toml"
expect_error "unknown key in a file" "typo.toml:3: unknown key 'model.d_modle' (did you mean 'model.d_model'?)" "$cleave" train "$work/typo.toml"
expect_error "wrong type" "model.d_model must be an integer, got string" train --set 'model.d_model="big"'
expect_error "out of range" "optim.beta2 = 1.5 is out of range" train --set optim.beta2=1.5
expect_error "bad choice" "train.dtype = \"fp64\" is not one of \"fp32\", \"bf16\"" train --set train.dtype=fp64
expect_error "heads do not divide" "model.d_model = 64 is not divisible by model.n_heads = 3" train --set model.n_heads=3
expect_error "missing config" "config file $work/none.toml: No such file or directory" "$cleave" train "$work/none.toml"
# Small inputs that would take unbounded memory or time are refused before anything is read or
# allocated: a directory, a device or a FIFO given as a file; a schedule naming a huge stage.
expect_error "directory as config" "config file $work is a directory, not a file" "$cleave" train "$work"
expect_error "device as config" "config file /dev/zero is not a regular file" "$cleave" train /dev/zero
mkfifo "$work/fifo"
expect_error "FIFO as config" "config file $work/fifo is not a regular file" timeout 20 "$cleave" train "$work/fifo"
printf '0F999999999\n' > "$work/huge_mb.csv"
expect_error "schedule naming a huge micro-batch" "names stage 0 and micro-batch 999999999 but holds only 1 actions" "$cleave" schedule --load "$work/huge_mb.csv"
printf '999999999F0\n' > "$work/huge_stage.csv"
expect_error "schedule naming a huge stage" "names stage 999999999 and micro-batch 0" "$cleave" schedule --load "$work/huge_stage.csv"
expect_error "list element beyond 32 bits" "parallel.pp_layers[0] = 4294967298 is out of range" train --set 'parallel.pp_layers=[4294967298]'
expect_error "a whole table replaced" "--set model={}: model is a table" train --set 'model={}'
expect_error "--exit-after 0" "--exit-after = 0 is below 1" train --exit-after 0
expect_error "--exit-after -1" "--exit-after = -1 is below 1" train --exit-after -1

mkdir -p "$work/trunc" "$work/foreign" "$work/novocab"
cp "$data"/* "$work/trunc/"; cp "$data"/* "$work/foreign/"; cp "$data"/* "$work/novocab/"
truncate -s -3 "$work/trunc/train.bin"
expect_error "truncated token file" "token file $work/trunc/train.bin: size mismatch" train --set data.dir="$work/trunc"
head -c 5000 /dev/urandom > "$work/foreign/val.bin"
expect_error "foreign token file" "token file $work/foreign/val.bin: not a cleave token file" train --set data.dir="$work/foreign"
expect_error "vocab mismatch" "vocab size mismatch" train --set model.vocab_size=300
expect_error "missing token file" "token file $work/empty/train.bin: cannot open" train --set data.dir="$work/empty"

# A good short run gives a checkpoint for the generate and checkpoint cases.
train --set train.steps=2 --set train.checkpoint_interval=0 > "$work/train.log" 2>&1 || { echo "FAIL: short run"; cat "$work/train.log"; exit 1; }
ck=$work/run/step_00000002
expect_error "missing tokenizer" "tokenizer model $work/nothing.model: No such file or directory" "$cleave" generate "$ck" --prompt "To be" --tokenizer "$work/nothing.model"
expect_error "device as tokenizer" "tokenizer model /dev/zero is not a regular file" timeout 20 "$cleave" generate "$ck" --prompt "To be" --tokenizer /dev/zero
expect_error "temperature nan" "--temperature = nan is out of range [0, 10000]" "$cleave" generate "$ck" --prompt "To be" --temperature nan
expect_error "top-k 1.5" "--top-k expects an integer, got '1.5'" "$cleave" generate "$ck" --prompt "To be" --top-k 1.5
expect_error "top-k negative" "--top-k = -1 is out of range" "$cleave" generate "$ck" --prompt "To be" --top-k -1
expect_error "max-new-tokens negative" "--max-new-tokens = -3 is out of range [0, " "$cleave" generate "$ck" --prompt "To be" --max-new-tokens -3
expect_error "max-new-tokens past the context" "--max-new-tokens = 5000 is out of range [0, " "$cleave" generate "$ck" --prompt "To be" --max-new-tokens 5000
# The key/value pool's size is the one asked for (64 KiB a block here): too small for what the
# request needs, it is refused before anything runs; large enough, it is the one used.
expect_error "kv cache too small" "holds 1 blocks of 64 tokens; this rank's sequences need 2" "$cleave" generate "$ck" --prompt "To be" --kv-cache-mib 0.1
expect_error "kv cache too small for 3" "holds 2 blocks of 64 tokens; this rank's sequences need 4" "$cleave" generate "$ck" --prompt "To be" --batch 3 --kv-cache-mib 0.15
"$cleave" generate "$ck" --prompt "To be" --batch 3 --kv-cache-mib 0.3 --max-new-tokens 4 2> "$work/kv.err" > /dev/null ||
  { echo "FAIL: a 0.3 MiB cache for 3 sequences"; cat "$work/kv.err"; exit 1; }
grep -q "key/value cache fp32, 0.3 MiB a rank" "$work/kv.err" || { echo "FAIL: the cache's size is not shown"; cat "$work/kv.err"; exit 1; }
# bf16 weights keep an fp32 cache when told to; an unknown cache dtype is refused, naming the option.
"$cleave" generate "$ck" --prompt "To be" --dtype bf16 --kv-cache-dtype fp32 --max-new-tokens 2 2> "$work/kv.err" > /dev/null ||
  { echo "FAIL: bf16 weights over an fp32 cache"; cat "$work/kv.err"; exit 1; }
grep -q "bf16 weights, .*key/value cache fp32, as needed" "$work/kv.err" || { echo "FAIL: the cache's dtype is not fp32"; cat "$work/kv.err"; exit 1; }
expect_error "kv cache dtype" "--kv-cache-dtype must be auto, fp32 or bf16, not 'fp8'" "$cleave" generate "$ck" --prompt "To be" --kv-cache-dtype fp8
expect_error "bench-decode positional" "cleave bench-decode: takes no positional arguments, got 'x'" "$cleave" bench-decode x
expect_error "bench-decode seconds" "--seconds = 0 is out of range" "$cleave" bench-decode --seconds 0
expect_error "bench-comm meetings both ways" "bench-comm: --meetings-only and --no-meetings exclude each other" "$cleave" bench-comm --meetings-only --no-meetings
expect_error "bench-comm meeting seconds" "--meeting-seconds = 0 is out of range" "$cleave" bench-comm --meetings-only --meeting-seconds 0
expect_error "bench-comm meetings only, ops" "bench-comm: --ops has no effect with --meetings-only" "$cleave" bench-comm --meetings-only --ops all_reduce
expect_error "prompt ids out of range" "--prompt-ids = 999 is out of range [0, 255]" "$cleave" generate "$ck" --prompt-ids "1 999"
expect_error "generate layout not the ranks" "parallel.tp = 2 x parallel.pp = 1 x parallel.ep = 1 makes 2 ranks, but 1 were started" "$cleave" generate "$ck" --prompt "To be" --set parallel.tp=2
expect_error "generate setting not a layout" "the inference layout takes parallel.tp=N" "$cleave" generate "$ck" --prompt "To be" --set train.steps=3
# meta.json's values are checked before they steer a run or allocate: a step out of range, a
# saved config asking for a model the saved tensors are not (checked before it is built).
for bad in "-3" "9223372036854775800"; do
  cp -r "$ck" "$work/step$bad"
  /usr/bin/python3 - "$work/step$bad/meta.json" "$bad" <<'PY' || { echo "FAIL: cannot edit meta.json"; exit 1; }
import json, sys
meta = json.load(open(sys.argv[1]))
meta["step"] = int(sys.argv[2])
json.dump(meta, open(sys.argv[1], "w"))
PY
  expect_error "checkpoint step $bad" "meta.json: \"step\" = $bad is out of range [0, 2^53]" train --resume "$work/step$bad"
done
cp -r "$ck" "$work/hugevocab"
/usr/bin/python3 - "$work/hugevocab/meta.json" <<'PY' || { echo "FAIL: cannot edit meta.json"; exit 1; }
import json, sys
meta = json.load(open(sys.argv[1]))
meta["config"] = meta["config"].replace("vocab_size = 256", "vocab_size = 16000000")
json.dump(meta, open(sys.argv[1], "w"))
PY
expect_error "saved config of a huge model" "tensor param/embed.wte has shape [256, 64], the model's is [16000000, 64]" \
  "$cleave" generate "$work/hugevocab" --prompt "To be"
# ... and the 4 GB of parameters it would hold never took memory (its pages mapped, untouched).
peak_kib=$(/usr/bin/python3 -c '
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$cleave" generate "$work/hugevocab" --prompt "To be")
if [ "$peak_kib" -gt 300000 ]; then
  echo "FAIL huge saved config: refusing it took $peak_kib KiB"; failures=$((failures + 1))
else
  echo "ok   huge saved config refused within $peak_kib KiB"
fi
cp -r "$ck" "$work/corrupt"
printf '\x42' | dd of="$work/corrupt/model-rank00000.safetensors" bs=1 seek=5000 conv=notrunc status=none
expect_error "corrupted checkpoint" "checksum mismatch" "$cleave" generate "$work/corrupt" --prompt "To be" --tokenizer "$data/tokenizer.model"
expect_error "corrupted checkpoint on resume" "checksum mismatch" train --resume "$work/corrupt"
cp -r "$ck" "$work/gap"
/usr/bin/python3 - "$work/gap/meta.json" <<'PY' || { echo "FAIL: cannot edit meta.json"; exit 1; }
import json, sys
meta = json.load(open(sys.argv[1]))
piece = meta["tensors"]["adam_v/blocks.0.attn.qkv.weight"]["pieces"][0]
piece["begin"] += 16  # the first 16 elements are in no file
json.dump(meta, open(sys.argv[1], "w"))
PY
expect_error "checkpoint missing part of a tensor" "the pieces of tensor adam_v/blocks.0.attn.qkv.weight do not tile its elements (gap or overlap at element 0)" train --resume "$work/gap"
cp -r "$ck" "$work/noend"
/usr/bin/python3 - "$work/noend/meta.json" <<'PY' || { echo "FAIL: cannot edit meta.json"; exit 1; }
import json, sys
meta = json.load(open(sys.argv[1]))
del meta["tensors"]["param/blocks.0.attn.qkv.weight"]["pieces"][0]["end"]
json.dump(meta, open(sys.argv[1], "w"))
PY
expect_error "checkpoint meta.json with a malformed piece" "$work/noend/meta.json: tensor param/blocks.0.attn.qkv.weight:" train --resume "$work/noend"
# A piece's end as a float far beyond int64 (converting it had no defined result).
cp -r "$ck" "$work/floatend"
/usr/bin/python3 - "$work/floatend/meta.json" <<'PY' || { echo "FAIL: cannot edit meta.json"; exit 1; }
import json, sys
meta = json.load(open(sys.argv[1]))
meta["tensors"]["param/blocks.0.attn.qkv.weight"]["pieces"][0]["end"] = 1.06667e+116
json.dump(meta, open(sys.argv[1], "w"))
PY
expect_error "checkpoint piece with a float end" "tensor param/blocks.0.attn.qkv.weight: a piece's end holds 1.06667e+116, not an integer" train --resume "$work/floatend"
# A file whose header disagrees with meta.json (a transposed shape, the same size, the header's
# checksum made to match) is refused, not read as it lies.
cp -r "$ck" "$work/transposed"
/usr/bin/python3 - "$work/transposed/model-rank00000.safetensors" <<'PY' || { echo "FAIL: cannot edit the header"; exit 1; }
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
entry = header["param/blocks.0.attn.qkv.weight"]
entry["shape"] = entry["shape"][::-1]
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (n - len(text))
assert len(text) == n
data[8:8 + n] = text
open(path, "wb").write(bytes(data))
PY
found=$("$cleave" generate "$work/transposed" --prompt "To be" 2>&1 | sed -n 's/.*checksum mismatch.*found \([0-9a-f]*\).*/\1/p')
/usr/bin/python3 - "$work/transposed/meta.json" "$found" <<'PY' || { echo "FAIL: cannot edit meta.json"; exit 1; }
import json, sys
meta = json.load(open(sys.argv[1]))
meta["files"]["model-rank00000.safetensors"]["header_xxh64"] = sys.argv[2]
json.dump(meta, open(sys.argv[1], "w"))
PY
expect_error "safetensors header against meta.json" "holds param/blocks.0.attn.qkv.weight as F32 [64, 192], meta.json as F32 [192, 64]" \
  "$cleave" generate "$work/transposed" --prompt "To be"
mkdir -p "$work/export"
echo "precious" > "$work/precious"
ln -s "$work/precious" "$work/export/config.json"
expect_error "export through a link" "$work/export/config.json is a symbolic link (to $work/precious)" \
  "$cleave" export "$ck" "$work/export"
grep -qx precious "$work/precious" || { echo "FAIL export wrote through a link"; failures=$((failures + 1)); }
cp -r "$ck" "$work/dirfile"
rm "$work/dirfile/model-rank00000.safetensors"
mkdir "$work/dirfile/model-rank00000.safetensors"
expect_error "state file that is a directory" "checkpoint file $work/dirfile/model-rank00000.safetensors listed in $work/dirfile/meta.json is a directory" \
  "$cleave" generate "$work/dirfile" --prompt "To be"
expect_error "checkpoint of another model" "was written with model.d_model = 64 but the config has model.d_model = 32" train --resume "$ck" --set model.d_model=32
expect_error "fresh run over an old one" "already holds checkpoints (newest $work/run/step_00000002): pass --resume latest" train
# --resume latest serves a job's first start and every requeue: with no checkpoint it starts from
# scratch and says so; a newest checkpoint cut off or corrupted is skipped and named.
requeue() { "$cleave" train "$cfg" --set data.dir="$data" --set train.out_dir="$work/requeue" \
  --set train.checkpoint_interval=2 --resume latest "$@" 2>&1; }
expect_in() {  # what, substring, text
  if grep -qF -- "$2" <<<"$3"; then echo "ok   $1: $2"; else
    echo "FAIL $1: expected: $2"; tail -5 <<<"$3"; failures=$((failures + 1)); fi
}
expect_in "resume latest with no checkpoint" "--resume latest: no checkpoint that verifies in $work/requeue: starting from step 0" \
  "$(requeue --set train.steps=4)"
printf '\x42' | dd of="$work/requeue/step_00000004/model-rank00000.safetensors" bs=1 seek=3000 conv=notrunc status=none
out=$(requeue --set train.steps=6)
expect_in "resume latest past a corrupted checkpoint" "--resume latest: skipping $work/requeue/step_00000004: checksum mismatch" "$out"
expect_in "resume latest from the one before" "resumed at step 2" "$out"
expect_error "unknown command" "unknown command 'trian'" "$cleave" trian
[ $failures -eq 0 ] || { echo "$failures bad-input cases failed"; exit 1; }
