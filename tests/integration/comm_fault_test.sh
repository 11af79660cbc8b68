#!/usr/bin/env bash
# Communication faults end in a report and a non-zero exit, never a hang:
#  (a) stall: one rank sleeps past the 3 s timeout before joining a collective: the others time
#      out, print which rank is behind at which sequence number, and abort the job;
#  (b) kill: one rank kills itself (SIGKILL): mpirun stops the others with SIGTERM and they print
#      which rank died where.
# Args: the cleave binary (its folder holds tests/comm_fault_probe), the source folder, test data.
set -u
probe="$(dirname "$1")/tests/comm_fault_probe"
[ -x "$probe" ] || { echo "FAIL: $probe not built"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
out=$(mktemp -d)
# Ranks that die or abort leave their status folder (/tmp/cleave-<id>, named in the reports).
cleanup() {
  grep -ohE '/tmp/cleave-[0-9]+-[0-9]+' "$out"/*.log 2>/dev/null | sort -u | xargs -r rm -rf
  rm -rf "$out"
}
trap cleanup EXIT
fail=0

run() {  # name mode np victim -> sets rc, secs; output in $out/name.log
  local start=$SECONDS
  timeout 60 mpirun --oversubscribe -np "$3" "$probe" "$2" "$4" 3 >"$out/$1.log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
}

expect() {  # name pattern
  if ! grep -qE "$2" "$out/$1.log"; then
    echo "FAIL ($1): output lacks /$2/"
    fail=1
  fi
}

run ok ok 3 1
if [ "$rc" -ne 0 ]; then echo "FAIL (ok): exit $rc"; cat "$out/ok.log"; fail=1; fi

run stall stall 3 1
echo "stall: exit $rc after ${secs}s"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$secs" -gt 15 ]; then
  echo "FAIL (stall): expected a non-zero exit (not the 60 s guard) within 15 s"; fail=1
fi
expect stall 'TIMEOUT on rank [02]: all_reduce #6 on group "world"'
expect stall 'BEHIND \(not started it\): +rank 1 \(at #5 all_reduce'
expect stall 'flight recorder of rank [02]'

run kill kill 3 2
echo "kill: exit $rc after ${secs}s"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$secs" -gt 30 ]; then
  echo "FAIL (kill): expected a non-zero exit (not the 60 s guard) within 30 s"; fail=1
fi
expect kill 'rank [01] terminated by signal 15'
expect kill 'DEAD: +rank 2 \(at #5 all_reduce'

if [ "$fail" -ne 0 ]; then
  for f in "$out"/*.log; do echo "==== $f"; cat "$f"; done
  exit 1
fi
echo "comm fault test: OK"
