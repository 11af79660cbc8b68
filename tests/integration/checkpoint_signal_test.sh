#!/usr/bin/env bash
# train.checkpoint_on_signal (docs/checkpoints.md, Preemption): a SIGTERM mid-run saves a checkpoint
# at the next step's end, on a step every rank agrees on, and the ranks exit with 0; --resume latest
# then continues with the uninterrupted run's losses, bit for bit (the same layout). Four ranks,
# tp 2 x ZeRO-1 over dp_shard 2, so that every rank writes a file:
#  (a) every rank gets SIGTERM, as Slurm signals every task of a job it preempts or cancels;
#  (b) one rank gets it (a launcher that signals only some): it tells the others at the step's end;
#  (c) mpirun gets it: Open MPI 4's mpirun waits odls_base_sigkill_timeout seconds, sends SIGTERM
#      to every rank, waits as long again and kills them; the save fits in between, and a single
#      process resumes the checkpoint (reading and verifying all of it);
#  (d) one process gets a second SIGTERM while it saves: it ends at once, killed by the signal, and
#      the checkpoint it was writing never appears. strace holds the save in its first fsync for
#      2 s (its syscall delay injection: no hook in cleave), so the second signal lands mid-save.
# Without the key, SIGTERM ends a rank with the communication report (comm_fault_test.sh).
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
# shellcheck source=tests/integration/signals_routed.sh
source "$src/tests/integration/signals_routed.sh"
command -v strace > /dev/null || { echo "FAIL: strace is not installed (setup.sh installs it)"; exit 1; }
steps=30
common=(--set data.dir="$data" --set train.steps=$steps --set train.log_interval=1
        --set train.val_interval=0 --set train.checkpoint_interval=-1 --set train.threads=1
        --set parallel.comm_timeout_s=60 --set parallel.tp=2 --set parallel.dp_shard=2
        --set parallel.zero_stage=1)
run ref 4

job=
fail() {
  echo "FAIL: $*"
  [ -n "$job" ] && kill -KILL "$job" 2> /dev/null
  exit 1
}
# wait_for PATTERN FILE: until FILE holds a line matching PATTERN (60 s at most).
wait_for() {
  for _ in $(seq 600); do
    grep -q "$1" "$2" 2> /dev/null && return 0
    sleep 0.1
  done
  tail -20 "$2"
  fail "no /$1/ in $2"
}
# stopped NAME RC: run NAME ended with exit code RC after saving at a step before the last; sets
# step.
stopped() {
  local log=$work/$1.log
  step=$(sed -n 's/^SIGTERM: saving checkpoint at step \([0-9]*\) before exit$/\1/p' "$log")
  [ "$2" -eq 0 ] || { tail -20 "$log"; fail "$1 exited with $2"; }
  [ -n "$step" ] && [ "$step" -lt $steps ] || { tail -20 "$log"; fail "$1 did not save on SIGTERM"; }
  grep -q "^exiting at step $step after SIGTERM" "$log" || fail "$1 did not exit at step $step"
  [ -f "$work/$1/$(printf step_%08d "$step")/meta.json" ] || fail "$1 has no checkpoint of step $step"
  ! ls -d "$work/$1"/*.tmp-* 2> /dev/null || fail "$1 left a temporary folder"
  ! grep -q "terminated by signal" "$log" || fail "$1 ended a rank by the signal"
}
# resumed NAME: --resume latest continues NAME from its step and logs the reference's numbers.
resumed() {
  run "$1" 4 --resume latest
  grep -q "^resumed at step $step$" "$work/$1.log" || fail "$1 did not resume at step $step"
  ! grep -q "skipping" "$work/$1.log" || fail "$1 skipped its checkpoint"
  diff <(numbers "$work/ref") <(numbers "$work/$1") > /dev/null || fail "$1 logged other losses than ref"
  echo "$1: saved at step $step on SIGTERM, resumed with the reference's losses"
}
# signalled NAME WHO: a run with the key, which WHO ("all" or "one" of its ranks) gets SIGTERM once
# it has logged step 3.
signalled() {
  mpirun --oversubscribe -np 4 "$cleave" train "$cfg" "${common[@]}" \
    --set train.checkpoint_on_signal=true --set train.out_dir="$work/$1" > "$work/$1.log" 2>&1 &
  job=$!
  wait_for '"step":3,' "$work/$1/metrics.jsonl"
  local ranks
  ranks=$(pgrep -P "$job")  # mpirun starts the ranks itself
  [ "$(wc -w <<< "$ranks")" -eq 4 ] || fail "expected 4 ranks under mpirun $job, found: $ranks"
  # shellcheck disable=SC2086
  signals_routed $ranks  # the SIGTERM lands on no thread that computes
  [ "$2" = all ] || ranks=$(tail -1 <<< "$ranks")
  kill -TERM $ranks
  rc=0
  wait "$job" || rc=$?
  job=
  stopped "$1" $rc
  local told
  told=$(grep -c "received SIGTERM: a checkpoint is saved at the next step's end" "$work/$1.log")
  [ "$told" -eq "$(wc -w <<< "$ranks")" ] || fail "$1: $told ranks say they received SIGTERM"
}

signalled all all
resumed all
signalled one one
resumed one

# (c) Through mpirun, with 2 s for the save (30 s for a sanitized build, whose save takes longer).
# A long run, rarely logged: while mpirun waits it does not read the ranks' output, and a rank that
# fills its terminal's buffer (about 4 KB) would block.
grace=2
! ldd "$cleave" | grep -q libasan || grace=30
mpirun --oversubscribe --mca odls_base_sigkill_timeout $grace -np 4 "$cleave" train "$cfg" "${common[@]}" \
  --set train.steps=1000000 --set train.log_interval=100000 --set train.checkpoint_on_signal=true \
  --set train.out_dir="$work/mpirun" > "$work/mpirun.log" 2>&1 &
job=$!
wait_for "^checkpoints: SIGTERM saves one" "$work/mpirun.log"
kill -TERM "$job"
rc=0
wait "$job" || rc=$?
job=
# mpirun itself exits with 1 after a SIGTERM (Open MPI 4), whatever its ranks' exit codes.
steps=1000000 stopped mpirun 0
"$cleave" train "$cfg" --set data.dir="$data" --set train.steps="$step" --set train.val_interval=0 \
  --set train.out_dir="$work/mpirun" --resume latest > "$work/mpirun-resume.log" 2>&1 \
  || { tail -5 "$work/mpirun-resume.log"; fail "one process could not resume mpirun's checkpoint"; }
grep -q "^resumed at step $step$" "$work/mpirun-resume.log" || fail "mpirun's checkpoint did not resume"
echo "mpirun: mpirun exited with $rc, the ranks saved step $step and exited with 0"

# (d) A second SIGTERM while saving. (LeakSanitizer cannot run beneath strace's ptrace.)
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
  strace -f -o /dev/null -e trace=fsync -e inject=fsync:delay_enter=2000000 \
  "$cleave" train "$cfg" --set data.dir="$data" --set train.steps=1000000 \
  --set train.log_interval=100000 --set train.checkpoint_interval=-1 \
  --set train.checkpoint_on_signal=true --set train.out_dir="$work/twice" > "$work/twice.log" 2>&1 &
job=$!
wait_for "^checkpoints: SIGTERM saves one" "$work/twice.log"
pid=$(pgrep -P "$job")  # cleave, strace's child
kill -TERM "$pid"
for _ in $(seq 600); do
  ls -d "$work"/twice/step_*.tmp-* > /dev/null 2>&1 && break
  sleep 0.1
done
ls -d "$work"/twice/step_*.tmp-* > /dev/null 2>&1 || fail "the first SIGTERM started no save"
t0=$(date +%s)
kill -TERM "$pid"
rc=0
wait "$job" || rc=$?
job=
[ "$rc" -eq 143 ] || { tail -5 "$work/twice.log"; fail "a second SIGTERM while saving: exit $rc, not 143 (killed by SIGTERM)"; }
grep -q "terminated by signal 15 (a second SIGTERM" "$work/twice.log" \
  || { tail -20 "$work/twice.log"; fail "no report of the second SIGTERM"; }
[ -z "$(find "$work/twice" -maxdepth 1 -regextype egrep -regex '.*/step_[0-9]+')" ] \
  || fail "the save the second SIGTERM cut short appeared"
echo "twice: a second SIGTERM while saving ended the process in $(( $(date +%s) - t0 )) s"
