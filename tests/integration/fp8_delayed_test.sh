#!/usr/bin/env bash
# FP8's delayed scaling (docs/precision.md#fp8): each layout of fp8_layouts.sh and Llama at tp 2
# against one process within compare_runs.py's bounds, its rerun bitwise. The amax history in
# each checkpoint is one process's: every layout holds every linear of the model, reduced over
# its shards and slices (tp, ZeRO-3, HSDP, pp's stages, cp's chunks), the first step's weight
# amaxes bit for bit, its other amaxes within rounding (1e-4), the next two steps' within 1e-3
# and later ones within 10% (the runs part as FP8 runs do). A resumed run continues the history bitwise.
# The amax algorithm and history length are used (most_recent is max over a history of 1, and
# neither is max over 1024); fp8 keys that do not apply are errors.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
source "$src/tests/integration/fp8_layouts.sh"
common=("${twenty_steps[@]}")
fp8=(--set train.dtype=fp8 --set train.fp8_recipe=delayed)
llama=(--set model.family=llama --set model.n_kv_heads=2)

fp8_layouts delayed
run delayed-llama 1 "${fp8[@]}" "${llama[@]}"
layout delayed-llama delayed-llama-tp2 2 "${fp8[@]}" "${llama[@]}" --set parallel.tp=2
echo "fp8 delayed: every layout matches one process"

/usr/bin/python3 - "$work" <<'PY'
import glob, json, sys
work = sys.argv[1]
def state(run):
    return json.load(open(sorted(glob.glob(f"{work}/{run}/step_*"))[-1] + "/meta.json"))["fp8"]
ref = state("delayed-ref")
assert len(ref) == 8, f"the reference holds {len(ref)} FP8 linears, not 8"
for run in ["delayed-ref-m2", "delayed-ddp2", "delayed-zero3x2", "delayed-hsdp2x2",
            "delayed-tp2-sp", "delayed-pp2", "delayed-cp2"]:
    s = state(run)
    assert s.keys() == ref.keys(), f"{run} holds the scales of {sorted(s)}, not {sorted(ref)}"
    for name, t in ref.items():
        h, g = t["amax_history"], s[name]["amax_history"]
        assert len(h) == len(g) == 20, f"{run} {name}: history of {len(g)} steps"
        assert g[0][1] == h[0][1], f"{run} {name}: first weight amax {g[0][1]} != {h[0][1]}"
        # Rounding apart, the first step's amaxes are one process's; later the runs part as
        # FP8 runs do (docs/precision.md#fp8), and a single largest element moves a few percent.
        for step, (a, b) in enumerate(zip(h, g)):
            tolerance = 1e-4 if step == 0 else 1e-3 if step < 3 else 0.1
            for k in range(3):
                assert abs(a[k] - b[k]) <= tolerance * a[k], f"{run} {name} step {step + 1}: amax {b} against {a}"
print("every layout's amax history is one process's")
PY

run delayed-resumed 1 "${fp8[@]}" --set train.micro_batch_size=4 --set train.grad_accum_steps=2 \
  --exit-after 10
run delayed-resumed 1 "${fp8[@]}" --set train.micro_batch_size=4 --set train.grad_accum_steps=2 \
  --resume latest
same_bits delayed-ref delayed-resumed 20
echo "a resumed run continues the amax history bitwise"

# The latest amax (any history) is the largest over a history of one step, and not over 1024.
run recent 1 "${fp8[@]}" --set train.fp8_amax_compute_algo=most_recent --set train.fp8_amax_history_len=16
run max-1 1 "${fp8[@]}" --set train.fp8_amax_history_len=1
diff <(numbers "$work/recent") <(numbers "$work/max-1") > /dev/null \
  || { echo "FAIL: most_recent differs from max over a history of 1"; exit 1; }
if diff <(numbers "$work/delayed-ref") <(numbers "$work/recent") > /dev/null; then
  echo "FAIL: the latest amax gave the losses of the largest over 1024 steps"; exit 1
fi
echo "the amax algorithm and the history length are used"

expect_error 1 "$cfg: "'train.fp8_recipe is set but train.dtype = "bf16": it serves fp8 only' \
  --set train.dtype=bf16 --set train.fp8_recipe=current
expect_error 1 "$cfg: "'train.fp8_margin is set but train.fp8_recipe is a tile recipe, whose scales are powers of two with no margin' \
  --set train.dtype=fp8 --set train.fp8_recipe=mxfp8 --set train.fp8_margin=1
expect_error 1 "$cfg: "'train.fp8_amax_history_len is set but train.fp8_recipe is not "delayed": only delayed scaling keeps an amax history' \
  --set train.dtype=fp8 --set train.fp8_recipe=current --set train.fp8_amax_history_len=16
echo "fp8 keys that do not apply are errors"
