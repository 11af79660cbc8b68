#!/usr/bin/env bash
# Bad input under mpirun: one clear error per job, not one per rank. An error every rank raises
# alike (a config, layout or data error) is printed once, by rank 0; where the ranks disagree,
# each distinct message once, naming its ranks; an error of one rank is printed once by that rank.
# None of them is followed by a comm report (that is for communication faults), every job exits
# non-zero soon after its error, and no job leaves its status folder behind.
# Args: the cleave binary, the source folder, test data.
set -uo pipefail
cleave=$1 src=$2 data=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=$work/status  # parallel.status_dir: the jobs' status folders go here
mkdir -p "$status"
failures=0
cfg=$src/tests/configs/tiny_train.toml
train=("$cleave" train "$cfg" --set data.dir="$data" --set train.threads=1
       --set parallel.status_dir="\"$status\"")

fail() {
  echo "FAIL $1: $2"; sed 's/^[0-9.]* //' "$work/$1.log" | grep -v '^[a-z_0-9]* = \|^\[\|^$' | tail -20
  failures=$((failures + 1))
}

# run NAME MPIRUN_ARGS...: runs the job under a 60 s guard; each output line is stamped with the
# wall-clock time it came at ($work/NAME.log). Sets rc and end (the time the job ended).
run() {
  local name=$1; shift
  timeout 60 mpirun --oversubscribe "$@" 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$work/$name.log"
  rc=${PIPESTATUS[0]}
  end=$(date +%s.%N)
}

check_status_folder() {  # name
  if [ -n "$(ls -A "$status")" ]; then
    fail "$1" "the job left its status folder: $(ls -A "$status")"
    rm -rf "${status:?}"/*
  fi
}

# expect_error NAME MESSAGE MPIRUN_ARGS...: MESSAGE on exactly one line, no comm report, a non-zero
# exit within 30 s of the message (the start-up of a loaded machine is not timed).
expect_error() {
  local name=$1 want=$2; shift 2
  run "$name" "$@"
  local n secs
  n=$(grep -cF -- "$want" "$work/$name.log")
  secs=$(grep -F -- "$want" "$work/$name.log" | head -1 | awk -v end="$end" '{ printf "%.1f", end - $1 }')
  if [ "$n" -ne 1 ]; then fail "$name" "the message was printed $n times, expected once: $want"
  elif grep -qE 'flight recorder|terminated by signal|status of the' "$work/$name.log"; then
    fail "$name" "a comm report for an error that is no communication fault"
  elif [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then fail "$name" "exit $rc, expected an error exit"
  elif awk -v s="$secs" 'BEGIN { exit !(s > 30) }'; then fail "$name" "the job ended $secs s after the error"
  else echo "ok   $name: exit $rc, ${secs} s after: $want"
  fi
  check_status_folder "$name"
}

out=$work/run
expect_error "impossible mesh" \
  "cleave: error: parallel degrees pp=1 x dp_replicate=1 x dp_shard=3 x cp=1 x tp=1 = 3 do not multiply to the world size 4" \
  -np 4 "${train[@]}" --set train.out_dir="$out" --set parallel.dp_shard=3
expect_error "indivisible batch" \
  "cleave: error: train.micro_batch_size = 6 is not divisible by the data-parallel degree 4" \
  -np 4 "${train[@]}" --set train.out_dir="$out" --set train.micro_batch_size=6
# Ranks that disagree: each message once, naming its ranks (mpirun's MPMD form gives ranks 2-3
# another command line).
expect_error "ranks disagree" \
  "cleave: error: ranks 2-3: $cfg: unknown key 'train.stpes' (did you mean 'train.steps'?)" \
  -np 2 "${train[@]}" --set train.out_dir="$out" : -np 2 "${train[@]}" --set train.out_dir="$out" \
  --set train.stpes=5
# Found by every rank after the comm engine started (the trainer's checks, agreed on).
expect_error "missing token file" "cleave: error: token file $work/none/train.bin: cannot open" \
  -np 4 "${train[@]}" --set train.out_dir="$out" --set data.dir="$work/none"
# Found by rank 0 alone (only it writes the metrics): it aborts the job; the others stay quiet.
mkdir -p "$work/busy/metrics.jsonl"
expect_error "one rank fails" "cleave: error: rank 0: cannot write $work/busy/metrics.jsonl" \
  -np 4 "${train[@]}" --set train.out_dir="$work/busy"

run "normal run" -np 2 "${train[@]}" --set train.out_dir="$out" --set train.steps=2 \
  --set train.micro_batch_size=2 --set train.val_interval=0 --set train.checkpoint_interval=-1
if [ "$rc" -ne 0 ]; then fail "normal run" "exit $rc"; else echo "ok   normal run"; fi
check_status_folder "normal run"

[ $failures -eq 0 ] || { echo "$failures multi-rank bad-input cases failed"; exit 1; }
echo "multi-rank bad input test: OK"
