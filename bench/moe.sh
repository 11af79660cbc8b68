#!/usr/bin/env bash
# Mixture of experts (issue 19), printed, not a CI gate; one benchmark at a time. The model is
# configs/llama_small.toml (d_model 256, 4 layers, bf16, 16 x 128 tokens per step) on the default
# corpus (data/fortunes, tokenized first if absent).
#  1. Speed: every layer a MoE of 8 experts of 352 hidden units, top 2 (the auxiliary loss on),
#     against the dense model of the same active parameters (ffn_hidden 704 = 2 x 352), one
#     process of 2 threads, the two alternating ROUNDS times: median tokens/s and MFU (both on
#     active FLOPs: docs/moe.md) of each run's steps after the fifth, and MoE over dense.
#     Target: at least 0.8.
#  2. ep 2 (2 ranks of 1 thread) over STEPS steps: the share of the step rank 0 waited on the
#     dispatch and combine all-to-alls (exposed_comm_ms_ep over the step time) and tokens/s,
#     medians of the last 20 steps, with the worst layer's load then; and the same with every
#     token sent to all 8 experts (perfect balance, experts of 88 units: the same FLOPs), which
#     separates the all-to-alls' own cost from waiting for a rank whose experts drew more tokens.
#     Target: at most 15% exposed.
#  3. Balance over STEPS steps: the worst layer's max / mean tokens per expert (median over the
#     last 20 steps) and the final loss with no balancing, the auxiliary loss (0.01) and
#     sigmoid_bias's bias (rates 1e-3, DeepSeek-V3's, and 1e-2).
# CLEAVE_BENCH_SMOKE=1 (bench/common.sh): random tokens of vocab 256, the tiny model with experts
# of 32 units (the dense MLP 64, all-8 experts 8), 6 steps in 1., 4 in 2. and 3., one round.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/moe.sh [ROUNDS=3] [STEPS=200]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} steps=${2:-200}
source bench/common.sh
speed_steps=20 tokens=2048 model=() expert=352 data=()  # tokens per step: 16 x 128
if [ "$smoke" = 1 ]; then
  rounds=1 steps=4 speed_steps=6 tokens=512 expert=32 data=(--set data.dir="$work/data")
  model=("${tiny[@]}" --set model.vocab_size=256)
  mkdir -p "$work/data"
  /usr/bin/python3 bench/random_tokens.py "$work/data" 256 200000
else
  [ -f data/fortunes/train.bin ] || "$cleave" tokenize configs/llama_small.toml > "$work/tokenize.log"
fi

values() { grep "\"$2\"" "$1/metrics.jsonl" | grep -v val_loss | sed "s/.*\"$2\":\([^,}]*\).*/\1/"; }
after5() { values "$1" "$2" | tail -n +6; }
last20() { values "$1" "$2" | tail -n 20 | median; }
# The worst MoE layer's max / mean tokens per expert of each of the last 20 steps, median.
worst_load() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY' | tail -n 20 | median
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "moe_layers" in r:
        print(max(l["load_max_over_mean"] for l in r["moe_layers"]))
PY
}
train() {  # name ranks [--set ...]
  local name=$1 np=$2; shift 2
  mpirun --oversubscribe --bind-to none -np "$np" "$cleave" train configs/llama_small.toml \
    "${data[@]}" "${model[@]}" --set train.out_dir="$work/$name" --set train.checkpoint_interval=-1 \
    --set train.log_interval=1 --set train.val_interval=0 "$@" > "$work/$name.log" 2>&1 || { tail -20 "$work/$name.log" >&2; return 1; }
}
moe=(--set model.moe_experts=8 --set model.moe_top_k=2 --set model.moe_ffn_hidden="$expert")
dense=(--set model.ffn_hidden=$((2 * expert)))

echo "== 1. MoE (8 experts, top 2) against the dense model of the same active parameters"
for r in $(seq "$rounds"); do
  train "dense-$r" 1 "${dense[@]}" --set train.threads=2 --set train.steps=$speed_steps
  train "moe-$r" 1 "${moe[@]}" --set model.moe_aux_loss_coef=0.01 --set train.threads=2 --set train.steps=$speed_steps
done
printf "%-6s %10s %8s\n" model "tokens/s" "MFU"
for m in dense moe; do
  tok=$(for r in $(seq "$rounds"); do after5 "$work/$m-$r" tokens_per_s; done | median)
  mfu=$(for r in $(seq "$rounds"); do after5 "$work/$m-$r" mfu; done | median)
  printf "%-6s %10.0f %7.1f%%\n" $m "$tok" "$(awk -v m="$mfu" 'BEGIN {print 100 * m}')"
  eval "${m}_mfu=$mfu"
done
# shellcheck disable=SC2154
echo "MoE MFU over dense: $(awk -v a="$moe_mfu" -v b="$dense_mfu" 'BEGIN {printf "%.2f", a / b}') (target >= 0.80)"

echo "== 2. ep 2: 2 ranks x 1 thread, $steps steps (medians of the last 20)"
printf "%-26s %9s %9s %12s %9s\n" routing "tokens/s" "step ms" "ep exposed" "max/mean"
for row in "top-2 --set model.moe_top_k=2" "all-8-experts --set model.moe_top_k=8 --set model.moe_ffn_hidden=$((expert / 4))"; do
  read -r name settings <<<"$row"
  read -r -a set_args <<<"$settings"
  train "ep2-$name" 2 "${moe[@]}" "${set_args[@]}" --set model.moe_aux_loss_coef=0.01 \
    --set train.threads=1 --set train.steps="$steps" --set parallel.dp_shard=2 --set parallel.ep=2
  tok=$(last20 "$work/ep2-$name" tokens_per_s)
  exposed=$(last20 "$work/ep2-$name" exposed_comm_ms_ep)
  step_ms=$(awk -v n="$tokens" -v t="$tok" 'BEGIN {print 1000 * n / t}')
  printf "%-26s %9.0f %9.0f %6.1f (%4.1f%%) %9.2f\n" "$name" "$tok" "$step_ms" "$exposed" \
    "$(awk -v e="$exposed" -v s="$step_ms" 'BEGIN {print 100 * e / s}')" "$(worst_load "$work/ep2-$name")"
done
echo "(target: ep exposed <= 15% of the step)"

echo "== 3. balance over $steps steps"
printf "%-13s %15s %11s\n" balancing "max/mean load" "final loss"
for row in "none" "aux_loss --set model.moe_aux_loss_coef=0.01" \
           "sigmoid_1e-3 --set model.moe_router=sigmoid_bias --set model.moe_bias_update_rate=0.001" \
           "sigmoid_1e-2 --set model.moe_router=sigmoid_bias --set model.moe_bias_update_rate=0.01"; do
  read -r name settings <<<"$row"
  read -r -a set_args <<<"${settings:-}"
  train "balance-$name" 1 "${moe[@]}" "${set_args[@]}" --set train.threads=2 --set train.steps="$steps"
  load=$(worst_load "$work/balance-$name")
  loss=$(values "$work/balance-$name" loss | tail -n 5 | median)
  printf "%-13s %15.2f %11.4f\n" "$name" "$load" "$loss"
done
