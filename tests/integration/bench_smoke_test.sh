#!/usr/bin/env bash
# Every benchmark (bench/*.sh) in its smoke mode (CLEAVE_BENCH_SMOKE=1: a tiny model, one round of
# a few steps; bench/common.sh) with this build's binary: each must finish and print its report,
# so a benchmark cannot rot between the runs that measure with it. The figures mean nothing.
# vs_pytorch, ddp_vs_pytorch and inference need the PyTorch peer at ../shared/peer beside the
# source folder (CI has it): where it is not, they are left out, and the test says so. inference
# also runs llama.cpp, installed from npm into the build folder as the GGUF
# test installs it, and leaves llama.cpp's columns empty, saying why, if the registry cannot be
# reached; serve drives cleave serve with the OpenAI client (installed from npm as
# serve_openai_test.sh installs it) and llama.cpp alike, and says so when it cannot install them.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cleave=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# bench name, then a pattern (grep -E) of its report's last table or ratio
checks=(
  "vs_pytorch ^fp32 +[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+x$"
  "ddp_vs_pytorch ^fp32 +[0-9]+ .*[0-9.]+x$"
  "tp ^fp32 +tp2-sp +[0-9.]+ +[0-9.]+ +[0-9.]+ "
  "pp ^pp 2: zbv (beats|does NOT beat) 1f1b"
  "cp ^ +cp2-ring +[0-9]+ MiB \+ [0-9.]+ MiB per token"
  "memory ^ZeRO-3 +-?[0-9]+ MiB predicted"
  "moe ^sigmoid_1e-2 +[0-9.]+ +[0-9.]+$"
  "precision ^fp8 +[0-9]+ +[0-9]+ +[0-9]+ MiB$"
  "tp_memory ^peak RSS/rank"
  "plan_accuracy ^pp 2 1f1b m4 +[0-9.]+ +[0-9.]+ +[-+][0-9.]+%  [0-9.]+$"
  "plan_search ^search [0-9.]+ s \(median wall time\)$"
  "inference ^bf16 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +>= 0.85$"
  "decode ^p99/p50, arithmetic on registers alone +[0-9.]+x$"
  "serve ^tp 2 +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9]+$|^cleave serve .*not measured: the npm registry"
)
# cleave bench-decode --spread-only (bench/serve.sh's floor) times the spread alone.
"$cleave" bench-decode --spread-only --seconds 0.02 --threads 2 > "$work/spread.log"
grep -qE "^arithmetic on registers alone +[0-9.]+ .*x +[0-9]+$" "$work/spread.log" &&
  ! grep -qE "^(Attention|The 48 products)" "$work/spread.log" ||
  { echo "FAIL: bench-decode --spread-only printed more or less than the spread"; cat "$work/spread.log"; exit 1; }
# cleave bench-comm --meetings-only times the meetings alone: three piece sizes, no table.
timeout 120 mpirun --oversubscribe -np 2 "$cleave" bench-comm --meetings-only --meeting-seconds 0.02 \
  > "$work/meetings.log" 2>&1 ||
  { echo "FAIL: bench-comm --meetings-only under mpirun"; cat "$work/meetings.log"; exit 1; }
[ "$(grep -cE '^ +[0-9.]+ +[0-9]+ +-?[0-9.]+ +-?[0-9.]+ +-?[0-9.]+x$' "$work/meetings.log")" = 3 ] &&
  ! grep -qE "^(bench-comm:|overlap)" "$work/meetings.log" ||
  { echo "FAIL: bench-comm --meetings-only printed more or less than the meetings"; cat "$work/meetings.log"; exit 1; }
peer=$(cd "$src/.." && pwd)/shared/peer
for c in "${checks[@]}"; do
  read -r name pattern <<<"$c"
  if [ ! -x "$peer/run_peer.sh" ] && grep -q "^need_peer" "$src/bench/$name.sh"; then
    echo "bench/$name.sh: left out, it needs the PyTorch peer at $peer"
    continue
  fi
  start=$SECONDS
  if ! CLEAVE_BENCH_SMOKE=1 CLEAVE="$cleave" timeout 300 bash "$src/bench/$name.sh" \
      > "$work/$name.log" 2>&1; then
    echo "FAIL: bench/$name.sh in smoke mode"; tail -30 "$work/$name.log"; exit 1
  fi
  if ! grep -Eq "$pattern" "$work/$name.log"; then
    echo "FAIL: bench/$name.sh printed no report line matching '$pattern'"; cat "$work/$name.log"; exit 1
  fi
  if grep -Eiq "division by zero|Traceback|not found|syntax error" "$work/$name.log"; then
    echo "FAIL: bench/$name.sh reported an error"; cat "$work/$name.log"; exit 1
  fi
  echo "bench/$name.sh: $((SECONDS - start)) s"
done
echo "every benchmark runs to its report in smoke mode"
