#!/usr/bin/env bash
# The planner's step time against cleave's own runs (issue 32, docs/planner.md#accuracy): for each
# layout family on 2 ranks of 1 thread (the cluster file's devices; HSDP on 4 ranks, two to a
# core, planned from a calibration with 4 ranks, whose devices are half a core each: the issue's
# wider layouts by their rank-seconds), `cleave plan --cluster`'s predicted tokens/s beside the
# median tokens/s of a run's steps 3-12 (and the cluster file's compute_imbalance, which the
# prediction stretched every rank's compute by), on a GPT-2 of d_model 512, 8 layers, 8 heads,
# vocabulary 8192, sequences of 128 tokens, 4 per micro-batch (a step of several hundred ms per
# rank), fp32 where the layout names no other dtype. Prints one row per layout and the error of
# the prediction.
# Run it on a machine as quiet as the one the cluster file was calibrated on. The ranks run
# unbound (mpirun --bind-to none), the fast launch docs/data_parallel.md gives: on the Zen 5 VM
# of 2026-11-27 a rank bound to its core ran at 0.5-0.9 of an unbound one, erratically.
# CLUSTER `calibrate` measures the machine (`cleave calibrate`, 2 ranks of 1 thread, and 4 for
# the 4-rank layout) at the start of each round and predicts from that: on a machine whose speed
# drifts over the hour (the Zen 5 VM's runs of one layout 20-40% apart), a file calibrated the day
# before predicts the drift.
# `calibrate-each` calibrates right before each layout's run and again right after it (about 50 s
# each on the Xeon VM; the one after serves the next layout of as many ranks as its one before),
# so that a prediction and its run are seconds apart rather than minutes: on the Xeon VM the
# calibrations of rounds minutes apart moved 39%. The prediction is then the mean of the two
# calibrations' (its run lay between them), and each row also prints the two, whose gap is how far
# the machine moved while the layout ran. STILL=PCT (calibrate-each) runs a layout again, twice at
# most, when its calibrations moved by more than PCT percent around its run. A cluster file skips
# the layouts of more ranks than its devices_per_host (their links would cross hosts it does not
# describe).
# ROUNDS rounds (default 1) each run every layout; with more than one, the last table gives each
# layout's median error over the rounds (calibrate-each: each round's error in order, with the
# calibrations' move around its run in brackets). LAYOUTS, a regular expression, runs the layouts whose
# names it matches (e.g. LAYOUTS='^pp' or LAYOUTS='AC|ep').
# Usage: [CLEAVE_BENCH_SMOKE=1] [ROUNDS=N] [LAYOUTS=REGEX] [STILL=PCT] bench/plan_accuracy.sh [CLUSTER=clusters/epyc_zen3_2core.toml | calibrate | calibrate-each]
set -euo pipefail
cd "$(dirname "$0")/.."
cluster=${1:-clusters/epyc_zen3_2core.toml}
rounds=${ROUNDS:-1}
source bench/common.sh
quick=()
[ "$smoke" = 1 ] && quick=(--quick)
vocab=8192 steps=12
model=(--set model.d_model=512 --set model.n_heads=8 --set model.n_layers=8
       --set model.vocab_size=$vocab --set train.seq_len=128 --set train.micro_batch_size=4)
[ "$smoke" = 1 ] && vocab=256 steps=3 model=("${tiny[@]}" --set model.vocab_size=256 --set train.micro_batch_size=4)
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 400000 > /dev/null
common=(--set data.dir="$work" --set train.dtype=fp32 --set train.threads=1
        --set train.log_interval=1 --set train.val_interval=0 --set train.checkpoint_interval=-1)
layouts=(
  "1 rank|1|"
  "DDP 2|2|--set parallel.dp_shard=2"
  "ZeRO-1 2|2|--set parallel.dp_shard=2 --set parallel.zero_stage=1"
  "ZeRO-2 2|2|--set parallel.dp_shard=2 --set parallel.zero_stage=2"
  "ZeRO-3 2|2|--set parallel.dp_shard=2 --set parallel.zero_stage=3"
  "DDP 2 + AC full|2|--set parallel.dp_shard=2 --set train.activation_checkpointing=full"
  "tp 2|2|--set parallel.tp=2"
  "tp 2 + SP|2|--set parallel.tp=2 --set parallel.sequence_parallel=true"
  "pp 2 1f1b m4|2|--set parallel.pp=2 --set train.grad_accum_steps=4"
  "pp 2 zbv m4|2|--set parallel.pp=2 --set train.grad_accum_steps=4 --set parallel.pp_schedule=zbv"
  "cp 2 ring|2|--set parallel.cp=2"
  "pp 2 gpipe m4|2|--set parallel.pp=2 --set train.grad_accum_steps=4 --set parallel.pp_schedule=gpipe"
  "pp 2 interl. m4|2|--set parallel.pp=2 --set train.grad_accum_steps=4 --set parallel.pp_schedule=interleaved"
  "pp 2 zb1p m4|2|--set parallel.pp=2 --set train.grad_accum_steps=4 --set parallel.pp_schedule=zb1p"
  "DDP 2 bf16|2|--set parallel.dp_shard=2 --set train.dtype=bf16"
  "DDP 2 FP8|2|--set parallel.dp_shard=2 --set train.dtype=fp8 --set train.fp8_recipe=delayed"
  "ep 2, 4 experts|2|--set parallel.dp_shard=2 --set parallel.ep=2 --set model.moe_experts=4 --set model.moe_top_k=2"
  "1 rank + AC full|1|--set train.activation_checkpointing=full"
  "HSDP 2x2, 4 ranks|4|--set parallel.dp_replicate=2 --set parallel.dp_shard=2"
)
[ "$smoke" = 1 ] && layouts=("${layouts[0]}" "${layouts[1]}" "${layouts[8]}")
if [ -n "${LAYOUTS:-}" ]; then  # a regular expression of the layouts' names
  chosen=()
  for entry in "${layouts[@]}"; do [[ ! ${entry%%|*} =~ $LAYOUTS ]] || chosen+=("$entry"); done
  [ ${#chosen[@]} -gt 0 ] || { echo "LAYOUTS='$LAYOUTS' names no layout" >&2; exit 2; }
  layouts=("${chosen[@]}")
fi
devices() { echo $(( $1 > 2 ? $1 : 2 )); }  # RANKS: the devices of the calibration that plans them
calibrate() {  # DEVICES: the machine now as that many ranks, into $work/cluster-DEVICES.toml
  OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np "$1" "$cleave" calibrate \
    "${quick[@]}" --out "$work/cluster-$1.toml" > "$work/calibrate.log" 2>&1 ||
    { cat "$work/calibrate.log" >&2; exit 1; }
}
predict() {  # CLUSTER_FILE: the plan's tokens/s of the layout in np, extra and routing on it
  "$cleave" plan configs/gpt2_124m.toml --world "$np" --cluster "$1" "${common[@]}" \
    "${model[@]}" "${extra[@]}" "${routing[@]}" --json "$work/plan.json" > "$work/plan.txt"
  /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step']['tokens_per_s'])" \
    "$work/plan.json"
}
[[ -z ${STILL:-} || $STILL =~ ^[0-9]+([.][0-9]+)?$ ]] ||
  { echo "STILL must be a percentage such as 10, not '$STILL'" >&2; exit 2; }
for round in $(seq "$rounds"); do
if [ "$cluster" = calibrate ]; then
  for n in $(for entry in "${layouts[@]}"; do IFS='|' read -r _ np _ <<<"$entry"; devices "$np"; done | sort -un); do
    calibrate "$n"
  done
fi
[ "$rounds" = 1 ] || echo "round $round of $rounds ($(date -u +%H:%M) UTC)"
printf "%-18s %12s %12s %8s  %s\n" layout predicted measured error "compute_imbalance"
index=0
for entry in "${layouts[@]}"; do
  IFS='|' read -r name np sets <<<"$entry"
  read -r -a extra <<<"$sets"
  out=$work/run
  rm -rf "$out"
  file=$cluster
  case $cluster in
    calibrate) file=$work/cluster-$(devices "$np").toml ;;
    calibrate-each) file=$work/cluster-$(devices "$np").toml
                    [ "${fresh:-}" = "$(devices "$np")" ] || calibrate "$(devices "$np")"
                    cp "$file" "$work/before.toml" ;;
    *) per_host=$(sed -n 's/^devices_per_host = //p' "$file")
       if [ "$np" -gt "${per_host:-1}" ]; then
         printf "%-18s skipped: %s holds %s devices per host\n" "$name" "$file" "${per_host:-1}"
         index=$((index + 1))
         continue
       fi ;;
  esac
  for attempt in 1 2 3; do
    OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np "$np" "$cleave" train configs/gpt2_124m.toml \
      "${common[@]}" "${model[@]}" "${extra[@]}" --set train.steps=$steps \
      --set train.out_dir="$out" > "$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }
    measured=$(field "$out" tokens_per_s)
    routing=()  # ep: the experts' rows as the run routed them
    [[ $sets != *parallel.ep=* ]] || routing=(--routing "$out")
    around=""
    if [ "$cluster" != calibrate-each ]; then
      predicted=$(predict "$file")
      imbalance=$(sed -n 's/^compute_imbalance = //p' "$file")
    else
      calibrate "$(devices "$np")"
      fresh=$(devices "$np")
      before=$(predict "$work/before.toml")
      after=$(predict "$file")
      predicted=$(awk -v b="$before" -v a="$after" 'BEGIN {print (b + a) / 2}')
      around=$(printf "  (%.1f before, %.1f after)" "$before" "$after")
      drift=$(awk -v b="$before" -v a="$after" 'BEGIN {print 100 * (a / b - 1)}')
      imbalance="$(sed -n 's/^compute_imbalance = //p' "$work/before.toml") $(sed -n 's/^compute_imbalance = //p' "$file")"
    fi
    # STILL=PCT: a run around which the calibrations moved further is run again (twice at most),
    # from the calibration after it: the machine did not hold still for it.
    [ "$cluster" = calibrate-each ] && [ -n "${STILL:-}" ] && [ "$attempt" -lt 3 ] &&
      awk -v d="$drift" -v l="$STILL" 'BEGIN {exit !(d > l || d < -l)}' || break
    printf "%-18s the calibrations moved %+.1f%% around its run (%.1f measured): again\n" \
      "$name" "$drift" "$measured"
    cp "$file" "$work/before.toml"
    rm -rf "$out"
  done
  [ "$cluster" != calibrate-each ] || echo "$drift" >> "$work/drift.$index"
  error=$(awk -v p="$predicted" -v m="$measured" 'BEGIN {print 100 * (p / m - 1)}')
  [ "$np" != 1 ] || imbalance=1  # one rank waits for no other: never stretched
  printf "%-18s %12.1f %12.1f %+7.1f%%  %s%s\n" "$name" "$predicted" "$measured" "$error" "${imbalance:-1}" "$around"
  echo "$error" >> "$work/errors.$index"
  index=$((index + 1))
done
echo "tokens/s; predicted by cleave plan --cluster $([ "$cluster" = "${cluster%.toml}" ] && echo "(a calibration with the layout's ranks, or 2 for one rank$([ "$cluster" != calibrate-each ] || echo ", right before and after each run: the mean of the two"))" || echo "$file"), measured: median of steps 3-$steps"
done
if [ "$rounds" != 1 ]; then
  echo "median error over $rounds rounds:"
  index=0
  for entry in "${layouts[@]}"; do
    if [ ! -f "$work/errors.$index" ]; then  # skipped in every round
      printf "%-18s skipped\n" "${entry%%|*}"
      index=$((index + 1))
      continue
    fi
    # the rounds' errors, sorted; calibrate-each: in round order, each with how far the
    # calibrations around its run moved (after / before)
    if [ -f "$work/drift.$index" ]; then
      rounds_text=$(paste "$work/errors.$index" "$work/drift.$index" |
        awk '{printf "%s%+.1f%% [%+.1f%%]", (NR > 1 ? ", " : ""), $1, $2}')
    else
      rounds_text=$(sort -g "$work/errors.$index" | awk '{printf "%s%+.1f%%", (NR > 1 ? ", " : ""), $1}')
    fi
    printf "%-18s %+7.1f%%  (%s)\n" "${entry%%|*}" "$(median < "$work/errors.$index")" "$rounds_text"
    index=$((index + 1))
  done
fi
