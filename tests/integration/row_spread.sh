#!/usr/bin/env bash
# Measures the honest spread of single vocabulary rows and experts that compare_runs.py's
# ROW_BOUND is derived from (its docstring has the numbers): honest layouts against their
# one-process reference, 20 steps of tests/configs/tiny_train.toml as the layout tests run it,
# compared with `compare_runs.py --report`, which prints every row tensor's worst row and every
# expert over the runs. Not a ctest test.
#   bash tests/integration/row_spread.sh build/cleave . build/testdata WORK dense DTYPE [SEED]
#     GPT-2 (tied) and Llama (2 kv heads, untied head), each: global batch 8 against one process
#     of 8 x 1; DDP 2, ZeRO-3 x 2 accumulating 2, tp 2, tp 2 with SP, pp 2 (4 x 2), cp 2, DDP 4,
#     HSDP 2x2 and tp 2 x ZeRO-1 x 2 accumulating 2, one process accumulating 2 and 4; and a
#     257-token vocabulary at tp 2 (a padded row).
#   bash tests/integration/row_spread.sh build/cleave . build/testdata WORK moe DTYPE [TOP_K [SEED]]
#     moe_test.sh's Llama mixture of experts (sigmoid_bias router, so the balancing biases too):
#     ep 2, tp 2, ep 2 x pp 2, cp 2 with ep 2, ZeRO-3 x 2 with ep 2, one process accumulating 4.
#   bash tests/integration/row_spread.sh build/cleave . build/testdata WORK fp8 RECIPE [SEED]
#     fp8_layouts.sh's layouts of the recipe.
#   bash tests/integration/row_spread.sh build/cleave . build/testdata WORK llama4 [DTYPE]
#     the 4-layer Llama of issue 27 in DTYPE (bf16 unless given): 4 kv heads, untied, vocabulary
#     320, sequences of 32, 8 x 4 micro-batches, lr 3e-3, 12 steps; one process of 4 x 8, DDP 2
#     and tp 2 against one process of 8 x 4. Its token files are made in WORK.
# STEPS (20 unless set) steps.
# shellcheck disable=SC2046  # $(batch N) is two --set pairs, split on purpose
set -euo pipefail
cleave=$1 src=$2 data=$3 work=$4 mode=$5
mkdir -p "$work"
cfg=$src/tests/configs/tiny_train.toml
compare() { /usr/bin/python3 "$src/tests/integration/compare_runs.py" --report "$@" \
              || echo "(runs above exceed the bounds)"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
common=(--set train.steps="${STEPS:-20}" --set train.log_interval=1 --set train.val_interval=10
        --set train.checkpoint_interval=10 --set train.threads=1 --set parallel.comm_timeout_s=60)
run() {  # name ranks [--set ...]
  local name=$1 np=$2; shift 2
  [ -f "$work/$name/metrics.jsonl" ] && return 0  # measured already
  if ! timeout 300 mpirun --oversubscribe -np "$np" "$cleave" train "$cfg" --set data.dir="$data" \
      "${common[@]}" --set train.out_dir="$work/$name" "$@" > "$work/$name.log" 2>&1; then
    echo "FAIL: run $name"; tail -20 "$work/$name.log"; exit 1
  fi
}
batch() { echo --set train.micro_batch_size="$1" --set train.grad_accum_steps=$((8 / $1)); }

case $mode in
dense)
  dtype=$6 seed=${7:-1234}
  for family in gpt2 llama; do
    m=(--set train.dtype="$dtype" --set train.seed="$seed")
    [ $family = llama ] && m+=(--set model.family=llama --set model.n_kv_heads=2)
    p=$family-$dtype-s$seed
    run "$p"-ref 1 "${m[@]}" $(batch 8)
    run "$p"-ddp2 2 "${m[@]}" $(batch 8) --set parallel.dp_shard=2
    run "$p"-zero3x2-a2 2 "${m[@]}" $(batch 4) --set parallel.dp_shard=2 --set parallel.zero_stage=3
    run "$p"-tp2 2 "${m[@]}" $(batch 8) --set parallel.tp=2
    run "$p"-tp2-sp 2 "${m[@]}" $(batch 8) --set parallel.tp=2 --set parallel.sequence_parallel=true
    run "$p"-pp2 2 "${m[@]}" $(batch 4) --set parallel.pp=2
    run "$p"-cp2 2 "${m[@]}" $(batch 8) --set parallel.cp=2
    run "$p"-ddp4 4 "${m[@]}" $(batch 8) --set parallel.dp_shard=4
    run "$p"-hsdp2x2 4 "${m[@]}" $(batch 4) --set parallel.dp_replicate=2 --set parallel.dp_shard=2 \
      --set parallel.zero_stage=3
    run "$p"-tp2-dp2 4 "${m[@]}" $(batch 4) --set parallel.tp=2 --set parallel.dp_shard=2 \
      --set parallel.zero_stage=1
    run "$p"-a2 1 "${m[@]}" $(batch 4)
    run "$p"-a4 1 "${m[@]}" $(batch 2)
    echo "== $p"
    compare "$work/$p-ref" "$work/$p"-{ddp2,zero3x2-a2,tp2,tp2-sp,pp2,cp2,ddp4,hsdp2x2,tp2-dp2,a2,a4}
  done
  # A 257-token vocabulary: tp 2 pads it to 2 x 129 rows.
  [ -f "$work/v257/train.bin" ] || "$cleave" tokenize "$cfg" --set data.corpus="$data/corpus.txt" \
    --set data.dir="$work/v257" --set model.vocab_size=257 > /dev/null
  v=(--set data.dir="$work/v257" --set model.vocab_size=257 --set train.dtype="$dtype"
     --set train.seed="$seed" --set model.family=llama --set model.n_kv_heads=2)
  p=v257-$dtype-s$seed
  run "$p"-ref 1 "${v[@]}" $(batch 8)
  run "$p"-tp2 2 "${v[@]}" $(batch 8) --set parallel.tp=2
  echo "== $p"
  compare "$work/$p-ref" "$work/$p-tp2"
  ;;
moe)
  dtype=$6 k=${7:-2} seed=${8:-1234}
  m=(--set model.family=llama --set model.n_kv_heads=2 --set model.moe_experts=4
     --set model.moe_top_k="$k" --set model.moe_ffn_hidden=64 --set model.moe_shared_experts=1
     --set model.moe_aux_loss_coef=0.01 --set model.moe_z_loss_coef=0.001
     --set model.moe_router=sigmoid_bias --set train.dtype="$dtype" --set train.seed="$seed")
  p=moe-$dtype-k$k-s$seed
  run "$p"-ref 1 "${m[@]}" $(batch 4)
  run "$p"-ep2 2 "${m[@]}" $(batch 4) --set parallel.dp_shard=2 --set parallel.ep=2
  run "$p"-tp2 2 "${m[@]}" $(batch 4) --set parallel.tp=2
  run "$p"-ep2-pp2 4 "${m[@]}" $(batch 4) --set parallel.dp_shard=2 --set parallel.ep=2 --set parallel.pp=2
  run "$p"-cp2-ep2 2 "${m[@]}" $(batch 4) --set parallel.cp=2 --set parallel.ep=2
  run "$p"-zero3-ep2 2 "${m[@]}" $(batch 4) --set parallel.dp_shard=2 --set parallel.zero_stage=3 \
    --set parallel.ep=2
  run "$p"-a4 1 "${m[@]}" $(batch 2)
  echo "== $p"
  compare "$work/$p-ref" "$work/$p"-{ep2,tp2,ep2-pp2,cp2-ep2,zero3-ep2,a4}
  ;;
fp8)
  r=$6 seed=${7:-1234}
  common+=(--set train.seed="$seed")
  work=$work/s$seed
  mkdir -p "$work"
  source "$src/tests/integration/fp8_layouts.sh"
  layout() {  # as layouts.sh's, once, with the report
    local ref=$1 name=$2 np=$3; shift 3
    run "$name" "$np" "$@"
    compare "$work/$ref" "$work/$name"
  }
  fp8_layouts "$r"
  ;;
llama4)
  [ -f "$work/v320/train.bin" ] || "$cleave" tokenize "$cfg" --set data.corpus="$data/corpus.txt" \
    --set data.dir="$work/v320" --set model.vocab_size=320 > /dev/null
  common=(--set train.steps=12 --set train.log_interval=1 --set train.val_interval=6
          --set train.checkpoint_interval=12 --set train.threads=1 --set parallel.comm_timeout_s=60)
  m=(--set data.dir="$work/v320" --set model.vocab_size=320 --set model.family=llama
     --set model.n_layers=4 --set model.n_kv_heads=4 --set model.tie_embeddings=false
     --set train.dtype="${6:-bf16}" --set train.seq_len=32 --set optim.lr=3e-3)
  p=l4-${6:-bf16}
  run "$p"-ref 1 "${m[@]}" --set train.micro_batch_size=8 --set train.grad_accum_steps=4
  run "$p"-a8 1 "${m[@]}" --set train.micro_batch_size=4 --set train.grad_accum_steps=8
  run "$p"-ddp2 2 "${m[@]}" --set train.micro_batch_size=8 --set train.grad_accum_steps=4 \
    --set parallel.dp_shard=2
  run "$p"-tp2 2 "${m[@]}" --set train.micro_batch_size=8 --set train.grad_accum_steps=4 \
    --set parallel.tp=2
  echo "== $p"
  compare "$work/$p-ref" "$work/$p"-{a8,ddp2,tp2}
  ;;
esac
