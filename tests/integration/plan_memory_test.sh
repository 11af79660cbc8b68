#!/usr/bin/env bash
# `cleave plan`'s memory per rank against the peak resident memory measured (docs/planner.md,
# Memory), for every layout family: one rank in fp32, bf16 and FP8, full and selective
# activation checkpointing, DDP and ZeRO-1/2/3 over 2 ranks, HSDP over 4, tp 2 with and without
# sequence parallelism, pp 2 with 4 micro-batches, cp 2 and ep 2 (3 steps of a 4-block d_model 512
# model, where the model state and activations are most of the resident memory; ep's experts
# keep it near that). What a process holds before any model (MPI, oneDNN, OpenMP, the binary) is
# the runtime overhead: measured once per rank count as a d_model 32 run's peak less its own plan,
# and added. A MoE process holds about 8 MiB more than a dense one of the same tiny shape, with or
# without ep (27 against 35 MiB at 2 ranks on the Xeon; not found yet: not oneDNN primitives, which
# the experts' variable rows keep at one per product, nor the shared scratchpad): ep 2 takes its
# overhead from a d_model 32 MoE run at ep 2. Each rank must come within 5% of its measured peak:
# on the Zen 5 and on a Xeon with AMX every rank of fp32, ZeRO-3, tp 2 and pp 2 came within 0.6%; a plan that leaves out the
# backward scratch (-7%) falls outside it. On an AVX2 CPU (AMD Zen 3), where bf16 and FP8
# products are emulated, bf16 came to -0.3% and FP8 to -1.5% once the products' per-thread
# buffers were planned (-3.6% and +5.6% before), and every other rank within 3.2% (cp 2).
# The processes run with a fixed glibc mmap threshold, so that a freed block larger than 128 KiB
# goes back to the system: the test holds the plan to the memory a process uses. With glibc's
# default, oneDNN's AVX2 products (no AVX-512: no user scratchpad for their packing) allocate
# and free their packing buffers (2.4 MiB here) at every call, glibc moves such blocks onto the
# heap after the first, and what the heap keeps of them varies from run to run with how other
# threads' frees interleave: ZeRO-1 rank 1 measured 234.7 to 244.0 MiB over runs where it uses
# 230.5 to 231.0 (those buffers alone mapped and unmapped at each call: the same 230.5-231.0 as
# the fixed threshold). On AVX-512 CPUs the products take their scratch from cleave, and the
# threshold changes nothing but speed.
export MALLOC_MMAP_THRESHOLD_=131072
# ep 2 is planned from the run's measured routing (`cleave plan --routing`), each rank as its ep
# rank (their experts' rows differ, at the step that gave each the most): these 3 steps route
# most rows to two experts (load max / mean 3.4-4.0), and the balanced plan, printed beside, came
# to -5.1% and -6.6% on the Xeon, the routed one to -3.8% and -3.9% with the dense overhead (it
# measured -3.8% to -5.2% over runs) and -2.1% and -2.5% with the MoE one.
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

big=(--set model.d_model=512)
dp2=(--set parallel.dp_shard=2)
planned overhead1 1 --set model.d_model=32
planned overhead2 2 --set model.d_model=32 "${dp2[@]}"
planned overhead4 4 --set model.d_model=32 --set parallel.dp_shard=4
moe=(--set parallel.ep=2 --set model.moe_experts=8 --set model.moe_top_k=2)
planned overhead2_moe 2 --set model.d_model=32 "${dp2[@]}" "${moe[@]}" --set model.moe_ffn_hidden=64
planned fp32 1 "${big[@]}"
planned bf16 1 "${big[@]}" --set train.dtype=bf16
planned fp8 1 "${big[@]}" --set train.dtype=fp8
planned ac_full 1 "${big[@]}" --set train.activation_checkpointing=full
planned ac_selective 1 "${big[@]}" --set train.activation_checkpointing=selective
planned ddp 2 "${big[@]}" "${dp2[@]}"
planned zero1 2 "${big[@]}" "${dp2[@]}" --set parallel.zero_stage=1
planned zero2 2 "${big[@]}" "${dp2[@]}" --set parallel.zero_stage=2
planned zero3 2 "${big[@]}" "${dp2[@]}" --set parallel.zero_stage=3
planned hsdp 4 "${big[@]}" --set parallel.dp_replicate=2 "${dp2[@]}" --set parallel.zero_stage=3
planned tp2 2 "${big[@]}" --set parallel.tp=2
planned tp2_sp 2 "${big[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
planned pp2 2 "${big[@]}" --set parallel.pp=2 --set train.micro_batch_size=2 \
  --set train.grad_accum_steps=4
planned cp2 2 "${big[@]}" --set parallel.cp=2
planned ep2 2 "${big[@]}" "${dp2[@]}" "${moe[@]}" --set model.moe_ffn_hidden=1024
"$cleave" plan "$cfg" --world 2 --set data.dir="$data" "${common[@]}" "${big[@]}" "${dp2[@]}" \
  "${moe[@]}" --set model.moe_ffn_hidden=1024 --routing "$work/ep2" --json "$work/ep2_routed.json" \
  > /dev/null

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
# Keyed by rank count; MoE at ep 2 by its own run ("ep2"). Each layout names the one it runs like.
for key, name in ((1, "overhead1"), (2, "overhead2"), (4, "overhead4"), ("ep2", "overhead2_moe")):
    overhead[key] = max(peak(name)) - plan(name)[0][0]
    print(f"runtime overhead of {name}: {overhead[key]:.1f} MiB")
failed = []
for name, runs_like in (("fp32", 1), ("bf16", 1), ("fp8", 1), ("ac_full", 1), ("ac_selective", 1),
                       ("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("hsdp", 4),
                       ("tp2", 2), ("tp2_sp", 2), ("pp2", 2), ("cp2", 2), ("ep2", "ep2")):
    totals, stages = plan(name)
    measured = peak(name)
    for rank, rss in enumerate(measured):
        stage = rank if len(totals) > 1 else 0
        runtime = overhead[runs_like]
        predicted = runtime + totals[stage]
        error = predicted / rss - 1
        s = stages[stage]
        parts = ", ".join(f"{k} {s[k] / 2**20:.1f}" for k in
                          ("values", "gradients", "optimizer", "weight_copies", "activations",
                           "backward_scratch", "product_scratch", "comm_buffers"))
        print(f"{name} rank {rank}: planned {predicted:.1f} MiB ({parts}), measured {rss:.1f}: "
              f"{100 * error:+.1f}%")
        if name == "ep2":
            # Held to its ep rank's plan from the run's routing; the balanced one is printed.
            routed = json.load(open(f"{work}/ep2_routed.json"))["ep_ranks"][rank]
            error = (runtime + routed["total"] / 2**20) / rss - 1
            print(f"ep2 rank {rank} from the run's routing: planned "
                  f"{runtime + routed['total'] / 2**20:.1f} MiB (activations "
                  f"{routed['activations'] / 2**20:.1f}): {100 * error:+.1f}%")
        if abs(error) > 0.05:
            failed.append(f"{name} rank {rank}")
if failed:
    sys.exit("FAIL: planned memory off by more than its bound at " + ", ".join(failed))
print("every rank's planned memory within 5% of its measured peak (ep 2: from its routing)")
PY
