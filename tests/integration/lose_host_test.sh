#!/usr/bin/env bash
# A job loses a host and goes on without it. HSDP (dp_replicate 2 x dp_shard 2, ZeRO-3) trains on
# two simulated hosts x 2 ranks (../shared/testhosts), checkpointing into a folder both hosts
# share. Once a checkpoint is written, host2's link is cut: cleave's watchdog ends every rank on
# both sides (parallel.comm_timeout_s), and mpirun, which would wait for host2's daemon for
# minutes, is killed as a scheduler would end the job. Then the job resumes on host1 alone, with
# host2 still unreachable: 2 ranks, tensor parallelism (tp 2), `--resume latest`. Its losses from
# the step after the checkpoint it resumed must be the single-process reference's, as must its
# final parameters.
# Needs root (ip netns); otherwise, or without ../shared/testhosts, it is skipped (exit 77):
# testhosts.sh. Args: the cleave binary, the source folder, the tokenized test data.
set -u
cleave=$1 src=$2 data=$3 test=lose_host
guard_pid=  # the `timeout` wrapping the background mpirun (its child is mpirun: run.sh execs it)
before_teardown() {
  if [ -n "$guard_pid" ]; then
    pkill -KILL -P "$guard_pid" 2>/dev/null
    kill -KILL "$guard_pid" 2>/dev/null
  fi
}
source "$src/tests/integration/testhosts.sh"

steps=24 interval=4 timeout_s=5
margin_s=10  # the watchdog polls every 0.1 s; MPI_Abort and the daemons' kill take a few seconds
common=(--set data.dir="$data" --set train.log_interval=1 --set train.threads=1
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2 --set train.steps=$steps
        --set train.val_interval=0 --set train.checkpoint_interval=$interval)
run=$work/run  # the job's train.out_dir, on a filesystem both hosts share
first=$(printf "%s/step_%08d" "$run" $interval)

t0=$SECONDS
reference ref "${common[@]}"
echo "reference: $((SECONDS - t0)) s"

# ---- the job on 2 hosts, until host2 is lost ----
t0=$SECONDS
timeout 120 bash "$tool" mpi 4 --output-filename "$work/hosts2.out" "$cleave" train "$cfg" \
  "${common[@]}" --set train.out_dir="$run" \
  --set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3 \
  --set parallel.comm_timeout_s=$timeout_s > "$work/hosts2.log" 2>&1 9>&- &
guard_pid=$!
# The checkpoint folder appears whole (written under a temporary name, then renamed).
for ((i = 0; i < 600; ++i)); do
  [ -d "$first" ] && break
  kill -0 "$guard_pid" 2>/dev/null || { cat "$work/hosts2.log"; fail "the job ended before its first checkpoint"; }
  sleep 0.05
done
[ -d "$first" ] || { cat "$work/hosts2.log"; fail "no checkpoint $first after 30 s"; }
ip link set veth-h2 down || fail "cannot set veth-h2 down"
t_cut=$SECONDS
echo "host2 cut off once $first was written ($((SECONDS - t0)) s after the start)"
while [ "$(ranks_left)" -gt 0 ] && ((SECONDS - t_cut < timeout_s + margin_s)); do sleep 0.2; done
[ "$(ranks_left)" -eq 0 ] \
  || fail "$(ranks_left) ranks still run $((timeout_s + margin_s)) s after the cut (timeout $timeout_s s)"
echo "every rank on both hosts ended within $((SECONDS - t_cut)) s of the cut (timeout $timeout_s s)"
before_teardown  # mpirun would wait for host2's daemon for minutes
wait "$guard_pid" 2>/dev/null
guard_pid=
cat "$work"/hosts2.out/1/rank.*/std* > "$work/ranks.log" 2>/dev/null
grep -qE "^cleave comm: TIMEOUT on rank [0-3]: " "$work/ranks.log" \
  || { cat "$work/ranks.log"; fail "no rank reported the stalled collective: cleave's watchdog did not end the job"; }
last=$(grep -oE '"step":[0-9]+' "$run/metrics.jsonl" | tail -1 | cut -d: -f2)
(( last < steps )) || fail "the job reached its last step $steps before the cut: nothing was lost"
echo "the job on 2 hosts logged step $last, checkpoints: $(cd "$run" && echo step_*)"

# ---- resume on host1 alone (host2 still cut off), 2 ranks, tp 2 ----
t0=$SECONDS
timeout 120 bash "$tool" mpi 2 --host 10.77.0.11:2 "$cleave" train "$cfg" "${common[@]}" \
  --set train.out_dir="$run" --set parallel.tp=2 --set parallel.comm_timeout_s=60 \
  --resume latest > "$work/host1.log" 2>&1 9>&-
rc=$?
[ "$rc" -eq 0 ] || { tail -30 "$work/host1.log"; fail "the resume on host1 exited with $rc"; }
resumed=$(grep -oE "resumed at step [0-9]+" "$work/host1.log" | grep -oE '[0-9]+$')
[ -n "$resumed" ] || { tail -30 "$work/host1.log"; fail "the job on host1 did not resume"; }
(( resumed >= interval && resumed % interval == 0 )) \
  || fail "resumed at step $resumed, not at a checkpoint of the first job"
grep -q "2 ranks (dp_replicate 1 x dp_shard 1 x tp 2, ZeRO-0)" "$work/host1.log" \
  || { tail -30 "$work/host1.log"; fail "the resume did not report the layout tp 2"; }
$compare "$work/ref" "$run" --from-step $((resumed + 1)) \
  || fail "the run resumed on host1 differs from the single-process reference"
echo "resumed at step $resumed on host1 alone (tp 2), matching the reference to step $steps ($((SECONDS - t0)) s)"
echo "lose_host test: OK in $((SECONDS - t_start)) s"
