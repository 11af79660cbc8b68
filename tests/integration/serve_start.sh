# Sourced by the serve tests: start LOG COMMAND... runs a `cleave serve` command in the background
# and waits until it listens; sets pid (the command's), server (the process that serves: under
# mpirun, rank 0) and base (its URL), and adds pid to pids. A server that exits or does not start
# within start_seconds (60 unless set; bench/serve.sh's larger model takes longer) fails with its
# log.
start() {
  local log=$1 port=""
  shift
  # The log exists before the first look at it: the background command opens it only once it
  # runs, and on a busy machine the loop's first sed can come first (and end the test under set -e).
  : > "$log"
  "$@" > "$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq $((${start_seconds:-60} * 10))); do
    port=$(sed -n 's|^# serve: listening on http://127.0.0.1:\([0-9]*\) (pid [0-9]*)$|\1|p' "$log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2> /dev/null || { echo "FAIL: the server exited:"; cat "$log"; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "FAIL: the server did not start:"; cat "$log"; exit 1; }
  base=http://127.0.0.1:$port
  server=$(sed -n 's|^# serve: listening on .* (pid \([0-9]*\))$|\1|p' "$log")
}
