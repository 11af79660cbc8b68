#!/usr/bin/env bash
# train.async_checkpoint (docs/checkpoints.md, Async checkpoints):
#  - two ranks at tp 2, a checkpoint every 5 steps: the same losses as synchronous saving, bit for
#    bit, and the same checkpoints: every state file byte for byte, meta.json the same but for the
#    key itself in the stored config; each save line says it was async;
#  - a run stopped at step 10 (--exit-after) and resumed, both async: the same losses and final
#    checkpoint;
#  - training goes on while the files are written: one process whose every thread's first fsync
#    strace holds for 1 s (its syscall delay injection: no hook in cleave), so each save's writer
#    and finisher wait 1 s. The save of step 10 stalls training for far less than that, and steps
#    after it are logged before it is reported complete. A synchronous save there stalls >= 1 s.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
command -v strace > /dev/null || { echo "FAIL: strace is not installed (setup.sh installs it)"; exit 1; }
common=(--set data.dir="$data" --set train.steps=20 --set train.log_interval=1
        --set train.val_interval=10 --set train.checkpoint_interval=5 --set train.keep_checkpoints=10
        --set train.threads=1 --set parallel.comm_timeout_s=60 --set parallel.tp=2)
fail() { echo "FAIL: $*"; exit 1; }

run sync 2
run async 2 --set train.async_checkpoint=true
grep -q "^checkpoints: the state copied at the step's end" "$work/async.log" || fail "no async start line"
for step in 5 10 15 20; do
  dir=$(printf step_%08d $step)
  grep -q "^saved checkpoint $work/async/$dir (async, stall [0-9.]* ms" "$work/async.log" \
    || fail "no async save line for $dir"
  grep -q "^saved checkpoint $work/sync/$dir (stall [0-9.]* ms)$" "$work/sync.log" \
    || fail "no synchronous save line for $dir"
  [ "$(ls "$work/async/$dir" | grep -c safetensors)" -eq 2 ] || fail "async $dir lacks files"
  for f in "$work/sync/$dir"/*.safetensors; do
    cmp -s "$f" "$work/async/$dir/$(basename "$f")" || fail "async $dir/$(basename "$f") differs"
  done
  python3 - "$work/sync/$dir/meta.json" "$work/async/$dir/meta.json" <<'EOF' || fail "meta.json of async $dir differs"
import json, sys
sync, done = (json.load(open(p)) for p in sys.argv[1:])
lines = lambda m: [l for l in m.pop("config").splitlines() if not l.startswith(("async_checkpoint", "out_dir"))]
assert lines(sync) == lines(done), "config"
assert sync == done, "meta.json"
EOF
done
diff <(numbers "$work/sync") <(numbers "$work/async") > /dev/null || fail "async logged other losses"
echo "async: 4 checkpoints identical to synchronous saves, the same losses"

run resumed 2 --set train.async_checkpoint=true --exit-after 10
run resumed 2 --set train.async_checkpoint=true --resume latest
grep -q "^resumed at step 10$" "$work/resumed.log" || fail "the async run did not resume at step 10"
same_bits sync resumed 20
echo "resumed: an async checkpoint resumed with the same losses and final checkpoint"

# Training goes on while a save's files are written (held 1 s in fsync). (Under the sanitized
# build LeakSanitizer cannot run beneath strace's ptrace: leaks are checked by the other runs.)
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
  strace -f -o /dev/null -e trace=fsync -e inject=fsync:delay_enter=1000000:when=1 \
  "$cleave" train "$cfg" "${common[@]}" --set parallel.tp=1 --set train.threads=2 --set train.checkpoint_interval=10 \
  --set train.async_checkpoint=true --set train.out_dir="$work/held" > "$work/held.log" 2>&1 \
  || { tail -5 "$work/held.log"; fail "the held run failed"; }
saved=$(grep -n "^saved checkpoint $work/held/step_00000010 (async" "$work/held.log") \
  || fail "the held run reported no async save of step 10"
stall=$(sed 's/.*stall \([0-9.]*\) ms.*/\1/' <<< "$saved")
awk -v s="$stall" 'BEGIN { exit !(s < 500) }' || fail "the held save of step 10 stalled training $stall ms"
step11=$(grep -n "^step     11/20" "$work/held.log" | cut -d: -f1)
[ -n "$step11" ] && [ "$step11" -lt "${saved%%:*}" ] \
  || fail "step 11 was not logged while step 10's files were being written"
[ -f "$work/held/step_00000020/meta.json" ] || fail "the held run's final checkpoint is missing"
echo "held: step 10's save stalled training $stall ms while its files took over 1 s"
