# Shared by the layout tests (data_parallel_test.sh, tensor_parallel_test.sh, compare_builds.sh,
# pipeline_layouts.sh): source it after setting cleave, src and data (the test's
# arguments); it sets work (removed at exit), cfg and compare. The functions read the test's
# common (--set ...) array.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=$src/tests/configs/tiny_train.toml
compare="/usr/bin/python3 $src/tests/integration/compare_runs.py"
# The layout tests' run: 20 steps, each logged, validation and a checkpoint every 10, one thread.
twenty_steps=(--set train.steps=20 --set train.log_interval=1 --set train.val_interval=10
              --set train.checkpoint_interval=10 --set train.threads=1 --set parallel.comm_timeout_s=60)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
# Each test's mpiruns keep their session folders in its own work folder: two mpiruns of tests that
# ctest runs side by side can race to create the same one under /tmp ("File exists").
export OMPI_MCA_orte_tmpdir_base=$work

run() {  # name ranks [--set ...]: one training run into $work/name (log: $work/name.log)
  local name=$1 np=$2; shift 2
  if ! timeout 300 mpirun --oversubscribe -np "$np" "$cleave" train "$cfg" --set data.dir="$data" \
      "${common[@]}" --set train.out_dir="$work/$name" "$@" > "$work/$name.log" 2>&1; then
    echo "FAIL: run $name"; tail -20 "$work/$name.log"; exit 1
  fi
}

numbers() { grep -o '"\(loss\|val_loss\|grad_norm\)":[^,}]*' "$1/metrics.jsonl"; }

# layout REF NAME RANKS [--set ...]: runs the layout twice, compares it with the reference and
# the rerun with the first run, bit for bit (losses, norms, step 20's checkpoint files).
layout() {
  local ref=$1 name=$2 np=$3; shift 3
  run "$name" "$np" "$@"
  run "$name-again" "$np" "$@"
  $compare "$work/$ref" "$work/$name"
  same_bits "$name" "$name-again" 20
}

# same_bits A B STEP: runs A and B logged the same losses and norms and wrote the same step STEP
# checkpoint files, bit for bit.
same_bits() {
  local a=$1 b=$2 step
  step=$(printf "step_%08d" "$3")
  diff <(numbers "$work/$a") <(numbers "$work/$b") > /dev/null \
    || { echo "FAIL: $b logged other losses than $a"; exit 1; }
  for f in "$work/$a/$step"/*.safetensors; do
    cmp -s "$f" "$work/$b/$step/$(basename "$f")" \
      || { echo "FAIL: $b wrote another $(basename "$f") than $a"; exit 1; }
  done
}

# resume NAME RANKS1 "FIRST LAYOUT" RANKS2 "SECOND LAYOUT": the first layout stops at step 10, the
# second resumes its checkpoint and matches the reference run $work/ref from step 11.
resume() {
  local name=$1 np1=$2 np2=$4; read -r -a first <<<"$3"; read -r -a second <<<"$5"
  run "$name" "$np1" "${first[@]}" --exit-after 10
  run "$name" "$np2" "${second[@]}" --resume latest
  grep -q "resumed at step 10" "$work/$name.log" || { echo "FAIL: $name did not resume"; exit 1; }
  $compare "$work/ref" "$work/$name" --from-step 11
}

expect_error() {  # ranks message [--set ...]: the run fails with exactly this message
  local np=$1 message=$2; shift 2
  if mpirun --oversubscribe -np "$np" "$cleave" train "$cfg" --set data.dir="$data" "${common[@]}" \
      --set train.out_dir="$work/bad" "$@" > "$work/bad.log" 2>&1; then
    echo "FAIL: $* ran"; exit 1
  fi
  grep -qF "cleave: error: $message" "$work/bad.log" \
    || { echo "FAIL: expected \"$message\""; cat "$work/bad.log"; exit 1; }
}

# axis_bytes AXIS NAME: the bytes rank 0 of run NAME sent on the axis per step, as the trainer
# measured them (AXIS_bytes_per_step in its last logged step), are what the run predicted at its
# start (AXIS_bytes_per_step_predicted: plan/axis_volume.h's figure, which cleave mesh prints).
axis_bytes() {
  local axis=$1 name=$2 record measured predicted
  record=$(grep '"loss"' "$work/$name/metrics.jsonl" | tail -1)
  measured=$(grep -o "\"${axis}_bytes_per_step\":[0-9.]*" <<<"$record" | cut -d: -f2)
  predicted=$(grep -o "\"${axis}_bytes_per_step_predicted\":[0-9]*" <<<"$record" | cut -d: -f2)
  [ -n "$predicted" ] && [ "${measured%.0}" = "$predicted" ] \
    || { echo "FAIL: $name sent $measured bytes per step on $axis, the run predicted $predicted"; exit 1; }
}
