# Sourced by every benchmark from the repository's root: the smoke mode, the binary, a work folder
# removed at exit, MPI's environment as root, and the median; the peer's helpers for those run
# against the PyTorch peer.
#   CLEAVE_BENCH_SMOKE=1: a smoke run: the benchmark's own runs, tables, ratios and PyTorch peer,
#     on a tiny model, one round of a few steps, in seconds. Its figures mean nothing; it shows
#     that the benchmark still runs to its report (tests/integration/bench_smoke_test.sh).
#   CLEAVE: the cleave binary (default build/cleave).
# shellcheck shell=bash disable=SC2034  # what it sets, the benchmarks read
smoke=${CLEAVE_BENCH_SMOKE:-0}
[ "$smoke" != 1 ] || echo "smoke run (CLEAVE_BENCH_SMOKE=1): a tiny model; its figures mean nothing"
cleave=${CLEAVE:-./build/cleave}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
# A smoke run shares the cores with other tests: OpenMP threads spinning at a barrier for a
# descheduled sibling would make its tiny steps crawl.
[ "$smoke" != 1 ] || export OMP_WAIT_POLICY=passive

median() { sort -g | awk '{a[NR]=$1} END {print (a[int((NR+1)/2)] + a[int((NR+2)/2)]) / 2}'; }
# The median of a metric over the last 10 logged steps of a run folder.
field() { grep "\"$2\"" "$1/metrics.jsonl" | tail -n 10 | sed "s/.*\"$2\":\([^,}]*\).*/\1/" | median; }

# The PyTorch peer (../shared/peer): checks it and its BLAS. Debian's PyTorch does its fp32 GEMMs
# through the system BLAS: without OpenBLAS (which python3-torch recommends) it falls back to the
# reference BLAS and runs about 20x slower, which only a smoke run may shrug off.
peer=$(cd .. && pwd)/shared/peer
need_peer() {
  [ -x "$peer/run_peer.sh" ] || { echo "needs the PyTorch peer at $peer"; exit 1; }
  local blas=libblas.so.3-x86_64-linux-gnu
  update-alternatives --query $blas 2>/dev/null | grep -q '^Value: .*openblas' ||
    [ "$smoke" = 1 ] || {
    echo "the PyTorch peer needs OpenBLAS as its BLAS: apt-get install -y libopenblas0-pthread libjemalloc2"
    exit 1
  }
}
# The peer's tokens/s: mode (installed|tuned), dtype, processes. A smoke run takes the peer's
# smallest model, one sequence per process, for one timed step and no warm-up, and runs it once
# per dtype and process count, in the first mode asked: the modes differ only in run_peer.sh's
# environment, and even so small a peer run costs 5-15 s here.
peer_run() {
  if [ "$smoke" != 1 ]; then
    peer_result "$@" --preset 124m --steps 10 --warmup 3
    return
  fi
  local once=$work/peer-$2-$3
  [ -s "$once" ] || peer_result "$@" --preset small --batch "$3" --steps 1 --warmup 0 > "$once" ||
    return 1
  cat "$once"
}
peer_result() {  # mode dtype processes [gpt_bench.py arguments]
  "$peer/run_peer.sh" "$@" --vocab "$vocab" | grep '^RESULT' | sed 's/.*| \([0-9.]*\) tok\/s.*/\1/'
}

# A smoke run's model, set after a benchmark's own model keys (and before any it varies): d_model
# 64, 4 heads, 2 layers, sequences of 32 tokens.
tiny=(--set model.d_model=64 --set model.n_heads=4 --set model.n_layers=2 --set train.seq_len=32)
