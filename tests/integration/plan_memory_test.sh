#!/usr/bin/env bash
# `cleave plan`'s memory per rank against the peak resident memory measured (docs/planner.md,
# Memory): one rank in fp32, ZeRO-3 over 2 ranks, tp 2 and pp 2 with 4 micro-batches
# (3 steps of a 4-block d_model 512 model, where the model state and activations are most of the
# resident memory). What a process holds before any model (MPI, oneDNN, OpenMP, the binary) is
# the runtime overhead: measured once per rank count as a d_model 32 run's peak less its own plan,
# and added. bf16 is left out: where its products are emulated (AVX2 CPUs) the per-thread fp32
# operand buffers are not in the plan yet (measured -4.0% and -5.7%). Each rank must come within
# 6% of its measured peak (pp2's rank 0 measured -3.6% to -5.1% over runs of the same build, the
# suite running beside it); a plan that leaves out the backward scratch (-7%) falls outside it.
# ZeRO-3 measured -2.6% to -4.5% once the plan counted the communication engine's scratch (before:
# 12-22 MiB above the plan, held to 10%); what is left at 2 ranks grows with the collectives'
# size (MPI's own buffers) and keeps the bound from 5% (issue 32). On a Zen 5 (AVX-512: blocked
# weight copies) every rank came within 0.5%, ZeRO-3 once its copies were held from their product
# to their release (+14% with its two largest units' whole copies).
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set model.n_layers=4 --set model.n_heads=4 --set model.max_seq_len=64
        --set train.seq_len=64 --set train.micro_batch_size=8 --set train.steps=3
        --set train.log_interval=1 --set train.val_interval=0 --set train.checkpoint_interval=0
        --set train.threads=1)

planned() {  # name ranks [--set ...]: the plan, then the run, of one layout
  local name=$1 np=$2; shift 2
  "$cleave" plan "$cfg" --world "$np" --set data.dir="$data" "${common[@]}" "$@" \
    --json "$work/$name.json" > "$work/$name.plan"
  run "$name" "$np" "$@"
}

planned overhead1 1 --set model.d_model=32
planned overhead2 2 --set model.d_model=32 --set parallel.dp_shard=2
planned fp32 1 --set model.d_model=512
planned zero3 2 --set model.d_model=512 --set parallel.dp_shard=2 --set parallel.zero_stage=3
planned tp2 2 --set model.d_model=512 --set parallel.tp=2
planned pp2 2 --set model.d_model=512 --set parallel.pp=2 --set train.micro_batch_size=2 \
  --set train.grad_accum_steps=4

/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def plan(name):  # MiB per rank: a pp rank's stage, the same on every rank of a stage
    stages = json.load(open(f"{work}/{name}.json"))["stages"]
    return [s["total"] / 2**20 for s in stages], stages
def peak(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if "peak_rss_mib_per_rank" in l]
    return rows[-1]["peak_rss_mib_per_rank"]
overhead = {}
for np, name in ((1, "overhead1"), (2, "overhead2")):
    overhead[np] = max(peak(name)) - plan(name)[0][0]
    print(f"runtime overhead at {np} rank{'s' if np > 1 else ''}: {overhead[np]:.1f} MiB")
failed = []
for name, np in (("fp32", 1), ("zero3", 2), ("tp2", 2), ("pp2", 2)):
    totals, stages = plan(name)
    measured = peak(name)
    for rank, rss in enumerate(measured):
        stage = rank if len(totals) > 1 else 0
        predicted = overhead[np] + totals[stage]
        error = predicted / rss - 1
        s = stages[stage]
        parts = ", ".join(f"{k} {s[k] / 2**20:.1f}" for k in
                          ("values", "gradients", "optimizer", "weight_copies", "activations",
                           "backward_scratch", "comm_buffers"))
        print(f"{name} rank {rank}: planned {predicted:.1f} MiB ({parts}), measured {rss:.1f}: "
              f"{100 * error:+.1f}%")
        if abs(error) > 0.06:
            failed.append(f"{name} rank {rank}")
if failed:
    sys.exit("FAIL: planned memory off by more than 6% at " + ", ".join(failed))
print("every rank's planned memory within 6% of its measured peak")
PY
