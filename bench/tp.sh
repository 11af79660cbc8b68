#!/usr/bin/env bash
# cleave tensor parallelism on GPT-2 124M's shape (configs/gpt2_124m.toml: sequence 256, global
# batch 4), fp32 and bf16, all at the same global batch, the programs alternating, REPEATS rounds:
#   tp 2 (2 ranks x 1 thread, parallel.tp=2), tp 2 with sequence parallelism, 1 rank x 2 threads,
#   and DDP 2 x 1 (parallel.dp_shard=2, zero_stage 0).
# Prints median tokens/s, the ratios tp2 / 1x2 (target >= 0.85), tp2-sp / 1x2 and tp2 / DDP 2x1,
# and the median exposed tp communication (metrics.jsonl exposed_comm_ms_tp) as a share of the
# step (target <= 15%). Then the bytes rank 0 sent into tp collectives per step (tp_bytes_per_step)
# against the theory for a ring over t ranks, per rank sent: an all-reduce of n floats sends
# 2 (t-1)/t n 4 bytes, an all-gather or reduce-scatter of a full n-float tensor (t-1)/t n 4.
#   SP off: per block 2 all-reduces of b s h floats forward and 2 backward, the embedding's
#     forward all-reduce, the head input's backward all-reduce (b local batch, s sequence,
#     h d_model); the vocabulary-parallel loss's all-gather of 3 floats per token (3 b s 4 (t-1)).
#   SP on: the same volume as all-gathers and reduce-scatters (per block 2 + 2 forward and 2 + 2
#     backward; the embedding's reduce-scatter and backward all-gather, the head input's
#     all-gather and backward reduce-scatter), plus per block the 2 all-gathers again in backward
#     of the column-parallel inputs h1, h2 (docs/tensor_parallel.md: SP keeps no full rows), the
#     loss's all-gather, and the all-reduce of the gradients that are sums over tp ranks under SP:
#     the norms' (2 layers + 1 of them) and the position embedding's (max_seq_len rows, GPT-2).
# The gradient norm's sum over tp is not counted in the bytes (it is 8). Also printed: the tp bytes
# `cleave mesh` predicts from the config. Validation is off (train.val_interval=0), so every step's
# bytes are training's. Benchmarks are not CI gates. CLEAVE_BENCH_SMOKE=1 (bench/common.sh): vocab
# 256, the tiny model, fp32 only, 3 steps, one round.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/tp.sh [VOCAB=8192] [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
vocab=${1:-8192} repeats=${2:-3}
source bench/common.sh
dtypes="fp32 bf16" steps=13 model=()
[ "$smoke" = 1 ] && vocab=256 repeats=1 dtypes=fp32 steps=3 model=("${tiny[@]}")
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000

cfg=configs/gpt2_124m.toml
key() { sed -n "s/^$1 *= *\"\{0,1\}\([^\" ]*\)\"\{0,1\}.*/\1/p" "$cfg" | head -n 1; }
family=$(key family) layers=$(key n_layers) d_model=$(key d_model) max_seq=$(key max_seq_len)
seq=$(key seq_len) batch=$(key micro_batch_size)
[ "$smoke" = 1 ] && layers=2 d_model=64 seq=32  # the tiny model's, for the theory
tokens=$((seq * batch))  # global tokens per step (grad_accum_steps 1)

cleave_run() {  # name dtype ranks threads [--set ...] -> "tok/s exposed_tp_ms tp_bytes step_ms"
  local name=$1 dtype=$2 np=$3 threads=$4; shift 4
  local out=$work/run-$name-$dtype
  rm -rf "$out"
  # One thread per rank: let mpirun bind each rank to a core; more: do not bind.
  local bind=(); [ "$threads" -gt 1 ] && bind=(--bind-to none)
  mpirun --oversubscribe "${bind[@]}" -np "$np" "$cleave" train "$cfg" --set data.dir="$work" \
    --set model.vocab_size="$vocab" "${model[@]}" --set train.dtype="$dtype" --set train.steps=$steps \
    --set train.log_interval=1 --set train.val_interval=0 --set train.checkpoint_interval=-1 \
    --set train.threads="$threads" --set train.out_dir="$out" "$@" \
    > "$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
  local tok; tok=$(field "$out" tokens_per_s)
  echo "$tok $(field "$out" exposed_comm_ms_tp) $(field "$out" tp_bytes_per_step)" \
    "$(awk -v n="$tokens" -v t="$tok" 'BEGIN {print 1e3 * n / t}')"
}

layouts="tp2 tp2-sp 1x2 ddp2"
declare -A args=(
  [tp2]="2 1 --set parallel.tp=2 --set parallel.dp_shard=1"
  [tp2-sp]="2 1 --set parallel.tp=2 --set parallel.dp_shard=1 --set parallel.sequence_parallel=true"
  [1x2]="1 2"
  [ddp2]="2 1 --set parallel.dp_shard=2 --set parallel.zero_stage=0")
declare -A tok exposed bytes step
for round in $(seq "$repeats"); do
  for dtype in $dtypes; do
    line="round $round $dtype:"
    for l in $layouts; do
      # shellcheck disable=SC2086  # args holds words
      r=$(cleave_run "$l" "$dtype" ${args[$l]})
      read -r t e b s <<<"$r"
      tok[$l-$dtype]+="$t " exposed[$l-$dtype]+="$e " bytes[$l-$dtype]+="$b " step[$l-$dtype]+="$s "
      line+=" $l ${tok[$l-$dtype]}|"
    done
    echo "$line" >&2
  done
done
m() { tr ' ' '\n' <<<"$1" | grep . | median; }
comm() {  # layout dtype -> "E ms (P%)" of the median exposed tp ms and median step ms
  local e st; e=$(m "${exposed[$1-$2]}") st=$(m "${step[$1-$2]}")
  awk -v e="$e" -v s="$st" 'BEGIN {printf "%.0f ms (%.1f%%)", e, 100 * e / s}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

echo "GPT-2 124M shape, vocab $vocab, seq $seq, global batch $batch; median tokens/s over $repeats rounds"
printf "%-6s %8s %8s %8s %9s %9s %11s %9s %17s %17s\n" dtype "tp2" "tp2-sp" "1x2" "DDP 2x1" \
  "tp2/1x2" "tp2-sp/1x2" "tp2/DDP" "tp2 exposed tp" "tp2-sp exposed tp"
for dtype in $dtypes; do
  a=$(m "${tok[tp2-$dtype]}") sp=$(m "${tok[tp2-sp-$dtype]}") s=$(m "${tok[1x2-$dtype]}")
  d=$(m "${tok[ddp2-$dtype]}")
  printf "%-6s %8.0f %8.0f %8.0f %9.0f %8sx %10sx %8sx %17s %17s\n" "$dtype" "$a" "$sp" "$s" "$d" \
    "$(ratio "$a" "$s")" "$(ratio "$sp" "$s")" "$(ratio "$a" "$d")" "$(comm tp2 "$dtype")" "$(comm tp2-sp "$dtype")"
done
echo "targets: tp2/1x2 >= 0.85; exposed tp communication <= 15% of the step"

echo
echo "bytes rank 0 sent into tp collectives per step (tp_bytes_per_step), against the ring theory:"
# theory sp -> "total activations loss parameter_sums" bytes per rank per step, t = 2, dp 1.
theory() {
  awk -v sp="$1" -v t=2 -v b="$batch" -v s="$seq" -v h="$d_model" -v L="$layers" \
      -v ms="$max_seq" -v gpt2="$([ "$family" = gpt2 ] && echo 1 || echo 0)" 'BEGIN {
    n = b * s * h
    loss = 3 * b * s * 4 * (t - 1)
    if (sp == 0) { act = (4 * L + 2) * 2 * (t - 1) / t * n * 4; par = 0 }
    else {
      act = (10 * L + 4) * (t - 1) / t * n * 4
      par = 2 * (t - 1) / t * ((gpt2 ? 2 : 1) * (2 * L + 1) * h + (gpt2 ? ms * h : 0)) * 4
    }
    printf "%.0f %.0f %.0f %.0f", act + loss + par, act, loss, par }'
}
mesh() {  # sp -> the tp bytes per rank per step that `cleave mesh` predicts
  "$cleave" mesh "$cfg" --world 2 --set model.vocab_size="$vocab" "${model[@]}" --set parallel.tp=2 \
    --set parallel.sequence_parallel="$1" | sed -n 's/^ *tp .*(\([0-9]*\) bytes).*/\1/p'
}
mb() { awk -v x="$1" 'BEGIN {printf "%.3f", x / 1e6}'; }
printf "%-6s %-7s %12s %12s %7s %15s   %s\n" dtype layout "measured MB" "theory MB" ratio \
  "cleave mesh MB" "theory: activations + loss all-gather + SP parameter-gradient sums (MB)"
for dtype in $dtypes; do
  for l in tp2 tp2-sp; do
    read -r th act loss par <<<"$(theory "$([ $l = tp2-sp ] && echo 1 || echo 0)")"
    meas=$(m "${bytes[$l-$dtype]}")
    printf "%-6s %-7s %12s %12s %7.4f %15s   %s + %s + %s\n" "$dtype" "$l" "$(mb "$meas")" \
      "$(mb "$th")" "$(awk -v a="$meas" -v b="$th" 'BEGIN {print a / b}')" \
      "$(mb "$(mesh "$([ $l = tp2-sp ] && echo true || echo false)")")" \
      "$(mb "$act")" "$(mb "$loss")" "$(mb "$par")"
  done
done
