#!/usr/bin/env bash
# optim.offload = "file": AdamW's moments in memory-mapped files, streamed through memory during
# the update; parallel.offload_params = "file": ZeRO-3's fp32 master shards too, read in for each
# unit's gather and for the update. Bitwise the run that keeps them in memory (losses, norms,
# checkpoint files): one process, with accumulation and bf16; DDP 2 (each rank's whole moments),
# ZeRO-1 and ZeRO-3 x 2 (its shards), tp 2, ZeRO-3 x 2 with its shards offloaded (alone and with
# the moments, and in bf16); runs stopped at step 10 and resumed from their checkpoints. The
# resident memory falls by about the moments' 8 bytes per parameter, and 4 more with the
# shards. Bad values are errors naming the key or the folder.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}"
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
offload=(--set optim.offload=file)

# offloaded NAME RANKS [--set ...]: the layout in memory and offloaded, bit for bit.
offloaded() {
  local name=$1 np=$2; shift 2
  run "$name" "$np" "$@"
  run "$name-offload" "$np" "$@" "${offload[@]}" --set optim.offload_dir="$work/$name-moments"
  same_bits "$name" "$name-offload" 20
  [ -z "$(ls -A "$work/$name-moments")" ] || { echo "FAIL: $name left files in its offload folder"; exit 1; }
}
offloaded one 1
offloaded bf16 1 --set train.dtype=bf16
offloaded ddp2 2 --set parallel.dp_shard=2
offloaded zero1x2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=1
offloaded zero3x2 2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
offloaded tp2 2 --set parallel.tp=2
params=(--set parallel.offload_params=file)
zero3=(--set parallel.dp_shard=2 --set parallel.zero_stage=3)
run zero3x2-params 2 "${zero3[@]}" "${params[@]}"
same_bits zero3x2 zero3x2-params 20
run zero3x2-both 2 "${zero3[@]}" "${params[@]}" "${offload[@]}"
same_bits zero3x2 zero3x2-both 20
run zero3x2-bf16 2 "${zero3[@]}" --set train.dtype=bf16
run zero3x2-bf16-both 2 "${zero3[@]}" --set train.dtype=bf16 "${params[@]}" "${offload[@]}"
same_bits zero3x2-bf16 zero3x2-bf16-both 20
echo "offloaded moments and ZeRO-3 shards give the same bits as in memory in every layout"

run resumed 2 --set parallel.dp_shard=2 --set parallel.zero_stage=1 "${offload[@]}" --exit-after 10
run resumed 2 --set parallel.dp_shard=2 --set parallel.zero_stage=1 "${offload[@]}" --resume latest
grep -q "resumed at step 10" "$work/resumed.log" || { echo "FAIL: no resume"; exit 1; }
same_bits zero1x2 resumed 20
run resumed3 2 "${zero3[@]}" "${params[@]}" "${offload[@]}" --exit-after 10
run resumed3 2 "${zero3[@]}" "${params[@]}" "${offload[@]}" --resume latest
same_bits zero3x2 resumed3 20
echo "offloaded runs resumed from their checkpoints continue bitwise"

# Resident memory: 10.6M parameters (81 MiB of moments), no checkpoint (its writer pages the
# moments in whole); the peak RSS on the last step's line, logged before anything else runs.
wide=(--set model.d_model=384 --set model.n_heads=4 --set model.n_layers=6 --set train.steps=3
      --set train.checkpoint_interval=-1 --set train.val_interval=0)
rss() { grep -o '"peak_rss_mib":[0-9.]*' "$work/$1/metrics.jsonl" | tail -1 | cut -d: -f2; }
saved() {  # NAME-in-memory NAME-offloaded BYTES-PER-PARAMETER FILES
  local count
  count=$(grep -o "[0-9]* parameters" "$work/$1.log" | cut -d' ' -f1)
  /usr/bin/python3 - "$(rss "$1")" "$(rss "$2")" "$count" "$3" "$4" <<'PY'
import sys
mem, off, count, per, files = (float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]),
                               int(sys.argv[4]), int(sys.argv[5]))
state = per * count / 2**20
print(f"peak RSS {mem:.0f} MiB in memory, {off:.0f} MiB offloaded: {mem - off:.0f} MiB less, "
      f"the offloaded state being {state:.0f} MiB")
# What stays resident is the window the update streams through: at most 4 spans of 4 MiB of each
# file (the span in hand, the one read ahead, and those not yet dropped).
if mem - off < state - 16 * files:
    sys.exit(f"FAIL: offloading saved less than the state's memory minus its {16 * files} MiB window")
PY
}
run wide 1 "${wide[@]}"
run wide-offload 1 "${wide[@]}" "${offload[@]}"
saved wide wide-offload 8 2
run wide-zero3 1 "${wide[@]}" --set parallel.zero_stage=3
run wide-zero3-both 1 "${wide[@]}" --set parallel.zero_stage=3 "${offload[@]}" "${params[@]}"
saved wide-zero3 wide-zero3-both 12 3

expect_error 1 "$cfg: optim.offload = \"disk\" is not one of \"none\", \"file\"" --set optim.offload=disk
expect_error 1 "$cfg: optim.offload_dir is set but neither optim.offload nor parallel.offload_params is \"file\"" \
  --set optim.offload_dir=/tmp
expect_error 1 "$cfg: parallel.offload_params = \"file\" needs parallel.zero_stage = 3 (it is 1): below it every rank holds whole parameters" \
  "${params[@]}" --set parallel.zero_stage=1
expect_error 1 "$cfg: parallel.offload_params = \"nvme\" is not one of \"none\", \"file\"" \
  --set parallel.offload_params=nvme
expect_error 1 "cannot make the offload file for adam_m in /proc/cleave-none: No such file or directory" \
  "${offload[@]}" --set optim.offload_dir=/proc/cleave-none
echo "bad offload settings are errors"
