# Sourced by the benchmarks against the PyTorch peer: checks the peer and its BLAS, makes a work
# folder with random token shards of vocabulary $vocab, and defines median and metric helpers.
peer=$(cd .. && pwd)/shared/peer
[ -x "$peer/run_peer.sh" ] || { echo "needs the PyTorch peer at $peer"; exit 1; }
# Debian's PyTorch does its fp32 GEMMs through the system BLAS: without OpenBLAS (which
# python3-torch recommends) it falls back to the reference BLAS and runs about 20x slower.
update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep -q '^Value: .*openblas' ||
  { echo "the PyTorch peer needs OpenBLAS as its BLAS: apt-get install -y libopenblas0-pthread libjemalloc2"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

median() { sort -g | awk '{a[NR]=$1} END {print (a[int((NR+1)/2)] + a[int((NR+2)/2)]) / 2}'; }
# The median of a metric over the last 10 logged steps of a run folder.
field() { grep "\"$2\"" "$1/metrics.jsonl" | tail -n 10 | sed "s/.*\"$2\":\([^,}]*\).*/\1/" | median; }
# The peer's tokens/s: mode (installed|tuned), dtype, processes.
peer_run() {
  "$peer/run_peer.sh" "$1" "$2" "$3" --preset 124m --vocab "$vocab" --steps 10 --warmup 3 |
    grep '^RESULT' | sed 's/.*| \([0-9.]*\) tok\/s.*/\1/'
}
