#!/usr/bin/env bash
# cleave under Slurm, on the two simulated hosts of ../shared/testhosts (network namespaces
# host1, host2 joined by a bridge). A private cluster lives in the test's work folder: munged with
# its own key and socket, slurmctld on host1, a slurmd on each host (its node name is the host's
# name), every path in a slurm.conf that SLURM_CONF points to; nothing under /etc or /var. From the
# bridge's address (a login node), `sbatch --wait` submits a 2-host job whose script runs
# `srun --mpi=pmix` (OpenMPI's direct launch through Slurm's PMIx server: Debian's OpenMPI has PMIx
# and no PMI2 support), 2 ranks per host in HSDP (dp_replicate 2 across the hosts x dp_shard 2
# within each). Checked: each rank ran where Slurm placed it, the replicate groups' traffic crossed
# the bridge, cleave's binding note names srun's option (task/affinity binds each task to one
# CPU), and the losses and parameters are the single-process reference's. Then a task of 2
# threads bound to one CPU must be told srun's --cpus-per-task=2, and with it not be warned.
# Skipped (exit 77) without root, network namespaces or the Slurm packages (testhosts.sh), or
# where slurmd cannot start because the machine has no cgroup filesystem it can use.
# Args: the cleave binary, the source folder, the tokenized test data.
set -u
# Absolute paths: the batch job runs in its own folder.
cleave=$(readlink -f "$1") src=$(readlink -f "$2") data=$(readlink -f "$3") test=slurm
needs=(slurmctld slurmd srun sbatch sinfo munged nsenter)
daemons=()  # munged, slurmctld, the slurmds
before_teardown() {
  [ ${#daemons[@]} -gt 0 ] || return 0
  kill -TERM "${daemons[@]}" 2>/dev/null
  local i
  for ((i = 0; i < 25; ++i)); do
    kill -0 "${daemons[@]}" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "${daemons[@]}" 2>/dev/null
  wait "${daemons[@]}" 2>/dev/null
  daemons=()
}
source "$src/tests/integration/testhosts.sh"

t0=$SECONDS
s=$work/slurm
mkdir -p "$s/munge" "$s/state"
chmod 700 "$s/munge"
# munged's own key and socket; it runs outside the hosts, which reach its socket by path.
dd if=/dev/urandom of="$s/munge/key" bs=1024 count=1 status=none
chmod 400 "$s/munge/key"
munged --foreground --force --socket="$s/munge/socket" --key-file="$s/munge/key" \
  --log-file="$s/munge/log" --pid-file="$s/munge/pid" --seed-file="$s/munge/seed" \
  > "$s/munged.out" 2>&1 9>&- &
daemons+=($!)
for ((i = 0; i < 50; ++i)); do [ -S "$s/munge/socket" ] && break; sleep 0.1; done
[ -S "$s/munge/socket" ] || { cat "$s/munged.out"; fail "munged made no socket"; }

# Per-node paths carry %n (the node name): both slurmds share this filesystem. TmpFS too: Slurm's
# PMIx plugin makes its client folder there, named by job and step only. Job numbers start at
# random: OpenMPI names its shared-memory files and session folders by host and job (PMIx's
# namespace, slurm.pmix.JOB.STEP), and what a killed run left behind must not meet a later run's
# job of the same number (job 1 of every fresh cluster).
cat > "$s/slurm.conf" <<EOF
ClusterName=cleavetest
FirstJobId=$((1000 + (RANDOM << 8 | $$ & 255)))
SlurmctldHost=host1(10.77.0.11)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$s/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$s/state
SlurmctldPidFile=$s/slurmctld.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdSpoolDir=$s/spool-%n
SlurmdPidFile=$s/slurmd-%n.pid
SlurmdLogFile=$s/slurmd-%n.log
TmpFS=$s/tmp-%n
ProctrackType=proctrack/pgid
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=host1 NodeAddr=10.77.0.11 CPUs=2 State=UNKNOWN
NodeName=host2 NodeAddr=10.77.0.12 CPUs=2 State=UNKNOWN
PartitionName=hosts Nodes=host1,host2 Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$s/slurm.conf
srun --mpi=list > "$s/mpi.list" 2>&1 || { cat "$s/mpi.list"; fail "srun --mpi=list failed"; }
grep -qx '[[:space:]]*pmix' "$s/mpi.list" \
  || { cat "$s/mpi.list"; skip "this Slurm has no PMIx plugin (srun --mpi=list)"; }

# A daemon on a host: in its network namespace, with its hostname. nsenter, not `ip netns exec`:
# that mounts a fresh /sys, without the cgroup filesystem slurmd needs.
on_host() {  # i COMMAND...
  local i=$1; shift
  nsenter --net=/run/netns/mpih$i unshare --uts sh -c "hostname host$i; exec \"\$@\"" sh "$@"
}
on_host 1 slurmctld -D > "$s/slurmctld.out" 2>&1 9>&- &
daemons+=($!)
for i in 1 2; do
  mkdir -p "$s/spool-host$i" "$s/tmp-host$i"
  on_host $i slurmd -D > "$s/slurmd$i.out" 2>&1 9>&- &
  daemons+=($!)
done
ready=
for ((i = 0; i < 150; ++i)); do
  [ "$(sinfo -h -o '%T %D' 2>/dev/null)" = "idle 2" ] && { ready=1; break; }
  for pid in "${daemons[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    # slurmd 22.05 initialises its cgroup plugin whatever the config: fatal without a cgroup
    # filesystem at /sys/fs/cgroup it can use (v1 with name=systemd; v2 wants systemd's scope).
    # The machine cannot run it then, no fault of cleave's.
    cause=$(grep -hiE "error: .*cgroup" "$s"/slurmd-host*.log 2>/dev/null | head -1)
    [ -n "$cause" ] && skip "slurmd cannot start here, its cgroup plugin failed: ${cause#*error: }"
    tail -n 5 "$s"/*.log "$s"/*.out; fail "a Slurm daemon (pid $pid) exited during start"
  done
  sleep 0.2
done
[ -n "$ready" ] || { sinfo; tail -n 5 "$s"/*.log; fail "the two nodes were not idle in Slurm after 30 s"; }
echo "slurm: munged, slurmctld and 2 slurmds up in $((SECONDS - t0)) s"

common=(--set data.dir="$data" --set train.log_interval=1 --set train.threads=1
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2 --set train.steps=12
        --set train.val_interval=6 --set train.checkpoint_interval=6)
t0=$SECONDS
reference ref "${common[@]}"
params=$(grep -oE 'model, [0-9]+ parameters' "$work/ref.log" | grep -oE '[0-9]+')
[ -n "$params" ] || fail "the reference run printed no parameter count"
echo "reference: $((SECONDS - t0)) s"

# The batch script, as a user writes one (README.md). Each rank first prints where Slurm put it.
# PMIX_MCA_gds=hash: the job's PMIx keys in each client's own table, not in the shared-memory
# store (ds21) that a host's clients map. Once in CI (a loaded 2-core machine) a rank on host2
# died by SIGSEGV at address 0 with no frame of its own, and its host peer then found no shared
# segment to open; the dstore's intermittent faults under srun are known to PMIx's users (openpmix
# issues 1114, 2210), and hash is their way around it. Not reproduced here in 11 runs, loaded or
# not: should it come back, the failure report below shows how far the ranks got.
cat > "$work/job.sh" <<EOF
#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --time=5
export PMIX_MCA_gds=hash
srun --mpi=pmix sh -c 'echo "placement: rank \$SLURM_PROCID host \$(hostname) node \$SLURMD_NODENAME"; exec "\$@"' sh \\
  "$cleave" train "$cfg" $(printf '%q ' "${common[@]}") --set train.out_dir="$work/hsdp" \\
  --set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3
EOF
t0=$SECONDS
before=$(veth_bytes)
timeout 180 sbatch --wait --output="$work/job.log" --chdir="$work" "$work/job.sh" \
  > "$work/sbatch.log" 2>&1 9>&-
rc=$?
crossed=$(( $(veth_bytes) - before ))
[ "$rc" -eq 0 ] || { cat "$work/sbatch.log"; grep -E "^(placement|step|saved)" "$work/job.log" | tail -8
                     tail -30 "$work/job.log"; tail -n 5 "$s"/slurmd-host*.log; fail "the job exited with $rc"; }
echo "slurm: $(cat "$work/sbatch.log"), done in $((SECONDS - t0)) s"
grep -q "4 ranks (dp_replicate 2 x dp_shard 2 x tp 1, ZeRO-3)" "$work/job.log" \
  || { cat "$work/job.log"; fail "the trainer did not report 4 ranks in HSDP 2 x 2"; }
/usr/bin/python3 - "$work/job.log" <<'EOF' || { cat "$work/job.log"; fail "placement check failed"; }
import re, sys
place = {int(r): (h, n) for r, h, n in
         re.findall(r"placement: rank (\d+) host (\S+) node (\S+)", open(sys.argv[1]).read())}
want = {0: ("host1", "host1"), 1: ("host1", "host1"), 2: ("host2", "host2"), 3: ("host2", "host2")}
if place != want:
    sys.exit(f"ranks ran at {place}, expected {want} (hostname and Slurm node name)")
print("placement: ranks 0,1 on host1 and 2,3 on host2, as Slurm placed them")
EOF
# Every step moves at least the parameters' size in gradient bytes between the hosts (4 bytes a
# parameter; here a quarter of that, for margin): the replicate groups crossed the bridge.
(( crossed >= 12 * params )) \
  || fail "host2's bridge port carried $crossed bytes, expected >= $((12 * params))"
grep -q "cleave: note: rank 0 is bound to one CPU, .*srun --cpu-bind=none" "$work/job.log" \
  || { cat "$work/job.log"; fail "rank 0, bound to one CPU by srun, was not told srun's option"; }
$compare "$work/ref" "$work/hsdp" || fail "HSDP under srun differs from the single-process reference"
echo "slurm: HSDP 2 x 2 on 2 hosts under srun --mpi=pmix matches the reference ($crossed bytes crossed hosts)"

# srun straight from the login node: one task of 2 threads is bound to one CPU and told srun's
# option, and given 2 CPUs by that option, it is not.
threads() {  # NAME [srun options]: a 1-step run of 2 threads; its warnings counted
  local name=$1; shift
  timeout 60 srun --nodes=1 --ntasks=1 "$@" --mpi=pmix "$cleave" train "$cfg" "${common[@]}" \
    --set train.threads=2 --set train.steps=1 --set train.checkpoint_interval=-1 \
    --set train.out_dir="$work/$name" > "$work/$name.log" 2>&1 9>&- \
    || { cat "$work/$name.log"; fail "srun $* of 1 task x 2 threads failed"; }
  grep -c "cleave: warning: rank 0 may run on 1 CPU(s) but uses 2 threads; under srun pass --cpus-per-task=2 (or --cpu-bind=none)" \
    "$work/$name.log"
}
[ "$(threads one-cpu)" = 1 ] || { cat "$work/one-cpu.log"; fail "2 threads on one CPU were not told srun's option"; }
[ "$(threads two-cpus --cpus-per-task=2)" = 0 ] \
  || { cat "$work/two-cpus.log"; fail "2 threads on 2 CPUs (srun --cpus-per-task=2) were warned"; }
echo "slurm: 2 threads bound to one CPU are told srun's --cpus-per-task=2, which ends the warning"
echo "slurm test: OK in $((SECONDS - t_start)) s"
