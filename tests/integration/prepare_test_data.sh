#!/usr/bin/env bash
# Fixture: tokenizes a 300 KB corpus with a 256-piece vocabulary into $3 for the other tests.
# The corpus is the head of tinyshakespeare (../shared) when present, else of the fortunes corpus.
set -euo pipefail
cleave=$1 src=$2 out=$3
corpus=$src/../shared/data/tinyshakespeare.txt
[ -f "$corpus" ] || corpus=$src/data/fortunes.txt
mkdir -p "$out"
head -c 300000 "$corpus" > "$out/corpus.txt"
"$cleave" tokenize "$src/tests/configs/tiny_train.toml" --set data.corpus="$out/corpus.txt" \
  --set data.dir="$out"
for f in tokenizer.model train.bin val.bin; do [ -s "$out/$f" ] || { echo "missing $out/$f"; exit 1; }; done
