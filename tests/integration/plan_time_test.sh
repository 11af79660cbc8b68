#!/usr/bin/env bash
# `cleave plan --cluster` and `--search` as a user runs them (docs/planner.md, Step time and
# Search): the step's prediction per stage and in all, in text and JSON, tokens/s agreeing with
# the step time; the ranked layouts and the winner's explanation; the errors of a search without
# a cluster and of a layout whose links the cluster does not describe.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=$src/tests/configs/tiny_train.toml cluster=$src/clusters/epyc_zen3_2core.toml
fail() { echo "FAIL: $1"; cat "$work/out" 2>/dev/null; exit 1; }

"$cleave" plan "$cfg" --world 2 --set data.dir="$data" --set parallel.pp=2 \
  --set train.grad_accum_steps=4 --cluster "$cluster" --json "$work/plan.json" > "$work/out"
grep -q "^predicted step on epyc_zen3_2core (2 devices per host" "$work/out" || fail "no prediction"
grep -qE "^  1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +0\.0 +[0-9.]+ +[0-9.]+  pp " "$work/out" \
  || fail "no line for stage 1 with its pp transfers"
grep -qE "^step [0-9.]+ ms, [0-9]+ tokens/s, MFU [0-9.]+% of the fp32 GEMM peak" "$work/out" \
  || fail "no step line"
/usr/bin/python3 - "$work/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
step = p["step"]
assert step["cluster"] == "epyc_zen3_2core", step
assert len(step["stages"]) == 2, step
assert step["step_s"] == max(s["end_s"] for s in step["stages"]), step
assert step["stages"][1]["pipeline_wait_s"] >= 0 and step["stages"][0]["pipeline_wait_s"] > 0, step
assert 0 < step["mfu"] < 1, step
print("prediction:", step["step_s"], "s,", step["tokens_per_s"], "tokens/s")
PY

# A cluster whose ranks compute unevenly: the same plan's compute stretched by compute_imbalance,
# shown as its own column and said above the table.
sed 's/^memory_gbps = .*/&\ncompute_imbalance = 1.25/' "$cluster" > "$work/uneven.toml"
"$cleave" plan "$cfg" --world 2 --set data.dir="$data" --set parallel.pp=2 \
  --set train.grad_accum_steps=4 --cluster "$work/uneven.toml" --json "$work/uneven.json" > "$work/out"
grep -q "^  (compute x 1.25: the slowest of the ranks that wait for each other" "$work/out" \
  || fail "the stretch is not said"
# Each stage's imbalance column is a quarter of its compute (to the table's 0.1 ms).
awk '/^  stage +products / { on = 1; next } on && /^  [0-9]+ / { n++
       if ($5 <= 0 || ($5 - 0.25 * ($2 + $3 + $4)) ^ 2 > 0.01) bad = 1 }
     END { exit !(n == 2 && !bad) }' "$work/out" || fail "the imbalance column is not the stretch"
/usr/bin/python3 - "$work/plan.json" "$work/uneven.json" <<'PY'
import json, sys
even, uneven = (json.load(open(f))["step"] for f in sys.argv[1:])
for e, u in zip(even["stages"], uneven["stages"]):
    assert e["imbalance_s"] == 0, e
    compute = e["products_s"] + e["attention_s"] + e["elementwise_s"]
    assert abs(u["imbalance_s"] - 0.25 * compute) < 1e-9 * compute, (e, u)
assert uneven["step_s"] > even["step_s"], (even, uneven)
print("uneven ranks:", uneven["step_s"], "s against", even["step_s"])
PY

"$cleave" plan "$cfg" --world 2 --set data.dir="$data" --cluster "$cluster" --search --top 3 \
  --json "$work/search.json" > "$work/out"
grep -qE "^search on epyc_zen3_2core: [0-9]+ valid layouts of 2 devices; .* planned in full \([0-9]+ fit\)" "$work/out" \
  || fail "no search header"
[ "$(grep -cE '^ +[1-3] +[0-9]+ +[0-9.]+ +[0-9.]+% +[0-9.]+  ' "$work/out")" = 3 ] \
  || fail "not 3 ranked layouts"
grep -qE "predicts [0-9]* tokens/s against [0-9]* for .*; the largest difference| tie at [0-9]+ tokens/s \(their slowest stages end together\)" "$work/out" \
  || fail "no explanation of the winner"
/usr/bin/python3 - "$work/search.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["search"]
best = [r["tokens_per_s"] for r in s["best"]]
assert len(best) == 3 and best == sorted(best, reverse=True), s
assert s["valid"] > 20 and s["valid"] == s["beyond_memory"] + s["beyond_time"] + s["planned"], s
print(s["valid"], "valid layouts,", s["planned"], "planned in full; the best", s["best"][0]["layout"])
PY

if "$cleave" plan "$cfg" --world 2 --set data.dir="$data" --search > "$work/out" 2>&1; then
  fail "--search ran without a cluster"
fi
grep -q "cleave: error: cleave plan: --search ranks layouts by predicted time and needs --cluster" \
  "$work/out" || fail "no clear error for --search without --cluster"
if "$cleave" plan "$cfg" --world 4 --set data.dir="$data" --cluster "$cluster" > "$work/out" 2>&1; then
  fail "4 ranks planned on a cluster of 2 per host that describes no inter_host links"
fi
grep -q "does not describe its inter_host links (collectives.inter_host)" "$work/out" \
  || fail "no error naming the missing link class"
echo "plan --cluster and --search: ok"
