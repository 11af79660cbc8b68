#!/usr/bin/env bash
# `cleave serve` (docs/serving.md) under load, on the Llama of GPT-2 124M's shape bench/inference.sh
# measures (bench/common.sh's bench_model: vocab 4096, one training step on random tokens; its
# model.max_seq_len raised to 2048, which a Llama holds no weights for, so that a 1,024-token
# prompt fits), fp32 weights (SERVE_DTYPE=bf16: bf16), on one process (2 OpenMP threads) and at
# tp 2 (mpirun -np 2, 1 thread each), against llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU build
# on the GGUF cleave exports, F32 or BF16 as cleave's weights, bench/llama_cpp_bench.mjs's "serve"
# part: in process, one context of as many sequences as clients). The clients are
# bench/serve_load.mjs: the official OpenAI client (npm openai 5.23.2,
# tests/integration/openai_client/install.sh) in one Node process, each request a streamed
# /v1/completions of token ids at temperature 0.8 with a seed. Printed, medians over REPEATS
# rounds (the programs alternate within a round):
#   1. at 1, 4, 16 and 64 concurrent clients, each sending requests back to back from a seeded mix
#      (prompts of 16-512 tokens, outputs of 16-256, log-uniform; a fixed number of requests per
#      level, the same requests for every program): throughput (new tokens/s of all clients), time
#      to first token p50, per-token latency (the gaps between a stream's successive tokens) p50
#      and p99; cleave's steps (/metrics) give its rows per forward and its time per step. Targets:
#      at 16 clients throughput >= 4x cleave's single client and >= llama.cpp's; the gaps' p99
#      within 2x of their p50.
#   2. a long prompt among running requests (one process): 16 clients decoding, then a 1,000-token
#      prompt sent (3 times a round); the running streams' gaps p50 and p99 in the second before it
#      and during its prefill (until its first token), its time to first token, and the steps its
#      prefill took; at serve.step_tokens 512 and 128 (the default).
#   3. serve.max_step_ratio (one process): the 1- and 16-client levels again with the ratio off
#      (0: prompts fill every step to the budget) beside the default (2), its throughput, time to
#      first token and gaps.
#   4. prefix caching (one process and tp 2): time to first token of a 1,024-token prompt cold, and
#      of one whose first 1,000 tokens are an earlier request's (3 pairs a round), and the tokens
#      /metrics' cleave_prefix_cached_tokens_total says were shared (whole 64-token blocks: 960).
#   5. the machine's own floor for the gap target (every round, SERVE_LEVELS_ONLY too): the p99/p50
#      of arithmetic on registers alone, each run as long as the 48 bf16 products of a 16-row
#      decoding step (`cleave bench-decode --spread-only`, bench/decode.sh), which no server,
#      memory or lock of ours can lengthen.
# The pool (serve.kv_cache_mb) holds every client's longest request at 64 clients, as llama.cpp's
# context does (C sequences of 768 tokens): no queueing or preemption for want of blocks.
# A report, not a gate. Needs node and npm; the npm packages are installed once into the build
# folder (the OpenAI client as serve_openai_test.sh does, node-llama-cpp as the GGUF test does);
# when the registry cannot be reached, what needs them is left out, saying why.
# CLEAVE_BENCH_SMOKE=1 (bench/common.sh): vocab 256, the tiny model, levels 1 and 4 of a few short
# requests, one long-prompt cycle and one prefix pair of short prompts, one round.
# SERVE_LEVELS_ONLY=1 serves part 1 alone, one process (no long prompt, prefix, ratio-off, tp 2
# or llama.cpp runs: a few minutes, to compare builds or settings); SERVE_LEVELS and SERVE_COUNTS
# replace the levels and their requests (e.g. "1 16 64" and "8 48 192"), SERVE_SET adds settings
# to the one-process server (e.g. "--set serve.max_step_ratio=0").
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] [SERVE_DTYPE=fp32|bf16] [SERVE_LEVELS_ONLY=1
#        [SERVE_LEVELS=...] [SERVE_COUNTS=...] [SERVE_SET=...]] bench/serve.sh [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
source bench/common.sh
threads=2 vocab=4096 model=() key=bench-key dtype=${SERVE_DTYPE:-fp32}
case $dtype in fp32 | bf16) ;; *) echo "SERVE_DTYPE must be fp32 or bf16, not '$dtype'" >&2; exit 2 ;; esac
levels=${SERVE_LEVELS:-"1 4 16 64"} counts=${SERVE_COUNTS:-"8 16 48 192"} levels_only=${SERVE_LEVELS_ONLY:-0}
prompt="16, 512" output="16, 256" temperature=0.8
interference_clients=16 interference_prompt=16 long=1000 cycles=3 before_ms=1000 budgets="128 512" default_budget=128
ratio_levels="1 16" ratio_counts="8 48" default_ratio=2
prefix_tokens=1024 shared=1000 pairs=3 floor_seconds=2
kv_mb=3600  # 64 clients x 12 blocks of 64 tokens (512 + 256) x 4.5 MiB (fp32 keys and values,
            # in either dtype; 12 layers, d 768)
warmup_clients=16 warmup_requests=32
if [ "$smoke" = 1 ]; then
  vocab=256 model=("${tiny[@]}") levels="1 4" counts="2 4" prompt="8, 64" output="4, 16" repeats=1
  interference_clients=4 long=100 cycles=1 before_ms=200 prefix_tokens=160 shared=130 pairs=1
  kv_mb=64 warmup_clients=2 warmup_requests=2 ratio_levels="1 4" ratio_counts="2 4" floor_seconds=0.05
fi
context=$(( ${prompt#*, } + ${output#*, } ))

bench_model "$vocab" "$dtype" "${model[@]}" --set model.max_seq_len=2048
build=$(cd "$(dirname "$cleave")" && pwd)
openai_dir=$build/openai_client llama_dir=$build/node_llama_cpp
openai_skip="" llama_skip=""
export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true NODE_LLAMA_CPP_GPU=false
install() {  # SCRIPT DIR WHAT: "" if installed, else why not
  local rc=0
  bash "tests/integration/$1/install.sh" "$2" > "$work/npm-$1.log" 2>&1 || rc=$?
  [ $rc = 0 ] && return 0
  [ $rc = 77 ] || { cat "$work/npm-$1.log" >&2; exit 1; }
  echo "$3 not measured: the npm registry cannot be reached to install it"
}
openai_skip=$(install openai_client "$openai_dir" "cleave serve (its clients need the OpenAI client)")
llama_skip=$(install node_llama_cpp "$llama_dir" "llama.cpp (node-llama-cpp)")
if [ -n "$openai_skip" ]; then echo "$openai_skip"; exit 0; fi
[ -z "$llama_skip" ] || echo "$llama_skip"

mix() {  # the request mix: SEED
  printf '{"seed": %d, "vocab": %d, "prompt": [%s], "output": [%s], "temperature": %s}' \
    "$1" "$vocab" "$prompt" "$output" "$temperature"
}
list() { tr ' ' ',' <<<"$1"; }
levels_spec=$(printf '"levels": {"clients": [%s], "requests": [%s], "mix": %s}' "$(list "$levels")" "$(list "$counts")" "$(mix 1)")
warmup_spec=$(printf '"warmup": {"clients": %d, "requests": %d, "mix": %s}' $warmup_clients $warmup_requests \
  "$(mix 2 | sed 's/"output": \[[0-9, ]*\]/"output": [4, 16]/')")
interference_spec() {
  printf '"interference": {"clients": %d, "prompt": %d, "long": %d, "cycles": %d, "before_ms": %d, "mix": %s}' \
    $interference_clients $interference_prompt $long $cycles $before_ms "$(mix 3)"
}
prefix_spec=$(printf '"prefix": {"tokens": %d, "shared": %d, "pairs": %d, "mix": %s}' $prefix_tokens $shared $pairs "$(mix 4)")

# --- the servers -----------------------------------------------------------------------------------
pid="" server=""
trap '[ -z "$pid" ] || { kill -TERM "$pid" 2> /dev/null; sleep 1; kill -9 "$pid" 2> /dev/null; } || true; rm -rf "$work"' EXIT
pids=() start_seconds=120
# start LOG COMMAND...: a server in the background; sets pid, server (the serving rank) and base
# shellcheck source=tests/integration/serve_start.sh
source tests/integration/serve_start.sh
stop() {  # LOG: SIGTERM drains it; under mpirun, mpirun exits 1 as for any signalled job
  local rc=0 alone=0
  [ "$server" = "$pid" ] && alone=1
  kill -TERM "$server"
  wait "$pid" || rc=$?
  pid=""
  # A one-process server exits 0 after its drain: anything else (an abort at exit) is a defect,
  # reported though its figures stand.
  [ "$alone" = 0 ] || [ "$rc" = 0 ] || { echo "WARNING: the server of $1 exited $rc after its drain:" >&2; tail -30 "$1" >&2; }
}
serve_tp1() {  # LOG [--set ...]
  local log=$1
  shift
  start "$log" env OMP_NUM_THREADS=$threads "$cleave" serve "$work/run" --port 0 --api-key $key \
    --model-name bench --threads $threads --tokenizer "$work/tok/tokenizer.model" --dtype "$dtype" \
    --set serve.kv_cache_mb=$kv_mb "$@"
}
serve_tp2() {  # LOG
  start "$1" env OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 "$cleave" serve "$work/run" --port 0 \
    --api-key $key --model-name bench --threads 1 --tokenizer "$work/tok/tokenizer.model" \
    --dtype "$dtype" --set parallel.tp=2 --set serve.kv_cache_mb=$(( kv_mb / 2 ))
}
load() {  # OUT SPEC_PARTS: the clients against the running server
  node bench/serve_load.mjs "$openai_dir" "$base" $key bench "{$2}" > "$1"
}

# --- one round's runs ------------------------------------------------------------------------------
declare -A results
add() { results[$1]+="$2 "; }
med() {  # KEY: the median of its figures, nothing if it has none
  local v
  v=$(tr ' ' '\n' <<<"${results[$1]:-}" | grep -E '^-?[0-9.]+$' || true)
  [ -z "$v" ] || median <<<"$v"
}
levels_of() {  # PROGRAM OUT: its level lines
  local c n tokens s tps ttft p50 p99 steps prompts
  while read -r _ c n tokens s tps ttft p50 p99 steps prompts; do
    add tps-$1-$c "$tps"; add ttft-$1-$c "$ttft"; add p50-$1-$c "$p50"; add p99-$1-$c "$p99"
    add tokens-$1-$c "$tokens"
    [ "$steps" = - ] || {
      add rows-$1-$c "$(awk -v a="$tokens" -v b="$prompts" -v s="$steps" 'BEGIN {printf "%.1f", (a + b) / s}')"
      add stepms-$1-$c "$(awk -v t="$s" -v s="$steps" 'BEGIN {printf "%.1f", 1e3 * t / s}')"
    }
  done < <(grep '^level ' "$2")
}
prefix_of() {  # PROGRAM OUT
  local cold warm tokens
  read -r _ cold warm tokens < <(grep '^prefix ' "$2")
  add cold-$1 "$cold"; add warm-$1 "$warm"; add shared-$1 "$tokens"
}
cleave_round() {
  local out=$work/cleave.out
  # shellcheck disable=SC2086  # SERVE_SET is a list of arguments
  serve_tp1 "$work/serve-tp1.log" ${SERVE_SET:-}
  if [ "$levels_only" = 1 ]; then
    load "$out" "$warmup_spec, $levels_spec"
  else
    load "$out" "$warmup_spec, $levels_spec, $(interference_spec), $prefix_spec"
  fi
  stop "$work/serve-tp1.log"
  levels_of cleave "$out"
  [ "$levels_only" = 1 ] && return
  prefix_of cleave "$out"
  interference_of "$default_budget" "$out"
}
interference_of() {  # BUDGET OUT
  local b50 b99 d50 d99 ttft steps
  read -r _ b50 b99 d50 d99 ttft steps < <(grep '^interference ' "$2")
  add ib50-$1 "$b50"; add ib99-$1 "$b99"; add id50-$1 "$d50"; add id99-$1 "$d99"
  add ittft-$1 "$ttft"; add isteps-$1 "$steps"
}
ratio_round() {  # the ratio off: the ratio levels, and the long prompt
  local out=$work/ratio.out
  serve_tp1 "$work/serve-ratio.log" --set serve.max_step_ratio=0
  load "$out" "$warmup_spec, $(printf '"levels": {"clients": [%s], "requests": [%s], "mix": %s}' \
    "$(list "$ratio_levels")" "$(list "$ratio_counts")" "$(mix 1)"), $(interference_spec)"
  stop "$work/serve-ratio.log"
  levels_of ratio0 "$out"
  interference_of ratio0 "$out"
}
budget_round() {  # BUDGET: the long prompt at another step budget
  local out=$work/budget.out
  serve_tp1 "$work/serve-budget.log" --set serve.step_tokens="$1"
  load "$out" "$warmup_spec, $(interference_spec)"
  stop "$work/serve-budget.log"
  interference_of "$1" "$out"
}
tp2_round() {
  local out=$work/tp2.out
  serve_tp2 "$work/serve-tp2.log"
  load "$out" "$warmup_spec, $levels_spec, $prefix_spec"
  stop "$work/serve-tp2.log"
  levels_of tp2 "$out"
  prefix_of tp2 "$out"
}
llama_round() {
  [ -z "$llama_skip" ] || return 0
  local out=$work/llama.out
  node bench/llama_cpp_bench.mjs "$llama_dir" "$work/model-$dtype.gguf" $threads \
    "{\"serve\": {\"clients\": [$(list "$levels")], \"requests\": [$(list "$counts")], \"mix\": $(mix 1), \"context\": $context}}" \
    > "$out"
  levels_of llama "$out"
}
floor_round() {  # the machine's own p99/p50 on work that waits on nothing (`cleave bench-decode`)
  OMP_NUM_THREADS=$threads "$cleave" bench-decode --spread-only --seconds "$floor_seconds" \
    --threads $threads > "$work/floor.out"
  add floor "$(awk '/^arithmetic on registers alone/ {sub("x$", "", $9); print $9}' "$work/floor.out")"
}

for round in $(seq "$repeats"); do
  start_s=$SECONDS
  cleave_round
  if [ "$levels_only" != 1 ]; then
    for b in $budgets; do [ "$b" = "$default_budget" ] || budget_round "$b"; done
    ratio_round
    tp2_round
    llama_round
  fi
  floor_round
  top=${levels##* }
  echo "round $round ($((SECONDS - start_s)) s): tokens/s at $top clients: cleave ${results[tps-cleave-$top]}/" \
    "tp 2 ${results[tps-tp2-$top]:-}/ llama.cpp ${results[tps-llama-$top]:-}" >&2
done

# --- the report ---------------------------------------------------------------------------------
num() { [ -n "$1" ] && printf "%.1f" "$1" || echo "-"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b == 0) print "-"; else printf "%.2fx", a / b}'; }
verdict() {  # VALUE OP LIMIT
  awk -v a="$1" -v l="$3" -v op="$2" 'BEGIN {
    if (a == "" || l == "") { print "-"; exit }
    ok = (op == ">=") ? a >= l : a <= l; print ok ? "met" : "MISSED" }'
}
echo
head -2 "$work/serve-tp1.log" | sed 's/^# serve: /server: /'
echo "$([ "$smoke" = 1 ] && echo "the tiny model" || echo "a Llama of GPT-2 124M's shape"), vocab $vocab, $dtype;" \
  "requests: prompts of ${prompt/, /-} tokens, outputs of ${output/, /-}, temperature $temperature; medians over $repeats round(s)"
[ -z "$llama_skip" ] || echo "($llama_skip)"
echo
echo "throughput and latency under concurrent clients (ms; tok/s: new tokens of all clients;" \
  "rows/step and ms/step: cleave's forward steps)"
printf "%-8s %-10s %9s %9s %9s %9s %8s %9s %9s %9s\n" clients program requests "tok/s" "ttft p50" \
  "gap p50" "gap p99" "p99/p50" rows/step ms/step
set -- $counts
for c in $levels; do
  for p in cleave tp2 llama; do
    name=$p
    [ $p = cleave ] && name="1 process" || { [ $p = tp2 ] && name="tp 2" || name="llama.cpp"; }
    t=$(med tps-$p-$c)
    [ -n "$t" ] || { [ $p = llama ] && continue; }
    printf "%-8s %-10s %9s %9s %9s %9s %8s %9s %9s %9s\n" "$c" "$name" "$1" "$(num "$t")" \
      "$(num "$(med ttft-$p-$c)")" "$(num "$(med p50-$p-$c)")" "$(num "$(med p99-$p-$c)")" \
      "$(ratio "$(med p99-$p-$c)" "$(med p50-$p-$c)")" "$(num "$(med rows-$p-$c)")" "$(num "$(med stepms-$p-$c)")"
  done
  shift
done

at=16
[ "$smoke" = 1 ] && at=4
echo
echo "targets at $at clients:"
printf "%-10s %-34s %9s %9s   %s\n" program target figure limit ""
for p in cleave tp2; do
  name="1 process"
  [ $p = tp2 ] && name="tp 2"
  t=$(med tps-$p-$at) one=$(med tps-$p-1) l=$(med tps-llama-$at)
  printf "%-10s %-34s %9s %9s   %s\n" "$name" "tok/s >= 4x its single client" "$(ratio "$t" "$one")" 4.00x \
    "$(verdict "$(awk -v a="$t" -v b="$one" 'BEGIN {if (b > 0) print a / b}')" ">=" 4)"
  printf "%-10s %-34s %9s %9s   %s\n" "$name" "tok/s >= llama.cpp's" "$(ratio "$t" "$l")" 1.00x \
    "$(verdict "$(awk -v a="$t" -v b="$l" 'BEGIN {if (b > 0) print a / b}')" ">=" 1)"
  p50=$(med p50-$p-$at) p99=$(med p99-$p-$at)
  printf "%-10s %-34s %9s %9s   %s\n" "$name" "gap p99 <= 2x gap p50" "$(ratio "$p99" "$p50")" 2.00x \
    "$(verdict "$(awk -v a="$p99" -v b="$p50" 'BEGIN {if (b > 0) print a / b}')" "<=" 2)"
done
echo "the machine's own p99/p50 on arithmetic that waits on nothing (cleave bench-decode, runs as" \
  "long as a 16-row step's products): $(med floor)x; a gap target below it cannot be told from the machine"

echo
echo "a $long-token prompt among $interference_clients decoding clients (1 process): the running streams' gaps (ms)" \
  "in the ${before_ms} ms before it and during its prefill; steps: the server's, from its sending to its first token"
printf "%-12s %11s %11s %11s %11s %10s %6s\n" step_tokens "before p50" "before p99" "during p50" \
  "during p99" "its ttft" steps
for b in $budgets; do
  printf "%-12s %11s %11s %11s %11s %10s %6s\n" "$b" "$(num "$(med ib50-$b)")" "$(num "$(med ib99-$b)")" \
    "$(num "$(med id50-$b)")" "$(num "$(med id99-$b)")" "$(num "$(med ittft-$b)")" "$(num "$(med isteps-$b)")"
done

echo
echo "serve.max_step_ratio (1 process; the long prompt as above, at step_tokens $default_budget):"
printf "%-6s %-8s %9s %9s %9s %9s %8s %17s %17s\n" ratio clients "tok/s" "ttft p50" "gap p50" "gap p99" \
  "p99/p50" "long: during p99" "long: its ttft"
for r in $default_ratio 0; do
  p=cleave ib=$default_budget
  [ "$r" = 0 ] && p=ratio0 ib=ratio0
  for c in $ratio_levels; do
    printf "%-6s %-8s %9s %9s %9s %9s %8s %17s %17s\n" "$r" "$c" "$(num "$(med tps-$p-$c)")" \
      "$(num "$(med ttft-$p-$c)")" "$(num "$(med p50-$p-$c)")" "$(num "$(med p99-$p-$c)")" \
      "$(ratio "$(med p99-$p-$c)" "$(med p50-$p-$c)")" "$(num "$(med id99-$ib)")" "$(num "$(med ittft-$ib)")"
  done
done

echo
echo "prefix caching: time to first token (ms) of a $prefix_tokens-token prompt, cold and with its first" \
  "$shared tokens an earlier request's"
printf "%-10s %9s %9s %8s %15s\n" program cold shared speedup "tokens shared"
for p in cleave tp2; do
  name="1 process"
  [ $p = tp2 ] && name="tp 2"
  printf "%-10s %9s %9s %8s %15s\n" "$name" "$(num "$(med cold-$p)")" "$(num "$(med warm-$p)")" \
    "$(ratio "$(med cold-$p)" "$(med warm-$p)")" "$(med shared-$p)"
done
