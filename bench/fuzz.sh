#!/usr/bin/env bash
# A longer fuzz campaign than the suite's smoke run: each reader of outside input (tests/fuzz) for
# SECONDS (default 300), one after another on one core. The inputs that reached new code are kept
# in build/fuzz/campaign/<reader>/, so a second campaign goes on from where the first stopped; a
# finding stops the reader's run and leaves its input in build/fuzz/findings/<reader>/ (fix it, then
# add the input to tests/fuzz/corpus/<reader>/ as a regression case). Each campaign draws its own
# seed (the smoke run's is fixed). Builds the targets first.
# Usage: bench/fuzz.sh [SECONDS=300] [READER ...]   (readers: the tests/fuzz/*_fuzz.cpp names)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
shift || true
readers=("$@")
if [ ${#readers[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cpp; do readers+=("$(basename "$f" _fuzz.cpp)"); done
fi
cmake --build build --target fuzz_targets -j2 >/dev/null
failed=()
for r in "${readers[@]}"; do
  echo "== $r: ${seconds}s"
  mkdir -p "build/fuzz/campaign/$r"
  FUZZ_SEED=0 tests/fuzz/run.sh build/fuzz . "$r" "$seconds" "build/fuzz/campaign/$r" || failed+=("$r")
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz.sh: findings in ${failed[*]}"; exit 1; }
echo "fuzz.sh: no finding in ${readers[*]} (${seconds}s each)"
