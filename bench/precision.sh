#!/usr/bin/env bash
# Precision and memory (issue 20), printed, not a CI gate. One process, 2 threads, one benchmark
# at a time.
#  1. Each dtype and FP8 recipe on GPT-2 124M's shape (configs/gpt2_124m.toml, vocab 8192, random
#     tokens): median tokens/s and MFU of the steps after the first two, peak RSS.
#  2. Loss parity on real text: configs/llama_small.toml on ../shared/data/tinyshakespeare.txt
#     (its own 4096-piece tokenizer), STEPS steps per dtype from the same seed: the final training
#     loss (the median of the last 5 logged) and validation loss, each against fp32's and bf16's.
#     Targets: bf16 within 2% of fp32, each FP8 recipe within 1% of bf16.
#  3. Activation memory on configs/llama_long.toml with 8 layers at 2048 tokens: peak RSS of each
#     checkpointing mode and of the chunked loss, against what the saved buffers predict. Per
#     token a Llama block keeps x_mid, h1, h2 and o (d each), q|k|v (d + 2 kv_dim), the
#     log-sum-exps (heads), fc (2 ffn) and the activation (ffn); selective frees h1, h2 and the
#     activation, full all of it (the block's input is the previous block's output, kept
#     anyway), except in the block whose backward runs. The chunked loss keeps C of the T rows of
#     logits (their gradient overwrites them). Target: within 10%.
#  4. Offload on a 57M-parameter GPT-2 (d_model 768, 8 layers) at 512 tokens per step: peak RSS
#     and step time of the moments offloaded, and of ZeRO-3's shards too, against in memory.
#  5. What FP8 saves: (a) llama_long as in 3, bf16 against fp8 (delayed): peak RSS, against the
#     saved operand copies' bytes (x of qkv, of the output projection and of the MLP, d each,
#     and the activation, ffn: 2 bytes each in bf16, 1 in FP8, per token and block); (b) the
#     GPT-2 of 4 on 2 ranks under ZeRO-3 (1 thread each), fp8 delayed with fp32 and with FP8
#     parameter gathers: bytes per step each rank sends into the gathers, step time.
# CLEAVE_BENCH_SMOKE=1 (bench/common.sh): vocab 256 everywhere (the parity corpus its first 100 KB),
# the tiny model (2 layers in 3. and 5a. at 128 tokens, 4 x 32 tokens a step in 4. and 5b.), 3
# steps a run, the dtypes fp32, bf16, fp16 and fp8-delayed.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/precision.sh [STEPS=300]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
source bench/common.sh
vocab=8192 speed_steps=8 model=() text_model=() corpus_bytes=0
layers=8 seq=2048 chunk=256 wide_seq=64 wide_batch=8
if [ "$smoke" = 1 ]; then
  steps=3 vocab=256 speed_steps=3 model=("${tiny[@]}" --set model.vocab_size=256) corpus_bytes=100000
  text_model=("${model[@]}") layers=2 seq=128 chunk=32 wide_seq=32 wide_batch=4
fi
mkdir -p "$work/random" "$work/text"
/usr/bin/python3 bench/random_tokens.py "$work/random" "$vocab" 2000000

field() { grep "\"$2\"" "$1/metrics.jsonl" | tail -n +3 | sed "s/.*\"$2\":\([^,}]*\).*/\1/" | median; }
last() { grep "\"$2\"" "$1/metrics.jsonl" | tail -n "${3:-1}" | sed "s/.*\"$2\":\([^,}]*\).*/\1/" | median; }
rss() { grep -o '"peak_rss_mib":[0-9.]*' "$1/metrics.jsonl" | tail -1 | cut -d: -f2; }
train() {  # name config [--set ...]
  local name=$1 cfg=$2; shift 2
  OMP_NUM_THREADS=2 "$cleave" train "$cfg" "${model[@]}" --set train.threads=2 --set train.out_dir="$work/$name" \
    --set train.checkpoint_interval=-1 --set train.log_interval=1 "$@" > "$work/$name.log" 2>&1 \
    || { tail -20 "$work/$name.log" >&2; return 1; }
}

# fp32, bf16, fp16, or fp8-RECIPE: its --set arguments.
dtype_args() {
  case $1 in
    fp8-*) echo --set train.dtype=fp8 --set train.fp8_recipe="${1#fp8-}" ;;
    *) echo --set train.dtype="$1" ;;
  esac
}
dtypes=(fp32 bf16 fp16 fp8-delayed fp8-current fp8-blockwise fp8-mxfp8)
[ "$smoke" = 1 ] && dtypes=(fp32 bf16 fp16 fp8-delayed)

echo "== 1. dtypes on GPT-2 124M's shape (vocab 8192, 4 x 256 tokens per step)"
printf "%-14s %10s %8s %10s\n" dtype "tokens/s" MFU "peak RSS"
for dtype in "${dtypes[@]}"; do
  train "speed-$dtype" configs/gpt2_124m.toml --set data.dir="$work/random" $(dtype_args $dtype) \
    --set train.steps=$speed_steps --set train.val_interval=0
  printf "%-14s %10.0f %7.1f%% %6.0f MiB\n" $dtype "$(field "$work/speed-$dtype" tokens_per_s)" \
    "$(field "$work/speed-$dtype" mfu | awk '{print 100 * $1}')" "$(rss "$work/speed-$dtype")"
done

# The published figures are tinyshakespeare's (../shared/data); without it, the default corpus.
text=../shared/data/tinyshakespeare.txt
[ -f "$text" ] || text=data/fortunes.txt
[ -f "$text" ] || { echo "needs ../shared/data/tinyshakespeare.txt or data/fortunes.txt (./setup.sh)"; exit 1; }
echo "== 2. loss parity: llama_small on $(basename "$text" .txt), $steps steps"
[ "$corpus_bytes" = 0 ] || { head -c "$corpus_bytes" "$text" > "$work/corpus.txt"; text=$work/corpus.txt; }
"$cleave" tokenize configs/llama_small.toml "${text_model[@]}" --set data.corpus="$text" \
  --set data.dir="$work/text" > "$work/tokenize.log" 2>&1
printf "%-14s %11s %9s %9s %9s %9s\n" dtype "train loss" "vs fp32" "val loss" "vs fp32" "vs bf16"
for dtype in "${dtypes[@]}"; do
  train "loss-$dtype" configs/llama_small.toml --set data.dir="$work/text" $(dtype_args $dtype) \
    --set train.steps="$steps" --set train.val_interval="$steps" --set optim.warmup_steps=30
done
percent() { awk -v a="$1" -v b="$2" 'BEGIN {print 100 * (a / b - 1)}'; }
for dtype in "${dtypes[@]}"; do
  loss=$(last "$work/loss-$dtype" loss 5) val=$(last "$work/loss-$dtype" val_loss)
  loss32=$(last "$work/loss-fp32" loss 5) val32=$(last "$work/loss-fp32" val_loss)
  val16=$(last "$work/loss-bf16" val_loss)
  printf "%-14s %11.4f %+8.2f%% %9.4f %+8.2f%% %+8.2f%%\n" $dtype "$loss" "$(percent "$loss" "$loss32")" \
    "$val" "$(percent "$val" "$val32")" "$(percent "$val" "$val16")"
done

echo "== 3. activation memory: llama_long, $layers layers, $seq tokens"
long=(--set data.dir="$work/random" --set model.n_layers="$layers" --set train.seq_len="$seq"
      --set train.steps=4 --set train.val_interval=0)
train ac-none configs/llama_long.toml "${long[@]}"
# Floats per token of a block's saved buffers, from the run's resolved config.
read -r d heads kv ffn vocab <<<"$(/usr/bin/python3 - "$work/ac-none/config.toml" <<'PY'
import sys, tomllib
m = tomllib.load(open(sys.argv[1], "rb"))["model"]
print(m["d_model"], m["n_heads"], m["n_kv_heads"], m["ffn_hidden"], m["vocab_size"])
PY
)"
kv_dim=$((d / heads * kv))
block=$((4 * d + d + 2 * kv_dim + heads + 3 * ffn)) selective=$((2 * d + ffn))
printf "%-22s %9s %9s %11s %9s\n" run "peak RSS" "less" "predicted" "tokens/s"
none=$(rss "$work/ac-none")
# All blocks but the one whose backward runs.
predict() { awk -v f="$1" -v n=$((layers - 1)) -v s=$seq 'BEGIN {printf "%.0f", n * s * f * 4 / 1048576}'; }
for row in "selective $(predict $selective) --set train.activation_checkpointing=selective" \
           "full $(predict $block) --set train.activation_checkpointing=full" \
           "loss_chunk-$chunk $(awk -v v="$vocab" -v s=$seq -v c=$chunk 'BEGIN {printf "%.0f", (s - c) * v * 4 / 1048576}') --set train.loss_chunk=$chunk"; do
  read -r name predicted settings <<<"$row"
  read -r -a set_args <<<"$settings"
  train "ac-$name" configs/llama_long.toml "${long[@]}" "${set_args[@]}"
  printf "%-22s %5.0f MiB %5.0f MiB %7.0f MiB %9.0f\n" "$name" "$(rss "$work/ac-$name")" \
    "$(awk -v a="$none" -v b="$(rss "$work/ac-$name")" 'BEGIN {print a - b}')" "$predicted" \
    "$(field "$work/ac-$name" tokens_per_s)"
done
printf "%-22s %5.0f MiB %9s %11s %9.0f\n" none "$none" - - "$(field "$work/ac-none" tokens_per_s)"

echo "== 4. offload: GPT-2, $layers layers, $((wide_seq * wide_batch)) tokens per step"
wide=(--set data.dir="$work/random" --set model.n_layers="$layers" --set train.seq_len="$wide_seq"
      --set train.micro_batch_size="$wide_batch" --set train.steps="$speed_steps" --set train.val_interval=0)
printf "%-26s %9s %10s\n" run "peak RSS" "step (ms)"
for row in "in-memory" "moments --set optim.offload=file" \
           "zero3-in-memory --set parallel.zero_stage=3" \
           "zero3-moments+shards --set parallel.zero_stage=3 --set optim.offload=file --set parallel.offload_params=file"; do
  read -r name settings <<<"$row"
  read -r -a set_args <<<"${settings:-}"
  train "off-$name" configs/gpt2_124m.toml "${wide[@]}" "${set_args[@]}"
  printf "%-26s %5.0f MiB %10.0f\n" "$name" "$(rss "$work/off-$name")" \
    "$(field "$work/off-$name" tokens_per_s | awk -v n=$((wide_seq * wide_batch)) '{print 1e3 * n / $1}')"
done

echo "== 5a. FP8 saved activations: llama_long, $layers layers, $seq tokens"
train fp8-bf16 configs/llama_long.toml "${long[@]}" --set train.dtype=bf16
train fp8-delayed configs/llama_long.toml "${long[@]}" --set train.dtype=fp8
copies=$((3 * d + ffn))  # bytes saved per token and block
printf "%-10s %9s %10s %9s\n" dtype "peak RSS" "tokens/s" ""
printf "%-10s %5.0f MiB %10.0f\n" bf16 "$(rss "$work/fp8-bf16")" "$(field "$work/fp8-bf16" tokens_per_s)"
printf "%-10s %5.0f MiB %10.0f  %.0f MiB less; the copies' bytes predict %.0f MiB\n" fp8 \
  "$(rss "$work/fp8-delayed")" "$(field "$work/fp8-delayed" tokens_per_s)" \
  "$(awk -v a="$(rss "$work/fp8-bf16")" -v b="$(rss "$work/fp8-delayed")" 'BEGIN {print a - b}')" \
  "$(awk -v c="$copies" -v n=$layers -v s=$seq 'BEGIN {print n * s * c / 1048576}')"

echo "== 5b. FP8 parameter gathers: GPT-2 of 4, ZeRO-3 on 2 ranks, fp8 delayed"
printf "%-14s %14s %10s %9s\n" gathers "bytes/step" "step (ms)" "peak RSS"
for row in "fp32 false" "fp8 true"; do
  read -r name flag <<<"$row"
  OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 "$cleave" train configs/gpt2_124m.toml "${model[@]}" "${wide[@]}" \
    --set train.threads=1 --set train.dtype=fp8 --set parallel.dp_shard=2 --set parallel.zero_stage=3 \
    --set parallel.fp8_allgather=$flag --set train.out_dir="$work/gather-$name" \
    --set train.checkpoint_interval=-1 --set train.log_interval=1 > "$work/gather-$name.log" 2>&1 \
    || { tail -20 "$work/gather-$name.log" >&2; exit 1; }
  printf "%-14s %14.0f %10.0f %5.0f MiB\n" $name "$(last "$work/gather-$name" zero3_gather_bytes_per_step)" \
    "$(field "$work/gather-$name" tokens_per_s | awk -v n=$((wide_seq * wide_batch)) '{print 1e3 * n / $1}')" \
    "$(rss "$work/gather-$name")"
done
