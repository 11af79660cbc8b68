# Sourced: signals_routed PID... fails unless, in each process PID (a `cleave` command), one thread
# is named cleave-signals and leaves SIGTERM and SIGINT unblocked, and every other thread (the
# computing thread, OpenMP's, MPI's, the HTTP server's) blocks both (base/signal_thread.h): a
# handler run on a thread inside one of oneDNN's GEMM kernels writes its frame into the heap.
signals_routed() {
  local p task name mask blocked own
  for p in "$@"; do
    own=0
    for task in /proc/"$p"/task/*; do
      name=$(cat "$task/comm" 2> /dev/null) || continue  # a thread that ended meanwhile
      mask=$(sed -n 's/^SigBlk:[[:space:]]*//p' "$task/status" 2> /dev/null) || continue
      [ -n "$mask" ] || continue
      # SIGINT (2) and SIGTERM (15): bits 1 and 14.
      blocked=$(((0x$mask >> 1 & 1) + (0x$mask >> 14 & 1)))
      if [ "$name" = cleave-signals ]; then
        own=$((own + 1))
        [ $blocked = 0 ] || { echo "FAIL: process $p's signal thread blocks SIGTERM or SIGINT (SigBlk $mask)"; exit 1; }
      else
        [ $blocked = 2 ] || { echo "FAIL: process $p's thread $name (${task##*/}) takes SIGTERM or SIGINT (SigBlk $mask)"; exit 1; }
      fi
    done
    [ $own = 1 ] || { echo "FAIL: process $p has $own threads named cleave-signals, not 1"; exit 1; }
  done
}
