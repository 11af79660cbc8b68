#!/usr/bin/env bash
# cleave's inference (`cleave generate`, docs/inference.md) on a Llama of GPT-2 124M's shape
# (configs/gpt2_124m.toml with model.family=llama, vocab 4096: d_model 768, 12 layers, 12 heads),
# 2 threads, against llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU build, on the GGUF files
# cleave exports, bench/llama_cpp_bench.mjs) and PyTorch (bench/torch_generate.py: the model of
# tests/integration/torch_reference.py with a key/value cache, on the Hugging Face folder cleave
# exports; the faster of ../shared/peer/run_peer.sh's environments, installed and tuned). The
# model is trained one step on random tokens; a tokenizer is trained only for the GGUF files, which
# must carry one. Greedy everywhere, fp32 and bf16 weights (llama.cpp: the F32 and the BF16 GGUF;
# PyTorch: the weights cast to bfloat16). The programs alternate within each of REPEATS rounds;
# medians printed:
#   1. single-sequence decode tokens/s, 128 new tokens after an 8-token prompt (target: cleave
#      >= 1.5x llama.cpp);
#   2. prefill tokens/s of a 512-token prompt (the time to its first new token; target >= 1.5x);
#   3. batched decode, 4, 16 and 64 sequences of the short prompt, 64 new tokens each: cleave's
#      --batch N against llama.cpp's N sequences in one context, and against cleave's own
#      single-sequence decode (target at 16: >= 4x);
#   4. the roofline of single-sequence decode: STREAM triad bandwidth (../shared/peer/micro/stream.c,
#      2 threads, the median of its runs, measured each round) over the bytes a decoded token
#      reads: every product's weights (the linears and the LM head; 4 B each in fp32, 2 B in bf16,
#      as cleave's bf16 products read bf16 copies), the token's embedding row (fp32) and the
#      key/value cache (in the weights' dtype, cleave's default) at the decode's mean context;
#      cleave's fraction of it
#      (target >= 0.85).
# Targets are printed beside the figures; this is a report, not a gate. Also printed: whether the
# peers' greedy fp32 continuations are cleave's (the same work, not a faster other one).
# llama.cpp needs node-llama-cpp installed once into the build folder
# (tests/integration/node_llama_cpp/install.sh, shared with the GGUF test); when the npm registry
# cannot be reached, its columns are left empty, saying why. CLEAVE_BENCH_SMOKE=1
# (bench/common.sh): vocab 256, the tiny model, a 32-token prompt, 8 new tokens, batched at 4 only,
# one round, one PyTorch environment.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/inference.sh [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
source bench/common.sh
need_peer
vocab=4096 new=128 batch_new=64 long=512 batches="4 16 64" model=() modes="installed tuned"
stream_args=()  # stream.c's defaults: 80 M doubles per array, 10 runs
[ "$smoke" = 1 ] && vocab=256 new=8 batch_new=4 long=32 batches=4 model=("${tiny[@]}") \
  repeats=1 modes=installed stream_args=(2 3)
threads=2
dtypes="fp32 bf16"

# --- the model, its exports, and the peers' programs ---------------------------------------------
bench_model "$vocab" "$dtypes" "${model[@]}"
"$cleave" export "$work/run" "$work/hf" > /dev/null
gcc -O3 -march=native -fopenmp "$peer/micro/stream.c" -o "$work/stream"
npm_dir=$(cd "$(dirname "$cleave")" && pwd)/node_llama_cpp
llama_skip=""
export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true NODE_LLAMA_CPP_GPU=false
bash tests/integration/node_llama_cpp/install.sh "$npm_dir" > "$work/npm.log" 2>&1 || {
  rc=$?
  [ $rc = 77 ] || { cat "$work/npm.log"; exit 1; }
  llama_skip="llama.cpp not measured: the npm registry cannot be reached to install node-llama-cpp"
  echo "$llama_skip"
}

# Prompts of token ids (no tokenizer: the text does not matter): 8 tokens for decoding, $long for
# prefill.
ids() { awk -v n="$1" -v v="$vocab" 'BEGIN {for (i = 0; i < n; i++) printf "%d ", (7 * i + 11) % v}'; }
short=$(ids 8) prompt=$(ids "$long")

# --- one round's runs ------------------------------------------------------------------------------
declare -A results
add() { results[$1]+="$2 "; }
med() {  # KEY: the median of its figures, nothing if it has none (llama.cpp not measured)
  local v=${results[$1]:-}
  [ -n "${v// /}" ] || return 0
  tr ' ' '\n' <<<"$v" | grep . | median
}

rates() {  # the "prefill_tps decode_tps" of the last `# prefill: ...` line of a file
  sed -n 's/^# prefill: .*(\([0-9.]*\) tokens\/s); decode: .*(\([0-9.]*\) tokens\/s)$/\1 \2/p' "$1" | tail -1
}
cleave_run() {  # DTYPE PROMPT NEW BATCH -> prefill and decode tokens/s; its ids in $work/cleave.ids
  OMP_NUM_THREADS=$threads "$cleave" generate "$work/run" --prompt-ids "$2" --ids --temperature 0 \
    --max-new-tokens "$3" --batch "$4" --dtype "$1" --threads $threads --warmup \
    > "$work/cleave.ids" 2> "$work/cleave.err" || { cat "$work/cleave.err" >&2; return 1; }
  rates "$work/cleave.err"
}
cleave_round() {  # DTYPE
  local r
  r=$(cleave_run "$1" "$short" $new 1)
  add decode-cleave-$1 "${r#* }"
  head -1 "$work/cleave.ids" > "$work/cleave-$1.ids"
  r=$(cleave_run "$1" "$prompt" 1 1)
  add prefill-cleave-$1 "${r% *}"
  for b in $batches; do
    r=$(cleave_run "$1" "$short" $batch_new "$b")
    add batched$b-cleave-$1 "${r#* }"
  done
}
llama_round() {  # DTYPE: one llama.cpp process for the round's runs of this GGUF
  [ -z "$llama_skip" ] || return 0
  local spec out=$work/llama-$1.out
  spec=$(printf '{"decode": {"prompt": "%s", "tokens": %d}, "prefill": {"prompt": "%s"}, "batched": {"sequences": [%s], "prompt": "%s", "tokens": %d}}' \
    "$short" $new "$prompt" "$(tr ' ' ',' <<<"$batches")" "$short" $batch_new)
  node bench/llama_cpp_bench.mjs "$npm_dir" "$work/model-$1.gguf" $threads "$spec" > "$out"
  add decode-llama-$1 "$(awk '$1 == "decode" {print $4}' "$out")"
  add prefill-llama-$1 "$(awk '$1 == "prefill" {print $4}' "$out")"
  for b in $batches; do add batched$b-llama-$1 "$(awk -v b="$b" '$1 == "batched" && $2 == b {print $5}' "$out")"; done
  sed -n 's/^tokens //p' "$out" > "$work/llama-$1.ids"
}
torch_run() {  # MODE DTYPE PROMPT NEW: run_peer.sh's environment of MODE around torch_generate.py
  local env=()
  [ "$1" = tuned ] && env=(LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
    MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 OMP_WAIT_POLICY=PASSIVE)
  env "${env[@]}" OMP_NUM_THREADS=$threads /usr/bin/python3 bench/torch_generate.py "$work/hf" \
    --dtype "$2" --threads $threads --prompt-ids "$3" --max-new-tokens "$4" > "$work/torch.out"
  rates "$work/torch.out"
}
torch_round() {  # DTYPE
  local r mode
  for mode in $modes; do
    r=$(torch_run $mode "$1" "$short" $new)
    add decode-torch-$mode-$1 "${r#* }"
    sed -n 's/^tokens //p' "$work/torch.out" > "$work/torch-$1.ids"
    r=$(torch_run $mode "$1" "$prompt" 1)
    add prefill-torch-$mode-$1 "${r% *}"
  done
}
stream_round() {  # STREAM triad's median GB/s
  OMP_NUM_THREADS=$threads "$work/stream" "${stream_args[@]}" | awk '$1 == "triad" {print $6}'
}

for round in $(seq "$repeats"); do
  add stream "$(stream_round)"
  for dtype in $dtypes; do
    cleave_round $dtype
    llama_round $dtype
    torch_round $dtype
  done
  echo "round $round: cleave decode ${results[decode-cleave-fp32]}/ ${results[decode-cleave-bf16]}," \
    "llama.cpp ${results[decode-llama-fp32]:-}/ ${results[decode-llama-bf16]:-}, STREAM ${results[stream]}" >&2
done

# --- the report ---------------------------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b == 0) print "-"; else printf "%.2fx", a / b}'; }
num() { [ -n "$1" ] && printf "%.1f" "$1" || echo "-"; }
torch_best() {  # ROW DTYPE: the faster environment's median
  local m best=""
  for m in $modes; do best=$(awk -v a="$(med "$1-torch-$m-$2")" -v b="$best" 'BEGIN {print (b == "" || a > b) ? a : b}'); done
  echo "$best"
}
echo
echo "Llama, d_model $(sed -n 's/.*"hidden_size": \([0-9]*\).*/\1/p' "$work/hf/config.json"), $(sed -n 's/.*"num_hidden_layers": \([0-9]*\).*/\1/p' "$work/hf/config.json") layers, vocab $vocab; $threads threads; greedy; median tokens/s over $repeats rounds"
[ -z "$llama_skip" ] || echo "($llama_skip)"
printf "%-22s %-5s %9s %10s %8s %9s %8s   %s\n" row dtype cleave llama.cpp ratio torch ratio target
for row in decode prefill; do
  label="decode (8 + $new)"
  [ $row = prefill ] && label="prefill ($long tokens)"
  for dtype in $dtypes; do
    c=$(med $row-cleave-$dtype) l=$(med $row-llama-$dtype) t=$(torch_best $row $dtype)
    printf "%-22s %-5s %9s %10s %8s %9s %8s   %s\n" "$label" $dtype "$(num "$c")" "$(num "$l")" \
      "$(ratio "$c" "$l")" "$(num "$t")" "$(ratio "$c" "$t")" ">= 1.50x llama.cpp"
  done
done

echo
echo "batched decode: N sequences of the 8-token prompt, $batch_new new tokens each; tokens/s of all"
printf "%-5s %-5s %9s %10s %8s %13s   %s\n" seqs dtype cleave llama.cpp ratio "vs 1 seq" target
for b in $batches; do
  for dtype in $dtypes; do
    c=$(med batched$b-cleave-$dtype) l=$(med batched$b-llama-$dtype) one=$(med decode-cleave-$dtype)
    target="-"
    [ "$b" = 16 ] && target=">= 4x cleave's 1 seq"
    printf "%-5s %-5s %9s %10s %8s %13s   %s\n" "$b" $dtype "$(num "$c")" "$(num "$l")" \
      "$(ratio "$c" "$l")" "$(ratio "$c" "$one")" "$target"
  done
done

# Bytes a decoded token reads, from the exported config: the products' weights (q, k, v, o, the
# three MLP matrices per layer, and the LM head), the embedding row, and the cache's keys and
# values (WEIGHT_BYTES each, as cleave keeps them) in every layer at the mean context (prompt +
# new / 2).
bytes() {  # WEIGHT_BYTES
  /usr/bin/python3 - "$work/hf/config.json" "$1" "$(( $(wc -w <<<"$short") + new / 2 ))" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
width, context = int(sys.argv[2]), int(sys.argv[3])
d, L, V, F = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
H = c["num_attention_heads"]
kv = c.get("num_key_value_heads", H) * (d // H)
products = L * (d * d + 2 * d * kv + d * d + 3 * d * F) + V * d
print(width * products + 4 * d + context * L * 2 * kv * width)
PY
}
stream=$(med stream)
echo
echo "roofline of single-sequence decode: STREAM triad $(num "$stream") GB/s ($threads threads, median), bytes per token at a mean context of $(( $(wc -w <<<"$short") + new / 2 )) tokens"
printf "%-5s %10s %15s %9s %9s   %s\n" dtype MB/token "roofline tok/s" cleave fraction target
for dtype in $dtypes; do
  b=$(bytes "$([ $dtype = fp32 ] && echo 4 || echo 2)") c=$(med decode-cleave-$dtype)
  awk -v d=$dtype -v b="$b" -v s="$stream" -v c="$c" 'BEGIN {
    r = s * 1e9 / b; printf "%-5s %10.1f %15.1f %9.1f %9.2f   >= 0.85\n", d, b / 1e6, r, c, c / r }'
done

same() { [ -s "$1" ] && [ -s "$2" ] && { cmp -s "$1" "$2" && echo yes || echo no; } || echo "-"; }
echo
echo "greedy fp32 continuation (8-token prompt) the same as cleave's: llama.cpp" \
  "$(same "$work/cleave-fp32.ids" "$work/llama-fp32.ids"), PyTorch $(same "$work/cleave-fp32.ids" "$work/torch-fp32.ids")"
