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

# The inference benchmarks' model (bench/inference.sh, bench/serve.sh): a Llama of GPT-2 124M's
# shape (configs/gpt2_124m.toml with model.family=llama, vocab VOCAB) trained one step on random
# tokens, in $work/run, at $threads threads; a tokenizer of VOCAB pieces trained on the corpus,
# $work/tok/tokenizer.model (llama.cpp's GGUF files must carry one; a smoke run trains it on the
# head of the corpus, as the tests' fixture does); and its GGUF export in each of DTYPES (fp32:
# the F32 GGUF, bf16: the BF16 one), $work/model-<dtype>.gguf. The model keys after DTYPES come
# after the shape's (a smoke run's ${tiny[@]}; a longer context: a Llama's model.max_seq_len has
# no weights).
#   bench_model VOCAB "DTYPES" [--set KEY=VALUE ...]
gguf_dtype() { [ "$1" = fp32 ] && echo f32 || echo bf16; }
bench_model() {
  local vocab=$1 dtypes=$2 dtype corpus=../shared/data/tinyshakespeare.txt
  shift 2
  /usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 200000
  OMP_NUM_THREADS=$threads "$cleave" train configs/gpt2_124m.toml --set data.dir="$work" \
    --set model.family=llama --set model.vocab_size="$vocab" "$@" --set train.steps=1 \
    --set train.micro_batch_size=1 --set train.val_interval=0 --set train.checkpoint_interval=0 \
    --set train.threads=$threads --set train.out_dir="$work/run" > "$work/train.log" 2>&1 \
    || { cat "$work/train.log"; return 1; }
  [ -f "$corpus" ] || corpus=data/fortunes.txt
  mkdir -p "$work/tok"
  if [ "$smoke" = 1 ]; then head -c 300000 "$corpus" > "$work/tok/corpus.txt"; else cp "$corpus" "$work/tok/corpus.txt"; fi
  "$cleave" tokenize configs/gpt2_124m.toml --set data.corpus="$work/tok/corpus.txt" \
    --set data.dir="$work/tok" --set model.vocab_size="$vocab" > "$work/tok.log" 2>&1 \
    || { cat "$work/tok.log"; return 1; }
  for dtype in $dtypes; do
    "$cleave" export "$work/run" "$work/model-$dtype.gguf" --format gguf --dtype "$(gguf_dtype "$dtype")" \
      --tokenizer "$work/tok/tokenizer.model" > /dev/null
  done
}
