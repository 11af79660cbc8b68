#!/usr/bin/env bash
# Fuzzes one reader for SECONDS: first every input of tests/fuzz/corpus/READER (seeds and the
# regression cases of past findings), then new inputs mutated from them and from the words of
# tests/fuzz/READER.dict.
# Usage: tests/fuzz/run.sh FUZZ_BUILD_DIR SOURCE_DIR READER SECONDS [KEEP_DIR]
#   FUZZ_BUILD_DIR: where fuzz_READER was built (<build>/fuzz).
#   KEEP_DIR: a folder where the inputs found to reach new code are kept across runs (bench/fuzz.sh);
#     without it they live in a temporary folder and the committed corpus is never written.
# A finding (crash, sanitizer report, uncaught exception, leak, an input taking over 10 s or 2 GB)
# fails the run, and its input is kept in FUZZ_BUILD_DIR/findings/READER/. FUZZ_SEED (default 1)
# seeds the mutations: fixed, a smoke run's first inputs are the same each time; 0 picks one.
set -euo pipefail
build=$1 src=$2 reader=$3 seconds=$4 keep=${5:-}
fuzzer=$build/fuzz_$reader
seeds=$src/tests/fuzz/corpus/$reader
if [ ! -x "$fuzzer" ]; then
  echo "fuzz $reader: $fuzzer is not built (cmake --build the main build: it builds tests/fuzz with clang)"
  exit 1
fi
[ -d "$seeds" ] || { echo "fuzz $reader: no seed corpus at $seeds"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=${keep:-$work/corpus}
findings=$build/findings/$reader
mkdir -p "$corpus" "$findings"
dict=()
[ ! -f "$src/tests/fuzz/$reader.dict" ] || dict=(-dict="$src/tests/fuzz/$reader.dict")
# The targets' scratch files go into $work, which is removed even after a crash.
export TMPDIR=$work
if ! "$fuzzer" -seed="${FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
     -artifact_prefix="$findings/" -print_final_stats=1 "${dict[@]}" "$corpus" "$seeds" > "$work/log" 2>&1; then
  tail -n 60 "$work/log"
  echo "fuzz $reader: FAILED; the input is in $findings/ (see above). Once fixed, add it to"
  echo "  tests/fuzz/corpus/$reader/ as a regression case."
  exit 1
fi
grep -E '^(INFO: seed corpus|stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' \
  "$work/log" || true
echo "fuzz $reader: no finding in ${seconds}s ($(find "$seeds" -type f | wc -l) corpus inputs replayed first)"
