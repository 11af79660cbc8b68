#!/usr/bin/env bash
# cleave across simulated hosts: two network namespaces joined by a bridge (../shared/testhosts),
# two ranks on each, ranks on different hosts talking TCP over the bridge.
#  (a) Data-parallel layouts whose groups cross hosts match the single-process reference: HSDP
#      (dp_replicate 2 x dp_shard 2, ZeRO-3: shard groups within a host, replicate groups across)
#      and DDP over all 4 ranks. Each rank prints its host and network namespace, checked against
#      the groups `cleave mesh --ranks-per-host 2` says stay within a host, and the bridge port of
#      host2 must have carried the gradients.
#  (b) A link cut (host2's bridge port down) stalls the collectives that cross hosts. OpenMPI
#      notices nothing; cleave's watchdog must end every rank on both sides within the timeout
#      plus a margin, with a report that names ranks and sequence numbers:
#        cut-shared:   parallel.status_dir shared by both hosts: the report shows host2's ranks;
#        cut-per-host: a status folder per host (as /tmp is on real machines): host2's ranks are
#                      reported as unknown, never as dead or behind.
#      mpirun itself then still waits for host2's daemon (TCP retransmission: about 15 minutes);
#      once the link is back it exits non-zero.
#        cut-keepalive: with OpenMPI's daemon keepalive set short, mpirun notices the lost host
#                      itself, with the link still down, and the ranks print their report as
#                      they are stopped.
# Needs root (ip netns); otherwise, or without ../shared/testhosts, it is skipped (exit 77):
# testhosts.sh. Args: the cleave binary, the source folder, the tokenized test data.
set -u
cleave=$1 src=$2 data=$3 test=multihost
guard_pid=  # the `timeout` wrapping a background mpirun (its child is mpirun: run.sh execs it)
before_teardown() {
  if [ -n "$guard_pid" ]; then
    pkill -KILL -P "$guard_pid" 2>/dev/null
    kill -KILL "$guard_pid" 2>/dev/null
  fi
}
source "$src/tests/integration/testhosts.sh"

# Each rank first prints where it runs, then becomes the program. `--status-per-host DIR` gives
# each host its own status folder DIR/<host>, as a /tmp that is not shared would.
cat > "$work/place.sh" <<'EOF'
#!/bin/sh
echo "placement: rank $OMPI_COMM_WORLD_RANK host $(hostname) netns $(readlink /proc/self/ns/net)"
if [ "$1" = --status-per-host ]; then
  dir=$2/$(hostname); shift 2
  exec "$@" --set parallel.status_dir="$dir"
fi
exec "$@"
EOF
chmod +x "$work/place.sh"
common=(--set data.dir="$data" --set train.log_interval=1 --set train.threads=1
        --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
steps=12
equal=("${common[@]}" --set train.steps=$steps --set train.val_interval=6
       --set train.checkpoint_interval=6 --set parallel.comm_timeout_s=60)

# ---- (a) layouts across hosts against the single-process reference ----
t0=$SECONDS
reference ref "${equal[@]}"
params=$(grep -oE 'model, [0-9]+ parameters' "$work/ref.log" | grep -oE '[0-9]+')
[ -n "$params" ] || fail "the reference run printed no parameter count"

for layout in "hsdp 2 2 3" "ddp 1 4 0"; do
  read -r name replicate shard zero <<<"$layout"
  set_layout=(--set parallel.dp_replicate=$replicate --set parallel.dp_shard=$shard
              --set parallel.zero_stage=$zero)
  before=$(veth_bytes)
  timeout 120 bash "$tool" mpi 4 "$work/place.sh" "$cleave" train "$cfg" "${equal[@]}" \
    "${set_layout[@]}" --set train.out_dir="$work/$name" > "$work/$name.log" 2>&1 9>&-
  rc=$?
  [ "$rc" -eq 0 ] || { tail -30 "$work/$name.log"; fail "$name on 2 hosts x 2 ranks exited with $rc"; }
  crossed=$(( $(veth_bytes) - before ))
  grep -q "4 ranks (dp_replicate $replicate x dp_shard $shard x tp 1, ZeRO-$zero)" "$work/$name.log" \
    || fail "$name: the trainer did not report the layout dp_replicate $replicate x dp_shard $shard"
  # Where the ranks really ran, against the mesh's account of which groups stay within a host.
  "$cleave" mesh --world 4 "${set_layout[@]:0:4}" --ranks-per-host 2 > "$work/$name.mesh" \
    || fail "cleave mesh failed for $name"
  /usr/bin/python3 - "$work/$name.log" "$work/$name.mesh" <<'EOF' || fail "$name: placement check failed"
import re, sys
log, mesh = open(sys.argv[1]).read(), open(sys.argv[2]).read()
place = {int(r): (h, n) for r, h, n in re.findall(r"placement: rank (\d+) host (\S+) netns (\S+)", log)}
if sorted(place) != [0, 1, 2, 3]:
    sys.exit(f"placement lines for ranks {sorted(place)}, expected 0..3")
hosts = {r: place[r][0] for r in place}
if hosts[0] != hosts[1] or hosts[2] != hosts[3] or hosts[0] == hosts[2]:
    sys.exit(f"expected ranks 0,1 on one host and 2,3 on another, got {hosts}")
if len({place[r][1] for r in place}) != 2:
    sys.exit(f"expected two network namespaces, got {place}")
groups = re.findall(r"^  \[([\d, ]+)\]  (intra-host|crosses hosts)", mesh, re.M)
if not groups:
    sys.exit("cleave mesh listed no groups")
crossing = 0
for members, claim in groups:
    real = {hosts[int(m)] for m in members.split(",")}
    if (len(real) > 1) != (claim == "crosses hosts"):
        sys.exit(f"cleave mesh says [{members}] {claim}, but its ranks ran on {sorted(real)}")
    crossing += len(real) > 1
print(f"placement: {hosts}; {len(groups)} mesh groups as cleave mesh says, {crossing} crossing hosts")
EOF
  # Every step moves at least the parameters' size in gradient bytes between the hosts (4 bytes
  # a parameter; here a quarter of that, for margin): proof the collectives crossed the bridge.
  (( crossed >= steps * params )) \
    || fail "$name: host2's bridge port carried $crossed bytes, expected >= $((steps * params))"
  $compare "$work/ref" "$work/$name" \
    || fail "$name across 2 hosts differs from the single-process reference"
  echo "$name across 2 hosts matches the reference ($crossed bytes crossed hosts)"
done
echo "equivalence: $((SECONDS - t0)) s"

# ---- (b) a link cut ends in cleave's report, not a hang ----
timeout_s=5
margin_s=10  # the watchdog polls every 0.1 s; MPI_Abort and the daemons' kill take a few seconds
long=("${common[@]}" --set train.steps=1000000 --set train.log_interval=20
      --set train.val_interval=0 --set train.checkpoint_interval=-1
      --set parallel.dp_replicate=2 --set parallel.dp_shard=2 --set parallel.zero_stage=3)

start_job() {  # name MPIRUN_ARGS -- PLACE_ARGS -- TRAINER_ARGS; runs in the background
  local name=$1; shift
  local mpi_args=() place_args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do mpi_args+=("$1"); shift; done; shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do place_args+=("$1"); shift; done; shift
  mkdir -p "$work/$name.out"
  timeout 90 bash "$tool" mpi 4 "${mpi_args[@]}" --output-filename "$work/$name.out" \
    "$work/place.sh" "${place_args[@]}" "$cleave" train "$cfg" "${long[@]}" \
    --set train.out_dir="$work/$name.run" "$@" > "$work/$name.log" 2>&1 9>&- &
  guard_pid=$!
}
rank_out() { cat "$work/$1".out/1/rank.$2/std* 2>/dev/null; }  # rank $2's stdout and stderr
wait_job() {  # -> rc: mpirun's exit status
  wait "$guard_pid"
  rc=$?
  guard_pid=
}

cut_link() {  # name: waits until rank 0 trains, then cuts host2's link -> t_cut
  local i
  for i in $(seq 1 300); do
    rank_out "$1" 0 | grep -q '^step .*40/' && break
    kill -0 "$guard_pid" 2>/dev/null || { cat "$work/$1.log"; fail "$1: the job ended before the cut"; }
    sleep 0.1
  done
  rank_out "$1" 0 | grep -q '^step .*40/' || fail "$1: rank 0 logged no step 40 in 30 s"
  ip link set veth-h2 down || fail "cannot set veth-h2 down"
  t_cut=$(date +%s.%N)
}

since_cut() { /usr/bin/python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$(date +%s.%N)" "$t_cut"; }

# The first report of a host1 rank, from "TIMEOUT" to its flight recorder.
timeout_report() { rank_out "$1" "$2" | sed -n '/TIMEOUT on rank/,/flight recorder of rank/p'; }

cut_and_time_out() {  # name PLACE_ARGS -- TRAINER_ARGS: the link stays cut until every rank has ended
  local name=$1; shift
  start_job "$name" -- "$@" --set parallel.comm_timeout_s=$timeout_s
  cut_link "$name"
  local deadline=$((timeout_s + margin_s)) ended=
  while :; do
    [ "$(ranks_left)" -eq 0 ] && { ended=$(since_cut); break; }
    (( $(since_cut | cut -d. -f1) >= deadline )) && break
    sleep 0.2
  done
  [ -n "$ended" ] || fail "$name: $(ranks_left) ranks still run ${deadline} s after the link cut (timeout ${timeout_s} s)"
  echo "$name: every rank on both hosts ended ${ended} s after the link cut (timeout ${timeout_s} s)"
  kill -0 "$guard_pid" 2>/dev/null && echo "$name: mpirun still waits for host2's daemon, as OpenMPI does"
  ip link set veth-h2 up || fail "cannot set veth-h2 up"
  local up=$(since_cut)
  wait_job
  echo "$name: mpirun exited with $rc $(since_cut) s after the cut (the link came back at ${up} s)"
  [ "$rc" -ne 0 ] || fail "$name: mpirun exited 0 after a stalled collective"
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "$name: the 90 s guard had to stop mpirun"
  local r found=
  for r in 0 1; do
    timeout_report "$name" "$r" | grep -q . || continue
    found=$r
    break
  done
  [ -n "$found" ] || { cat "$work/$name.log"; fail "$name: no host1 rank printed a TIMEOUT report"; }
  timeout_report "$name" "$found" > "$work/$name.report"
  [ -n "${SHOW_REPORTS:-}" ] && cat "$work/$name.report"
  # The stall is in a collective of a group that crosses hosts: the reporting rank timed out in
  # it, or in a group within host1 behind a host1 rank whose status shows it still in one.
  grep -qE "TIMEOUT on rank $found: (all_reduce|all_gather|reduce_scatter) #[0-9]+ on group \"(dp_replicate|dp)\"" \
      "$work/$name.report" \
    || grep -qE "^      group \"(dp_replicate|dp)\" \(rank [0-9] of [0-9]\): started #([0-9]+) [a-z_]+ \([^)]*\) [0-9.]+ s ago, completed #" \
      "$work/$name.report" \
    || { cat "$work/$name.report"; fail "$name: the report does not show a host1 rank stalled in a collective of a group crossing hosts"; }
  grep -qE "^    waiting in it: +rank [01]" "$work/$name.report" \
    || { cat "$work/$name.report"; fail "$name: the report lists no host1 rank waiting in the collective"; }
  report_rank=$found
}

t0=$SECONDS
# A report line that calls a host2 rank (2 or 3) dead, missing or behind.
judges_host2() {
  grep -qE "^  rank [23]: .*(DEAD|MISSING|BEHIND|not started yet)|^    (BEHIND|DEAD|MISSING)[^:]*: .*rank [23]( |,|$)" "$1"
}
# The report of scenario $r matches the extended regular expression $1, or the test fails with $2.
report_has() {
  grep -qE "$1" "$work/$r" || { cat "$work/$r"; fail "$2"; }
}

cut_and_time_out cut-shared -- --set parallel.status_dir="$work/status"
r=cut-shared.report
report_has "status of the 4 ranks \(from $work/status/cleave-" \
  "cut-shared: the report did not read parallel.status_dir ($work/status)"
for rank in 2 3; do
  report_has "^  rank $rank: pid [0-9]+ on host2, " "cut-shared: the report does not show rank $rank on host2"
done
# A host2 rank at the stalled collective: in the analysis of the group the reporting rank waits
# in, or, when it timed out first in a group within host1 behind a host1 rank stuck in a crossing
# group (it depends on timing, and on a loaded machine it happens), in a host2 rank's status line
# still in a collective of a crossing group.
host2_waits_crossing() {
  awk '/^  rank [23]: /{host2=1; next} /^  rank /{host2=0}
       host2 && /^      group "(dp_replicate|dp)" .* started #[0-9]+ [a-z_]+ \([^)]*\) [0-9.]+ s ago, completed #/{found=1}
       END{exit !found}' "$1"
}
grep -qE "^    waiting in it: +rank [01], .*rank [23]|^    done with it: .*rank [23]" "$work/$r" \
  || host2_waits_crossing "$work/$r" \
  || { cat "$work/$r"; fail "cut-shared: the report does not place a host2 rank at the stalled collective"; }
# Host1's other rank may have timed out and exited first: DEAD is right for it. Host2's ranks are
# visible through the shared folder and must never be called dead or missing. (One may be behind
# in a group the analysis follows a host1 rank into: that is progress it can see, not a guess.)
if grep -qE "MISSING|UNKNOWN" "$work/$r" \
    || grep -qE "^  rank [23]: .*(DEAD|MISSING|not started yet)|^    (DEAD|MISSING)[^:]*: .*rank [23]( |,|$)" "$work/$r"; then
  cat "$work/$r"; fail "cut-shared: every rank was alive and visible, yet the report says otherwise"
fi
echo "cut-shared: the report of rank $report_rank shows every rank, host2's from the shared folder"

cut_and_time_out cut-per-host --status-per-host "$work/status" --
r=cut-per-host.report
report_has "status of the 4 ranks \(from $work/status/host1/cleave-" \
  "cut-per-host: the report did not read $work/status/host1"
for rank in 2 3; do
  report_has "^  rank $rank: on host2, status UNKNOWN: no status file in $work/status/host1/cleave-" \
    "cut-per-host: rank $rank (host2, status not visible) is not reported as unknown"
done
# In the analysis of the group the reporting rank waits in or, when that group is within host1,
# of the crossing group the host1 rank behind it waits in (the analysis follows it there).
report_has "^    UNKNOWN \(other host\): +rank [23] \(on host2" \
  "cut-per-host: the group analysis does not mark host2's rank unknown"
if judges_host2 "$work/$r"; then
  cat "$work/$r"; fail "cut-per-host: the report judges ranks whose status it cannot see"
fi
echo "cut-per-host: the report of rank $report_rank calls host2's ranks unknown"

# OpenMPI's daemon keepalive, short: mpirun notices the lost host (the link stays down) and stops
# the job; the comm timeout is long, so the ranks report from their SIGTERM handler.
start_job cut-keepalive --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 \
  --mca oob_tcp_keepalive_probes 2 -- -- --set parallel.comm_timeout_s=60 \
  --set parallel.status_dir="$work/status"
cut_link cut-keepalive
wait_job
echo "cut-keepalive: mpirun exited with $rc $(since_cut) s after the cut, the link still down"
ip link set veth-h2 up  # lets the sockets left in the namespaces close, so teardown is quick
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] \
  || { cat "$work/cut-keepalive.log"; fail "cut-keepalive: expected mpirun to stop the job itself, got exit $rc"; }
grep -q "lost communication with a remote daemon" "$work/cut-keepalive.log" \
  || { cat "$work/cut-keepalive.log"; fail "cut-keepalive: mpirun did not report the lost host"; }
found=
for rank in 0 1; do
  rank_out cut-keepalive $rank | grep -q "rank $rank terminated by signal 15" || continue
  rank_out cut-keepalive $rank | grep -qE "^cleave comm: group \"(dp_replicate|dp)\" \(. ranks\) at collective #[0-9]+" \
    || continue
  found=$rank
done
[ -n "$found" ] || { for r in 0 1; do rank_out cut-keepalive $r; done; \
  fail "cut-keepalive: no host1 rank reported where the groups stood when stopped"; }
# Whether host2's ranks still live cannot be told from host1: never "DEAD".
if rank_out cut-keepalive $found | grep -qE "^  rank [23]: .*DEAD"; then
  rank_out cut-keepalive $found; fail "cut-keepalive: rank $found calls a rank on the unreachable host dead"
fi
echo "cut-keepalive: rank $found reported where every group stood"
echo "faults: $((SECONDS - t0)) s"
echo "multihost test: OK in $((SECONDS - t_start)) s"
