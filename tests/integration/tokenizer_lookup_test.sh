#!/usr/bin/env bash
# generate and export use the tokenizer a checkpoint carries: a tokenizer.json in the checkpoint
# folder (as an imported model has) wins over the run's data folder's tokenizer.model, and
# --tokenizer over both; export writes it, with its tokenizer_config.json, into the Hugging Face
# folder, and import carries it back into a checkpoint. The tokenizer.json here is a byte-level one
# of 256 tokens (the bytes, no merges), so a prompt's ids are its bytes.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$cleave" train "$src/tests/configs/tiny_train.toml" --set data.dir="$data" \
  --set train.out_dir="$work/run" --set train.steps=2 --set train.val_interval=0 \
  --set train.checkpoint_interval=2 > /dev/null
ck=$(ls -d "$work"/run/step_* | tail -1)
/usr/bin/python3 - "$ck" <<'PY'
import json, sys
keep = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
chars, n = {}, 0
for b in range(256):
    chars[b] = chr(b) if b in keep else chr(256 + n)
    n += b not in keep
vocab = {chars[b]: b for b in range(256)}
level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
tok = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": level,
       "post_processor": level, "decoder": level,
       "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": False}}
json.dump(tok, open(f"{sys.argv[1]}/tokenizer.json", "w"))
json.dump({"chat_template": "{{ messages }}"}, open(f"{sys.argv[1]}/tokenizer_config.json", "w"))
PY

gen() { "$cleave" generate "$@" --prompt "KING" --max-new-tokens 8 --seed 1 --ids 2> "$work/err"; }
for where in "$ck" "$work/run"; do  # the checkpoint, or the run folder (its newest checkpoint)
  out=$(gen "$where")
  [[ "$out" == "75 73 78 71 |"* ]] || { echo "FAIL: $where: prompt ids are not the bytes of KING: $out"; exit 1; }
  grep -q "# tokenizer: $ck/tokenizer.json (byte-level BPE, vocabulary 256)" "$work/err" \
    || { echo "FAIL: $where: generate did not say it used $ck/tokenizer.json:"; cat "$work/err"; exit 1; }
done
out=$(gen "$ck" --tokenizer "$data/tokenizer.model")
[[ "$out" != "75 73 78 71 |"* ]] || { echo "FAIL: --tokenizer did not replace the checkpoint's: $out"; exit 1; }
grep -q "# tokenizer: $data/tokenizer.model (SentencePiece, vocabulary 256)" "$work/err" \
  || { echo "FAIL: --tokenizer not reported:"; cat "$work/err"; exit 1; }
# The streamed text is the continuation's bytes read as UTF-8, each cut character once as U+FFFD:
# a character split over ids is held back until it is whole, not shown as U+FFFD first.
"$cleave" generate "$ck" --prompt "KING" --max-new-tokens 40 --seed 3 > "$work/text" 2> /dev/null
"$cleave" generate "$ck" --prompt "KING" --max-new-tokens 40 --seed 3 --ids > "$work/ids" 2> /dev/null
/usr/bin/python3 - "$work/text" "$work/ids" <<'PY'
import sys
text = open(sys.argv[1], "rb").read().decode("utf-8")
ids = [int(t) for t in open(sys.argv[2]).read().split("|")[1].split()]
expected = "KING" + bytes(ids).decode("utf-8", errors="replace") + "\n"
assert all(i < 256 for i in ids), ids
assert text == expected, (text, expected)
print(f"generate streamed {len(ids)} byte tokens as {len(text) - 5} characters")
PY

# export carries whichever tokenizer the checkpoint comes with, and its config; --tokenizer
# takes the exported folder.
"$cleave" export "$ck" "$work/hf-json" > /dev/null
for f in tokenizer.json tokenizer_config.json; do
  cmp -s "$ck/$f" "$work/hf-json/$f" || { echo "FAIL: export did not carry $f"; exit 1; }
done
[ ! -e "$work/hf-json/tokenizer.model" ] || { echo "FAIL: export wrote the data folder's tokenizer.model too"; exit 1; }
out=$(gen "$ck" --tokenizer "$work/hf-json")
[[ "$out" == "75 73 78 71 |"* ]] || { echo "FAIL: --tokenizer FOLDER: $out"; exit 1; }
# import carries a Hugging Face folder's tokenizer.json and tokenizer_config.json into the
# checkpoint, and generate then takes it.
"$cleave" import "$work/hf-json" "$work/imported" > "$work/import.log"
for f in tokenizer.json tokenizer_config.json; do
  grep -q "^copied $work/hf-json/$f to $work/imported/$f" "$work/import.log" && cmp -s "$ck/$f" "$work/imported/$f" \
    || { echo "FAIL: import did not carry $f:"; cat "$work/import.log"; exit 1; }
done
grep -q "^tokenizer $work/imported/tokenizer.json: byte-level BPE, vocabulary 256$" "$work/import.log" \
  || { echo "FAIL: import did not report the tokenizer it carries:"; cat "$work/import.log"; exit 1; }
out=$(gen "$work/imported")
[[ "$out" == "75 73 78 71 |"* ]] && grep -q "# tokenizer: $work/imported/tokenizer.json" "$work/err" \
  || { echo "FAIL: the imported checkpoint's tokenizer.json was not used: $out"; cat "$work/err"; exit 1; }

# Without the checkpoint's tokenizer, the data folder's.
rm "$ck/tokenizer.json" "$ck/tokenizer_config.json"
gen "$ck" > /dev/null
grep -q "# tokenizer: $data/tokenizer.model (SentencePiece" "$work/err" \
  || { echo "FAIL: the data folder's tokenizer.model was not used:"; cat "$work/err"; exit 1; }
"$cleave" export "$ck" "$work/hf-sp" > /dev/null
cmp -s "$data/tokenizer.model" "$work/hf-sp/tokenizer.model" \
  || { echo "FAIL: export did not carry the data folder's tokenizer.model"; exit 1; }

# A tokenizer.json this reader does not follow is refused, naming the file and the key.
/usr/bin/python3 - "$work/unigram.json" <<'PY'
import json, sys
json.dump({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}, "pre_tokenizer": None,
           "decoder": None}, open(sys.argv[1], "w"))
PY
if "$cleave" generate "$ck" --prompt "x" --tokenizer "$work/unigram.json" > /dev/null 2> "$work/err"; then
  echo "FAIL: a Unigram tokenizer.json was accepted"; exit 1
fi
grep -q "tokenizer.json $work/unigram.json: model.type: \"Unigram\" is unsupported" "$work/err" \
  || { echo "FAIL: the refusal does not name the key:"; cat "$work/err"; exit 1; }
echo "generate, export and import used the checkpoint's tokenizer.json, then the data folder's tokenizer.model; --tokenizer took a file and a folder; a Unigram tokenizer.json was refused by its key"
