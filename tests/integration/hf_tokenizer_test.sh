#!/usr/bin/env bash
# cleave's tokenizer.json reader against Hugging Face's own tokenizer in JavaScript
# (transformers.js, pinned by transformers_js/package-lock.json): GPT-2's and Llama 3's real
# vocabularies (assembled from the files of two npm packages, hf_tokenizer_files.py) and a GPT-2
# variant (prefix space, merges as pairs, a non-special added token) encode about 4,000 texts
# (corpus lines and paragraphs, hand-written hard cases, random mixes of scripts, digits, spaces
# and emoji, special tokens) to the same ids, with and without the template, and decode them to
# the same text; cleave's decode(encode(x)) is x.
# The npm packages are installed once into the build folder (npm ci from the lock) and kept; a
# registry that cannot be reached skips the test (exit 77), a missing node or npm fails it.
set -euo pipefail
cleave=$1 src=$2 data=$3
here=$src/tests/integration
tool=$(dirname "$cleave")/tests/tokenize_lines
npm_dir=$(dirname "$data")/transformers_js
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command -v node > /dev/null && command -v npm > /dev/null \
  || { echo "FAIL: node and npm are needed (setup.sh installs them)"; exit 1; }
lock=$(sha256sum < "$here/transformers_js/package-lock.json")
if [ "$(cat "$npm_dir/.installed" 2>/dev/null)" != "$lock" ]; then
  if ! timeout 30 npm ping > /dev/null 2>&1; then
    echo "SKIP: the npm registry cannot be reached to install transformers.js"; exit 77
  fi
  rm -rf "$npm_dir" && mkdir -p "$npm_dir"
  cp "$here/transformers_js/package.json" "$here/transformers_js/package-lock.json" "$npm_dir/"
  # No install scripts: onnxruntime-node's would fetch GPU libraries; its CPU build ships within.
  (cd "$npm_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  echo "$lock" > "$npm_dir/.installed"
fi

/usr/bin/python3 "$here/hf_tokenizer_files.py" tokenizers "$npm_dir" "$work"
/usr/bin/python3 "$here/hf_tokenizer_files.py" texts "$work/texts.jsonl" \
  "$data/corpus.txt" "$src/data/fortunes.txt"
for name in gpt2 gpt2-prefix llama3; do
  roundtrip=--roundtrip
  [ $name = gpt2-prefix ] && roundtrip=  # the prefix space comes back with the text
  "$tool" "$work/$name/tokenizer.json" "$work/texts.jsonl" "$work/$name.cleave.jsonl" $roundtrip
  node "$here/transformers_js/encode.mjs" "$npm_dir" "$work/$name" "$work/texts.jsonl" \
    "$work/$name.js.jsonl"
  /usr/bin/python3 "$here/hf_tokenizer_files.py" compare $name "$work/texts.jsonl" \
    "$work/$name.cleave.jsonl" "$work/$name.js.jsonl"
done
