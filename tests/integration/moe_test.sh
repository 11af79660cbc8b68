#!/usr/bin/env bash
# Mixture of experts and expert parallelism (docs/moe.md). Every layout reproduces its single
# process within compare_runs.py's bounds for 20 steps (gradient accumulation 2) and its rerun is
# bitwise: ep 2 and 4, dropless and with a capacity, for each router; ep with tp (+ SP), ZeRO-1
# and ZeRO-3 (the experts sharded over efsdp), pp, cp and HSDP; shared experts beside a dense
# layer; GPT-2's experts; bf16; selective and full activation checkpointing (bitwise). Capacity
# drops the same choices on every layout; the ep bytes measured are cleave mesh's prediction for balanced routing and `cleave plan --routing`'s from the measured routing. An ep 4 checkpoint (with sigmoid_bias's biases) resumes on ep 2
# and in one process. Bad input is an error naming the numbers.
# The model is the 2-layer test model with 4 experts of 64 hidden units, top 2, one shared expert,
# the auxiliary loss and the z-loss on.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
llama=(--set model.family=llama --set model.n_kv_heads=2)
moe=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64
     --set model.moe_shared_experts=1 --set model.moe_aux_loss_coef=0.01
     --set model.moe_z_loss_coef=0.001)
common=("${twenty_steps[@]}" --set train.micro_batch_size=4 --set train.grad_accum_steps=2
        "${moe[@]}")
ep() { echo "--set parallel.dp_shard=$1 --set parallel.ep=$1"; }
capacity=(--set model.moe_capacity_factor=1.0)
dropped() { grep -o '"dropped":[0-9.]*' "$work/$1/metrics.jsonl"; }

# Each router, dropless and with a capacity, at ep 2 and 4.
for router in topk_softmax softmax_topk sigmoid_bias; do
  r=(--set model.moe_router=$router)
  run "ref-$router" 1 "${llama[@]}" "${r[@]}"
  run "ref-$router-cap" 1 "${llama[@]}" "${r[@]}" "${capacity[@]}"
  for n in 2 4; do
    # shellcheck disable=SC2046
    layout "ref-$router" "$router-ep$n" "$n" "${llama[@]}" "${r[@]}" $(ep "$n")
    # shellcheck disable=SC2046
    layout "ref-$router-cap" "$router-cap-ep$n" "$n" "${llama[@]}" "${r[@]}" "${capacity[@]}" $(ep "$n")
    diff <(dropped "ref-$router-cap") <(dropped "$router-cap-ep$n") > /dev/null \
      || { echo "FAIL: $router-cap-ep$n dropped other choices than one process"; exit 1; }
  done
done
[ "$(dropped ref-topk_softmax-cap | grep -vc ':0.0$')" -gt 0 ] \
  || { echo "FAIL: the capacity dropped nothing: the test does not test it"; exit 1; }
echo "ep 2 and 4 reproduce one process for each router, dropless and with a capacity (the same choices dropped), reruns bitwise"

# Compositions, with the capacity on (its drop order spans the cp chunks).
ref=ref-topk_softmax-cap
c=("${llama[@]}" "${capacity[@]}")
# shellcheck disable=SC2046
layout $ref ep2-tp2 4 "${c[@]}" $(ep 2) --set parallel.tp=2
# shellcheck disable=SC2046
layout $ref ep2-tp2-sp 4 "${c[@]}" $(ep 2) --set parallel.tp=2 --set parallel.sequence_parallel=true
# ZeRO over the experts' own group: 4 ranks, ep 2, so efsdp = 2 shards each expert.
layout $ref ep2-zero1-efsdp2 4 "${c[@]}" --set parallel.dp_shard=4 --set parallel.ep=2 \
  --set parallel.zero_stage=1
layout $ref ep2-zero3 4 "${c[@]}" --set parallel.dp_shard=4 --set parallel.ep=2 --set parallel.zero_stage=3
# shellcheck disable=SC2046
layout $ref ep2-pp2 4 "${c[@]}" $(ep 2) --set parallel.pp=2 --set parallel.pp_schedule=zb1p
layout $ref ep2-cp2 2 "${c[@]}" --set parallel.cp=2 --set parallel.ep=2
layout $ref ep4-cp2-dp2 4 "${c[@]}" --set parallel.dp_shard=2 --set parallel.cp=2 \
  --set parallel.ep=4 --set parallel.cp_mode=ulysses
# shellcheck disable=SC2046
layout $ref ep2-hsdp 4 "${c[@]}" --set parallel.dp_replicate=2 $(ep 2) --set parallel.zero_stage=2
for name in ep2-tp2 ep2-zero1-efsdp2 ep2-zero3 ep2-pp2 ep2-cp2 ep4-cp2-dp2 ep2-hsdp; do
  diff <(dropped $ref) <(dropped $name) > /dev/null \
    || { echo "FAIL: $name dropped other choices than one process"; exit 1; }
done
echo "ep composes with tp (+ SP), ZeRO-1 and ZeRO-3 over efsdp, pp, cp and HSDP"

# Shared experts beside a dense layer; GPT-2's experts.
mixed=("${llama[@]}" --set model.moe_first_dense=1)
run ref-mixed 1 "${mixed[@]}"
# shellcheck disable=SC2046
layout ref-mixed mixed-ep2 2 "${mixed[@]}" $(ep 2)
# GPT-2's experts (biases, GELU, beside a tied head) with every expert chosen: at top 2 a near-tie
# of GPT-2's router flips one token's choice at step 10 between honest layouts on an AVX2-only CPU
# (Zen 3: 8e-5 in the loss, 0.02 lr after it), and the runs part as any two routings do. Top-k
# routing under ep is the Llama cases' above.
gpt2=(--set model.moe_top_k=4)
run ref-gpt2 1 "${gpt2[@]}"
# shellcheck disable=SC2046
layout ref-gpt2 gpt2-ep2 2 "${gpt2[@]}" $(ep 2)
echo "a dense layer before a MoE layer and GPT-2's experts at ep 2 reproduce one process"

# bf16 routes every token to all 4 experts: with top 2, bf16's rounding changes a few tokens'
# choices between any two honest layouts (one process accumulating 4 micro-batches included),
# which moves the experts up to 0.4 lr in 20 steps (equivalence_spread.sh moe bf16); with every
# expert chosen the honest spread is 0.018 lr and 4.6e-5 in the loss, within bf16's bounds.
bf16=("${llama[@]}" --set train.dtype=bf16 --set model.moe_top_k=4)
run ref-bf16 1 "${bf16[@]}"
# shellcheck disable=SC2046
layout ref-bf16 bf16-ep2 2 "${bf16[@]}" $(ep 2)
# shellcheck disable=SC2046
layout ref-bf16 bf16-ep2-tp2 4 "${bf16[@]}" $(ep 2) --set parallel.tp=2
layout ref-bf16 bf16-ep2-cp2 2 "${bf16[@]}" --set parallel.cp=2 --set parallel.ep=2
# shellcheck disable=SC2046
layout ref-bf16 bf16-ep2-pp2 4 "${bf16[@]}" $(ep 2) --set parallel.pp=2
echo "bf16 at ep 2, alone and with tp, cp and pp, reproduces one process"

# An ep 4 checkpoint, sigmoid_bias's biases with it, resumes on ep 2 and in one process.
bias=("${llama[@]}" --set model.moe_router=sigmoid_bias)
for to in 2 1; do
  name=resume-ep4-to-$to
  # shellcheck disable=SC2046
  run $name 4 "${bias[@]}" $(ep 4) --exit-after 10
  if [ $to = 1 ]; then run $name 1 "${bias[@]}" --resume latest
  else
    # shellcheck disable=SC2046
    run $name 2 "${bias[@]}" $(ep 2) --resume latest
  fi
  grep -q "resumed at step 10" "$work/$name.log" || { echo "FAIL: $name did not resume"; exit 1; }
  $compare "$work/ref-sigmoid_bias" "$work/$name" --from-step 11
done
grep -q '"bias_max":[0-9.e-]*[1-9]' "$work/ref-sigmoid_bias/metrics.jsonl" \
  || { echo "FAIL: sigmoid_bias's biases never moved"; exit 1; }
echo "an ep 4 checkpoint resumes on ep 2 and on one process"

# Activation checkpointing recomputes the routing, the dispatch and the experts bitwise (the
# statistics count each micro-batch once): the same bits as keeping everything, with and
# without ep.
for mode in selective full; do
  run "ac-$mode" 1 "${llama[@]}" --set train.activation_checkpointing=$mode
  same_bits ref-topk_softmax "ac-$mode" 20
  # shellcheck disable=SC2046
  run "ac-$mode-ep2" 2 "${llama[@]}" --set train.activation_checkpointing=$mode $(ep 2)
  same_bits topk_softmax-ep2 "ac-$mode-ep2" 20
  diff <(grep -o '"moe_layers":\[[^]]*\]' "$work/ref-topk_softmax/metrics.jsonl") \
       <(grep -o '"moe_layers":\[[^]]*\]' "$work/ac-$mode/metrics.jsonl") > /dev/null \
    || { echo "FAIL: $mode checkpointing changed the routing statistics"; exit 1; }
done
echo "selective and full activation checkpointing give the same bits, alone and at ep 2"

# The ep bytes rank 0 sends, measured by the trainer, against the run's own prediction (the figure
# `cleave mesh` prints), which assumes balanced routing: within 25% over the 20 steps (the auxiliary
# loss keeps the routing near balanced). `cleave plan --routing RUN` predicts them from the run's
# measured routing (the rows each expert kept): within 2%, dropless and with the capacity's drops,
# where the balanced figure is over 10% off.
for n in 2 4; do
  for name in "topk_softmax-ep$n" "topk_softmax-cap-ep$n"; do
    measured=$(grep -o '"ep_bytes_per_step":[0-9.]*' "$work/$name/metrics.jsonl" | cut -d: -f2 \
               | awk '{ s += $1 } END { printf "%.0f", s / NR }')
    balanced=$(grep -o '"ep_bytes_per_step_predicted":[0-9]*' "$work/$name/metrics.jsonl" \
               | tail -1 | cut -d: -f2)
    [ -n "$balanced" ] && awk -v m="$measured" -v p="$balanced" 'BEGIN { exit !(m > 0.75 * p && m < 1.25 * p) }' \
      || { echo "FAIL: $name sent $measured ep bytes per step, the run predicted $balanced"; exit 1; }
    extra=()
    [[ $name = *-cap-* ]] && extra=("${capacity[@]}")
    # shellcheck disable=SC2046
    "$cleave" plan "$cfg" --world "$n" "${common[@]}" "${llama[@]}" "${extra[@]}" $(ep "$n") \
      --routing "$work/$name" --json "$work/plan-$name.json" > "$work/plan-$name.txt"
    routed=$(/usr/bin/python3 -c "import json, sys; print(sum(a['bytes'] for a in json.load(open(sys.argv[1]))['axes'] if a['axis'] == 'ep'))" "$work/plan-$name.json")
    grep -q "ep .* MiB  for balanced routing" "$work/plan-$name.txt" \
      || { echo "FAIL: cleave plan --routing printed no balanced ep bytes beside"; exit 1; }
    awk -v m="$measured" -v p="$routed" 'BEGIN { exit !(m > 0.98 * p && m < 1.02 * p) }' \
      || { echo "FAIL: $name sent $measured ep bytes per step, cleave plan --routing predicted $routed"; exit 1; }
    echo "$name: $measured ep bytes per step measured, $routed predicted from its routing, $balanced for balanced routing"
  done
done
[ "$(awk -v m="$measured" -v p="$balanced" 'BEGIN { print (m < 0.9 * p || m > 1.1 * p) }')" = 1 ] \
  || { echo "FAIL: the capacity's drops left ep 4's bytes within 10% of balanced: the test does not test the routing"; exit 1; }

# Bad input.
expect_error 4 "model.moe_experts = 4 cannot be split over parallel.ep = 8" "${llama[@]}" \
  --set model.moe_experts=4 --set parallel.dp_shard=4 --set parallel.ep=8
expect_error 4 "parallel.ep = 3 does not divide dp_shard x cp = 4 x 1 = 4" "${llama[@]}" \
  --set model.moe_experts=6 --set parallel.dp_shard=4 --set parallel.ep=3
expect_error 1 "$cfg: model.moe_top_k = 5 exceeds model.moe_experts = 4" --set model.moe_top_k=5
common=("${twenty_steps[@]}")  # a dense model
expect_error 2 "parallel.ep = 2 needs a mixture-of-experts model (model.moe_experts is 0)" \
  --set parallel.dp_shard=2 --set parallel.ep=2
plan_error() {  # message [--set ...]: cleave plan --routing fails with exactly this message
  local message=$1; shift
  if "$cleave" plan "$cfg" --world 2 "$@" > "$work/plan-error.log" 2>&1 \
      || ! grep -qF -- "$message" "$work/plan-error.log"; then
    echo "FAIL: expected cleave plan to fail with: $message"; cat "$work/plan-error.log"; exit 1
  fi
}
plan_error "--routing: cannot read $work/none (a run's folder or its metrics.jsonl)" "${moe[@]}" \
  --routing "$work/none"
mkdir -p "$work/none"
echo '{"step":1,"loss":5.5}' > "$work/none/metrics.jsonl"  # a dense run's
plan_error "--routing gives a MoE model's routing; model.moe_experts is 0" --routing "$work/none"
plan_error "$work/topk_softmax-ep2/metrics.jsonl:1: layer 0 has 4 experts, the planned model model.moe_experts = 8" \
  "${moe[@]}" --set model.moe_experts=8 --routing "$work/topk_softmax-ep2"
plan_error "--routing: $work/none/metrics.jsonl logs no routing" "${moe[@]}" --routing "$work/none/metrics.jsonl"
echo "bad expert layouts and routings are errors naming the numbers"
