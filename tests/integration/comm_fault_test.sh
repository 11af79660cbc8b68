#!/usr/bin/env bash
# Communication faults end in a report and a non-zero exit, never a hang; other errors end without
# one:
#  (a) stall: one rank sleeps past the 3 s timeout before joining a collective: the others time
#      out, print which rank is behind at which sequence number, and abort the job;
#      the same at a gatherv to rank 0 (cleave serve's gather of its lanes' logits);
#  (b) kill: one rank kills itself (SIGKILL): mpirun stops the others with SIGTERM and they print
#      which rank died where;
#  (c) fail: one rank throws an error of its own: it prints it once and aborts the job; the others,
#      stopped with SIGTERM, print no report;
#  (d) fail-all: every rank throws an EveryRankError: rank 0 prints it, no abort, no report.
# However the job ends, its status folder is removed: by its ranks, or, where mpirun killed them
# outright (SIGKILL, which it sends a second after SIGTERM to a rank still running), by the next
# job's start in the same status folder.
# Args: the cleave binary (its folder holds tests/comm_fault_probe), the source folder, test data.
set -u
probe="$(dirname "$1")/tests/comm_fault_probe"
[ -x "$probe" ] || { echo "FAIL: $probe not built"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
timeout_s=3
# From the fault to the end of the job: the timeout, then the report and the job's teardown, which
# take well under a second on an idle machine and a few on a loaded one.
bound_s=$((timeout_s + 10))

run() {  # name mode np victim [status] -> sets rc, secs (from the fault to the end); output in
         # $out/name.log; the job's status folder goes into $out/status-<status, default name>
  local status=$out/status-${5:-$1}
  mkdir -p "$status"
  timeout 60 mpirun --oversubscribe -np "$3" "$probe" "$2" "$4" "$timeout_s" "$status" \
    >"$out/$1.log" 2>&1
  rc=$?
  local end
  end=$(date +%s.%N)
  # Every rank prints the wall-clock time at which it reaches collective #6, where the fault is.
  secs=$(awk -v end="$end" '/^probe: rank [0-9]+ at collective #6 at / {
           if (start == "" || $NF < start) start = $NF }
         END { if (start == "") print "unknown"; else printf "%.1f", end - start }' "$out/$1.log")
  if [ "$1" != kill ] && [ -n "$(ls -A "$status")" ]; then
    echo "FAIL ($1): the job left a status folder: $(ls -A "$status")"; fail=1
  fi
}

expect() {  # name pattern
  if ! grep -qE "$2" "$out/$1.log"; then
    echo "FAIL ($1): output lacks /$2/"
    fail=1
  fi
}

expect_ended() {  # name: a non-zero exit, not the 60 s guard, within bound_s of the fault
  echo "$1: exit $rc, ${secs} s after the fault"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$secs" = unknown ] ||
     awk -v s="$secs" -v b="$bound_s" 'BEGIN { exit !(s > b) }'; then
    echo "FAIL ($1): expected a non-zero exit (not the 60 s guard) within $bound_s s of the fault"
    fail=1
  fi
}

expect_once_without_report() {  # name message
  local n
  n=$(grep -cF -- "$2" "$out/$1.log")
  [ "$n" -eq 1 ] || { echo "FAIL ($1): '$2' printed $n times, expected once"; fail=1; }
  if grep -qE 'flight recorder|terminated by signal|status of the' "$out/$1.log"; then
    echo "FAIL ($1): a comm report for an error that is no communication fault"; fail=1
  fi
}

run ok ok 3 1
if [ "$rc" -ne 0 ]; then echo "FAIL (ok): exit $rc"; cat "$out/ok.log"; fail=1; fi

run stall stall 3 1
expect_ended stall
expect stall 'TIMEOUT on rank [02]: all_reduce #6 on group "world"'
expect stall 'BEHIND \(not started it\): +rank 1 \(at #5 all_reduce'
expect stall 'flight recorder of rank [02]'

# (a') the same at a gatherv to rank 0, as cleave serve gathers its ep lanes' logit rows: rank 0
# times out naming it.
run stall-gather stall-gather 2 1
expect_ended stall-gather
expect stall-gather 'TIMEOUT on rank 0: gatherv #6 on group "world"'
expect stall-gather 'BEHIND \(not started it\): +rank 1 \(at #5 all_reduce'

run kill kill 3 2
expect_ended kill
expect kill 'rank [01] terminated by signal 15'
expect kill 'DEAD: +rank 2 \(at #5 all_reduce'
# The next job in the same status folder removes what a killed job's ranks could not.
run after-kill ok 3 1 kill
[ "$rc" -eq 0 ] || { echo "FAIL (after-kill): exit $rc"; fail=1; }

run fail fail 3 1
expect_ended fail
expect_once_without_report fail 'cleave: error: rank 1: probe: rank 1 fails alone'

run fail-all fail-all 3 1
expect_ended fail-all
expect_once_without_report fail-all 'cleave: error: probe: every rank fails alike'
if grep -q MPI_ABORT "$out/fail-all.log"; then echo "FAIL (fail-all): MPI_Abort called"; fail=1; fi

if [ "$fail" -ne 0 ]; then
  for f in "$out"/*.log; do echo "==== $f"; cat "$f"; done
  exit 1
fi
echo "comm fault test: OK"
