#!/usr/bin/env bash
# Activation memory per layer and rank under tensor parallelism, measured, against Korthikanti et
# al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", eq. 1-4) adjusted for
# what cleave keeps. GPT-2 124M's shape (h 768, a 12 heads, s 256, vocab 8192), fp32, at tp 1, 2
# and 4, sequence parallelism off and on.
#
# Measured: the peak resident memory of the busiest rank, from four runs per layout: 2 and 4
# layers, 1 and 2 sequences per step. The difference over layers at a fixed batch is the
# per-layer parameters, gradients, optimizer state and activations; its difference over batch
# sizes leaves the activations of one sequence per layer (everything else cancels):
#   A = ([peak(4, 2) - peak(2, 2)] - [peak(4, 1) - peak(2, 1)]) / 2 layers.
#
# Korthikanti counts 16-bit activations with dropout masks and the s x s attention scores, per
# layer: s b h (34 + 5 a s / h) bytes; with tp t: s b h (10 + 24 / t + 5 a s / (h t)); with tp
# and sequence parallelism: s b h / t (34 + 5 a s / h). cleave keeps fp32 (4 bytes), no dropout,
# and flash-style attention keeps no s x s scores, only one log-sum-exp per head and token. What a
# block keeps for backward, in floats per token: its input, the two norm outputs and attn.out's
# sum (4 h, replicated over tp; 1/t under sequence parallelism), q k v (3 h / t), the attention
# output (h / t), the MLP's input and activation (8 h / t), the log-sum-exps (a / t) and the
# norms' statistics (4, two per LayerNorm). Hence, in bytes per layer:
#   tp 1:          4 s b (16 h + a + 4)
#   tp t:          4 s b (4 h + 12 h / t + a / t + 4)
#   tp t with SP:  4 s b (16 h + a + 4) / t
# CLEAVE_BENCH_SMOKE=1 (bench/common.sh): vocab 256, s 32, h 64, a 4, 1 step a run, the layouts
# tp 1 and tp 2 + SP.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/tp_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
vocab=8192 steps=2 s=256 h=768 a=12
layouts=("1 false" "2 false" "2 true" "4 false" "4 true")
[ "$smoke" = 1 ] && vocab=256 steps=1 s=32 h=64 a=4 layouts=("1 false" "2 true")
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000
common=(--set data.dir="$work" --set model.vocab_size="$vocab" --set model.d_model="$h"
        --set model.n_heads="$a" --set train.seq_len="$s" --set train.dtype=fp32
        --set train.threads=1 --set train.peak_gflops=1 --set train.val_interval=0
        --set train.checkpoint_interval=-1 --set train.log_interval=1 --set train.steps="$steps"
        --set train.grad_accum_steps=1)

peak() {  # tp sp layers batch -> peak RSS of the busiest rank, bytes
  local tp=$1 sp=$2 layers=$3 batch=$4 out=$work/run-$1-$2-$3-$4
  mpirun --oversubscribe -np "$tp" "$cleave" train configs/gpt2_124m.toml "${common[@]}" \
    --set parallel.tp="$tp" --set parallel.sequence_parallel="$sp" --set model.n_layers="$layers" \
    --set train.micro_batch_size="$batch" --set train.out_dir="$out" > "$out.log" 2>&1 \
    || { tail "$out.log" >&2; exit 1; }
  /usr/bin/python3 -c '
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if "peak_rss_mib_per_rank" in l][-1]
print(max(last["peak_rss_mib_per_rank"]) * 1048576)' "$out/metrics.jsonl"
}

printf "activations per layer and sequence (s %d, h %d, a %d), fp32, MiB\n" $s $h $a
printf "%-12s %14s %10s %9s %13s %17s\n" layout "peak RSS/rank" measured cleave ratio Korthikanti-16bit
for layout in "${layouts[@]}"; do
  read -r tp sp <<<"$layout"
  [ "$tp" = 1 ] && [ "$sp" = true ] && continue
  # One assignment a line: a failed run then stops the script (set -e).
  p22=$(peak "$tp" "$sp" 2 2)
  p42=$(peak "$tp" "$sp" 4 2)
  p21=$(peak "$tp" "$sp" 2 1)
  p41=$(peak "$tp" "$sp" 4 1)
  awk -v tp="$tp" -v sp="$sp" -v s=$s -v h=$h -v a=$a -v p22="$p22" -v p42="$p42" -v p21="$p21" \
      -v p41="$p41" 'BEGIN {
    measured = ((p42 - p22) - (p41 - p21)) / 2
    if (tp == 1)        { ours = 4 * s * (16 * h + a + 4); theirs = s * h * (34 + 5 * a * s / h) }
    else if (sp != "true") { ours = 4 * s * (4 * h + 12 * h / tp + a / tp + 4)
                          theirs = s * h * (10 + 24 / tp + 5 * a * s / (h * tp)) }
    else                { ours = 4 * s * (16 * h + a + 4) / tp
                          theirs = s * h / tp * (34 + 5 * a * s / h) }
    name = "tp " tp (sp == "true" ? " + SP" : "")
    printf "%-12s %14.0f %10.2f %9.2f %13.3f %17.2f\n", name, p42 / 1048576, measured / 1048576,
           ours / 1048576, measured / ours, theirs / 1048576
  }'
done
echo "peak RSS/rank: the 4-layer run with 2 sequences; ratio: measured / cleave's formula (target 0.9-1.1)"
