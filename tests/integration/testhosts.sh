# Shared by the tests on simulated hosts (multihost_test.sh, lose_host_test.sh, slurm_test.sh):
# two network namespaces mpih1, mpih2 (hostnames host1, host2, addresses 10.77.0.11 and .12) joined
# by a bridge holding 10.77.0.1, made by ../shared/testhosts/run.sh. Source it after setting
# cleave, src and data (the test's arguments), test (its name, for messages) and, if the test needs
# more commands than ip, unshare, mpirun and python3, needs (an array of them). It skips the test
# (exit 77) where simulated hosts cannot be made or a command is missing, waits for the hosts to be
# free, sets work (a temporary folder, removed at exit), tool and the OpenMPI environment, and
# brings the two hosts up.
# At exit it calls the test's before_teardown (if defined: end its own jobs and daemons), ends
# everything left in the hosts and takes them down.
# No pipefail: `... | grep -q` may end its writer early, which is no failure here.
tool=$src/../shared/testhosts/run.sh
skip() { echo "SKIP ($test): $*"; exit 77; }
fail() { echo "FAIL ($test): $*"; exit 1; }
[ -f "$tool" ] || skip "no simulated-hosts tool at $tool (CI puts ../shared beside the checkout)"
[ "$(id -u)" -eq 0 ] || skip "simulated hosts need root (network namespaces), running as uid $(id -u)"
for cmd in ip unshare mountpoint mpirun /usr/bin/python3 ${needs[@]+"${needs[@]}"}; do
  command -v "$cmd" >/dev/null || skip "$cmd is not installed (setup.sh installs it)"
done
# `ip -n` and `ip netns exec` make / a slave mount, which fails (EINVAL) where / is no mount point:
# inside a plain chroot, such as ../shared/fresh's new Debian root. There the test runs again in a
# mount namespace of its own whose root is a bind mount of /, with the same paths.
if ! mountpoint -q /; then
  [ -z "${CLEAVE_TESTHOSTS_REROOTED:-}" ] || fail "/ is still no mount point after re-rooting"
  newroot=$(mktemp -d)
  unshare --mount --propagation unchanged sh -c '
    mount --rbind / "$1" || exit 1
    exec chroot "$1" env CLEAVE_TESTHOSTS_REROOTED=1 sh -c "cd \"\$1\" && exec bash \"\$2\" \"\$3\" \"\$4\" \"\$5\"" \
      reroot "$2" "$3" "$4" "$5" "$6"' reroot "$newroot" "$PWD" "$0" "$cleave" "$src" "$data"
  rc=$?
  rmdir "$newroot"
  exit $rc
fi
probe_ns=cleave-$test-probe-$$
if ! err=$(ip netns add "$probe_ns" 2>&1); then
  skip "'ip netns add' is not permitted here (needs CAP_NET_ADMIN): $err"
fi
ip netns del "$probe_ns"
# Whether simulated hosts exist. Deleted namespaces can live on for a minute or so, with their
# veth ports, while orphaned TCP sockets in them retransmit; `up` then fails on the names.
hosts_exist() {
  local state
  state="$(ip netns list) $(ip -br link)"  # captured whole: no early-exit grep in a pipe
  [[ $state == *mpih* || $state == *mpibr0* || $state == *veth-h* ]]
}
wait_hosts_gone() {  # seconds
  local i
  for ((i = 0; i < $1 * 5; ++i)); do hosts_exist || return 0; sleep 0.2; done
  ! hosts_exist
}
# ctest's RESOURCE_LOCK keeps one suite's testhosts users apart; the lock, concurrent suites (the
# bridge and namespace names are fixed); the check, anyone else.
exec 9>/tmp/cleave-testhosts.lock  # (closed for the jobs and daemons the tests start: 9>&-)
flock -w 300 9 || fail "another run has held /tmp/cleave-testhosts.lock for 300 s"
wait_hosts_gone 90 || fail "simulated hosts already exist (another user, or left over: $tool down): $(ip -br link | grep -E 'veth-h|mpibr0' | tr -s ' \n' ' ')"

work=$(mktemp -d)
export TESTHOSTS_DIR=$work/hosts
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
# OpenMPI's session folders (ompi.<host>.<uid>/, named by host and job) in the work folder: the
# ranks and daemons the tests end by kill -9 leave theirs behind.
export OMPI_MCA_orte_tmpdir_base=$work
cleanup() {
  declare -F before_teardown >/dev/null && before_teardown
  # End what runs in the hosts first, with the link up, and let TCP finish closing the connections
  # (all sockets in TIME-WAIT, which does not outlive a namespace): a socket still sending when the
  # namespace of its peer goes retransmits for a minute or two, and keeps its own namespace (and
  # the names `up` needs) alive meanwhile.
  ip link set veth-h2 up 2>/dev/null
  local ns pids i t=$SECONDS
  for ns in mpih1 mpih2; do
    pids=$(ip netns pids $ns 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  done
  for ((i = 0; i < 150; ++i)); do
    for ns in mpih1 mpih2; do ip netns exec $ns ss -tanH 2>/dev/null; done > "$work/sockets"
    grep -qv '^TIME-WAIT' "$work/sockets" || break
    sleep 0.2
  done
  timeout 120 bash "$tool" down >/dev/null 2>&1 || echo "$test: '$tool down' failed or timed out"
  wait_hosts_gone 90 || echo "$test: the simulated hosts' ports are still there 90 s after '$tool down'"
  echo "$test: teardown $((SECONDS - t)) s"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
t_start=$SECONDS
bash "$tool" up 2 || fail "'$tool up 2' failed"

cfg=$src/tests/configs/tiny_train.toml
compare="/usr/bin/python3 $src/tests/integration/compare_runs.py"
# host2's bridge port's traffic, both ways, in bytes.
veth_bytes() { echo $(( $(cat /sys/class/net/veth-h2/statistics/tx_bytes) +
                        $(cat /sys/class/net/veth-h2/statistics/rx_bytes) )); }
ranks_left() {  # cleave processes still running in the simulated hosts
  local i p
  for i in 1 2; do
    for p in $(ip netns pids mpih$i 2>/dev/null); do cat "/proc/$p/comm" 2>/dev/null; done
  done | grep -cx cleave
}
# reference NAME [--set ...]: the single-process run into $work/NAME, outside the hosts.
reference() {
  local name=$1; shift
  timeout 120 mpirun -np 1 "$cleave" train "$cfg" "$@" --set train.out_dir="$work/$name" \
    > "$work/$name.log" 2>&1 9>&- || { tail -20 "$work/$name.log"; fail "the 1-rank reference run $name failed"; }
}
