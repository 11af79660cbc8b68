#!/usr/bin/env bash
# Fixture: tokenizes a 300 KB corpus with a 256-piece vocabulary into $3 for the other tests.
# The corpus is the same on every machine: the head of prose fortune files of Debian's fortunes
# package (setup.sh installs it), one document per fortune. The layout tests' tolerances hold for
# the runs this text gives; another text (../shared's tinyshakespeare where it is at hand, or the
# head of data/fortunes.txt, whose ASCII art and TV listings spike a tiny model's gradients within
# 20 steps) would test other numbers than a fresh machine tests.
set -euo pipefail
cleave=$1 src=$2 out=$3
fortunes=/usr/share/games/fortunes
files=(fortunes wisdom humorists literature people platitudes science)
for f in "${files[@]}"; do
  [ -s "$fortunes/$f" ] || { echo "missing $fortunes/$f: ./setup.sh installs Debian's fortunes"; exit 1; }
done
mkdir -p "$out"
# (the files outlast the 300 KB: a pipe into head would end sed with SIGPIPE, failing pipefail)
head -c 300000 < <(cd "$fortunes" && sed 's/^%$//' "${files[@]}") > "$out/corpus.txt"
"$cleave" tokenize "$src/tests/configs/tiny_train.toml" --set data.corpus="$out/corpus.txt" \
  --set data.dir="$out"
for f in tokenizer.model train.bin val.bin; do [ -s "$out/$f" ] || { echo "missing $out/$f"; exit 1; }; done
