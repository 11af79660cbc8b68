#!/usr/bin/env bash
# cleave against the PyTorch peer (../shared/peer, modes installed and tuned) on GPT-2 124M:
# d_model 768, 12 layers, 12 heads, sequence 256, batch 4, AdamW, 2 threads, 3 warm-up and 10
# timed steps, fp32 and bf16, the programs alternating, REPEATS rounds. Prints the median tokens/s
# of each and cleave's ratio against the faster PyTorch mode, and the step against its own
# products: the time `cleave bench-gemm` gives a step's linears (each round, after its runs) over
# the step's time (issue 28's ceiling: at least 0.90 in fp32, 0.85 in bf16). CLEAVE_BENCH_SMOKE=1 (bench/common.sh):
# vocab 256, the tiny model, fp32 only, 3 steps, one round.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/vs_pytorch.sh [VOCAB=8192] [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
vocab=${1:-8192} repeats=${2:-3}
source bench/common.sh
need_peer
dtypes="fp32 bf16" steps=13 model=()
[ "$smoke" = 1 ] && vocab=256 repeats=1 dtypes=fp32 steps=3 model=("${tiny[@]}")
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000

cleave_run() {  # prints the median tokens/s of timed steps 4..13
  local dtype=$1 out=$work/run-$dtype
  rm -rf "$out"
  OMP_NUM_THREADS=2 "$cleave" train configs/gpt2_124m.toml --set data.dir="$work" \
    --set model.vocab_size="$vocab" "${model[@]}" --set train.dtype="$dtype" --set train.steps=$steps \
    --set train.log_interval=1 --set train.val_interval=0 --set train.checkpoint_interval=-1 \
    --set train.threads=2 --set train.out_dir="$out" > "$out.log" 2>&1 \
    || { cat "$out.log" >&2; return 1; }
  field "$out" tokens_per_s
}

products_ms() {  # DTYPE: a training step's products in ms, from this round's bench-gemm
  sed -n "s/^$1 *a training step's products: \([0-9.]*\) ms.*/\1/p" "$work/gemm.txt"
}

declare -A results
for round in $(seq "$repeats"); do
  for dtype in $dtypes; do
    results[cleave-$dtype]+="$(cleave_run "$dtype") "
    results[installed-$dtype]+="$(peer_run installed "$dtype" 1) "
    results[tuned-$dtype]+="$(peer_run tuned "$dtype" 1) "
    echo "round $round $dtype: cleave ${results[cleave-$dtype]}| installed ${results[installed-$dtype]}| tuned ${results[tuned-$dtype]}" >&2
  done
  OMP_NUM_THREADS=2 "$cleave" bench-gemm configs/gpt2_124m.toml --set model.vocab_size="$vocab" \
    "${model[@]}" --threads 2 --seconds "$([ "$smoke" = 1 ] && echo 0.1 || echo 1)" > "$work/gemm.txt"
  for dtype in $dtypes; do results[products-$dtype]+="$(products_ms "$dtype") "; done
done
echo "GPT-2 124M, vocab $vocab, seq 256, batch 4, 2 threads; median tokens/s over $repeats rounds"
printf "%-6s %10s %14s %10s %8s\n" dtype cleave torch-installed torch-tuned ratio
for dtype in $dtypes; do
  c=$(tr ' ' '\n' <<<"${results[cleave-$dtype]}" | grep . | median)
  i=$(tr ' ' '\n' <<<"${results[installed-$dtype]}" | grep . | median)
  t=$(tr ' ' '\n' <<<"${results[tuned-$dtype]}" | grep . | median)
  best=$(awk -v a="$i" -v b="$t" 'BEGIN {print (a > b ? a : b)}')
  printf "%-6s %10.0f %14.0f %10.0f %7.2fx\n" "$dtype" "$c" "$i" "$t" "$(awk -v c="$c" -v b="$best" 'BEGIN {print c / b}')"
done
echo "the step against its own products (bench-gemm's time for them over the step's, medians)"
printf "%-6s %10s %12s %8s\n" dtype step_ms products_ms ratio
tokens=$(sed -n 's/.*global batch \([0-9]*\) x \([0-9]*\) tokens.*/\1 \2/p' "$work/run-fp32.log" | awk '{print $1 * $2}')
for dtype in $dtypes; do
  c=$(tr ' ' '\n' <<<"${results[cleave-$dtype]}" | grep . | median)
  p=$(tr ' ' '\n' <<<"${results[products-$dtype]}" | grep . | median)
  awk -v d="$dtype" -v t="$tokens" -v c="$c" -v p="$p" \
    'BEGIN {s = 1e3 * t / c; printf "%-6s %10.1f %12.1f %8.2f\n", d, s, p, p / s}'
done
for dtype in $dtypes; do
  grep -h "MFU" "$work/run-$dtype.log" | tail -1 | sed "s/^/last cleave $dtype step: /"
done
