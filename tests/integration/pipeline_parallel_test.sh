#!/usr/bin/env bash
# Pipeline schedules against the single-process reference (docs/pipeline_parallel.md): every
# schedule (gpipe, 1f1b, interleaved, zb1p, zbv) at pp 2 and 4, GPT-2 (tied embedding over the
# first and last stage) and Llama. GPT-2's runs are repeated: the rerun is bitwise identical, and
# each rank ran its list of the schedule in order. The bytes rank 0 sends on pp are what the run
# predicted. pipeline_composed_test.sh has the rest
# (pp with other layouts, resume, tools, a stopped stage, bad input); two tests, so that a slow
# machine runs them side by side within ctest's timeout.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/pipeline_layouts.sh"
for pp in 2 4; do
  for schedule in gpipe 1f1b interleaved zb1p zbv; do
    layout ref "gpt2-$schedule-pp$pp" "$pp" --set parallel.pp=$pp --set parallel.pp_schedule=$schedule \
      --set train.trace_step=20
    # Every rank ran the schedule's own list, in order (the losses alone would not tell gpipe or
    # zb1p run as 1f1b): step 20's trace against `cleave schedule`'s list.
    virtual=1
    case $schedule in interleaved|zbv) virtual=2 ;; esac
    "$cleave" schedule --pp "$pp" --microbatches 8 --schedule "$schedule" --virtual $virtual \
      --csv "$work/$schedule-pp$pp.csv" > /dev/null
    /usr/bin/python3 "$src/tests/integration/schedule_order.py" \
      "$work/gpt2-$schedule-pp$pp/trace_step_20.json" "$work/$schedule-pp$pp.csv"
    # Llama's reruns are GPT-2's code path; one run each keeps the suite short.
    run "llama-$schedule-pp$pp" "$pp" "${llama[@]}" --set parallel.pp=$pp \
      --set parallel.pp_schedule=$schedule
    $compare "$work/ref-llama" "$work/llama-$schedule-pp$pp"
  done
done
# The bytes rank 0 sends to other stages and into the tied sum, as the run predicted them:
# one stage and the tied embedding (1f1b), two stages on one rank (interleaved), the V's turn
# and both ends of the tied embedding on rank 0 (zbv).
for schedule in 1f1b interleaved zbv; do
  axis_bytes pp "gpt2-$schedule-pp4"
done
grep -q "pp 4 (zbv, 8 stages)" "$work/gpt2-zbv-pp4.log" \
  || { echo "FAIL: the start line does not name the pipeline"; exit 1; }
echo "pipeline schedules match the reference"
