#!/usr/bin/env bash
# Activation checkpointing and the chunked loss take effect in memory as the run predicts: each
# run prints the activation memory parallel/activation_memory.h predicts for its step program
# (activation_mib_predicted_per_rank), and the peak resident memory a setting saves against the
# same run without it must be that prediction's difference, rank by rank: selective, full and
# every-other-layer checkpointing in fp32 and bf16, under pp 2 with several micro-batches in
# flight (1f1b, and zb1p's deferred weight halves) and tp 2 with sequence parallelism, and a
# chunked loss alone and under tp 2. Each run validates before its last step, so a validation
# that refilled the checkpointed blocks' activations would show. The check is shown to fail when
# a setting is ignored (a run without it standing in for the run with it).
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
# Activations that dominate the resident memory: 2048 tokens per micro-batch through 4 blocks.
common=(--set model.d_model=128 --set model.n_layers=4 --set model.n_heads=4
        --set model.max_seq_len=128 --set train.seq_len=128 --set train.micro_batch_size=16
        --set train.grad_accum_steps=1 --set train.steps=3 --set train.log_interval=1
        --set train.val_interval=2 --set train.val_batches=1 --set train.checkpoint_interval=-1
        --set train.threads=1)
# Logits that dominate instead: 16384 tokens of a 2-block d_model 32 model.
logits=(--set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2
        --set train.micro_batch_size=128)

# saves REF NAME: per rank, the peak RSS NAME saves against REF is what the runs predicted,
# within 15% and 2 MiB (what else a run holds, e.g. oneDNN's scratch, moves a little with them).
saves() {
  /usr/bin/python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$2" <<'PY'
import json, sys
def last(path):
    rows = [json.loads(l) for l in open(path) if '"loss"' in l]
    return rows[-1]["peak_rss_mib_per_rank"], rows[-1]["activation_mib_predicted_per_rank"]
(rss_ref, pred_ref), (rss, pred) = last(sys.argv[1]), last(sys.argv[2])
bad = False
for r, (a, b, pa, pb) in enumerate(zip(rss_ref, rss, pred_ref, pred)):
    measured, predicted = a - b, pa - pb
    ok = abs(measured - predicted) <= 0.15 * abs(predicted) + 2
    print(f"{sys.argv[3]} rank {r}: saves {measured:.1f} MiB of peak RSS, predicted {predicted:.1f}"
          f"{'' if ok else '  <- FAIL'}")
    bad |= not ok
sys.exit(1 if bad else 0)
PY
}

run none 1
for ac in selective full; do
  run "$ac" 1 --set train.activation_checkpointing=$ac
  saves none "$ac"
done
run every2 1 --set train.activation_checkpointing=full --set train.ac_every=2
saves none every2
# The check fails when a setting is ignored: the run without selective checkpointing, with the
# prediction of the run with it, standing in for that run.
cp -r "$work/none" "$work/ignored"
sed -i 's/"activation_mib_predicted_per_rank":\[[0-9.]*\]/"activation_mib_predicted_per_rank":['"$(
  grep -o '"activation_mib_predicted_per_rank":\[[0-9.]*\]' "$work/selective/metrics.jsonl" | tail -1 |
  grep -o '[0-9.]*\]' | tr -d ']')"']/' "$work/ignored/metrics.jsonl"
if saves none ignored > /dev/null; then
  echo "FAIL: selective checkpointing ignored (the run's memory unchanged) passed the check"; exit 1
fi
echo "an ignored setting fails the check"

bf16=(--set train.dtype=bf16)
run bf16 1 "${bf16[@]}"
for ac in selective full; do
  run "bf16-$ac" 1 "${bf16[@]}" --set train.activation_checkpointing=$ac
  saves bf16 "bf16-$ac"
done

# Several micro-batches in flight: the first stage holds two under 1f1b, zb1p defers weight halves.
pp=(--set parallel.pp=2 --set train.grad_accum_steps=4)
for schedule in 1f1b zb1p; do
  run "pp2-$schedule" 2 "${pp[@]}" --set parallel.pp_schedule=$schedule
  for ac in selective full; do
    run "pp2-$schedule-$ac" 2 "${pp[@]}" --set parallel.pp_schedule=$schedule \
      --set train.activation_checkpointing=$ac
    saves "pp2-$schedule" "pp2-$schedule-$ac"
  done
done
tp=(--set parallel.tp=2 --set parallel.sequence_parallel=true)
run tp2-sp 2 "${tp[@]}"
run tp2-sp-selective 2 "${tp[@]}" --set train.activation_checkpointing=selective
saves tp2-sp tp2-sp-selective

run logits 1 "${logits[@]}"
run logits-chunk 1 "${logits[@]}" --set train.loss_chunk=256
saves logits logits-chunk
run logits-tp2 2 "${logits[@]}" --set parallel.tp=2
run logits-tp2-chunk 2 "${logits[@]}" --set parallel.tp=2 --set train.loss_chunk=256
saves logits-tp2 logits-tp2-chunk
echo "activation checkpointing and the chunked loss save the memory each run predicts"
