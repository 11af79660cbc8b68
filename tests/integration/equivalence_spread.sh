#!/usr/bin/env bash
# Re-measures the honest spread that compare_runs.py's bounds are derived from (docs/data_parallel.md,
# "Equivalence bounds"): runs that differ from the single-process reference only in the order of
# their reductions, compared with `compare_runs.py --report`, which prints every tensor's largest
# error over the runs. Not a ctest test (about 2 minutes on 2 cores).
#   bash tests/integration/equivalence_spread.sh build/cleave . build/testdata [WORK_DIR] [DTYPE...]
#   bash tests/integration/equivalence_spread.sh build/cleave . build/testdata WORK_DIR depth [DTYPE]
# DTYPEs: fp32, bf16 and fp16 unless given, or fp8-RECIPE. With "depth": DTYPE (bf16 unless given)
# instead, at 2, 4 and 8 layers (DEPTHS) and seeds 1234, 1 and 2, global batch 16 (the
# pipeline tests' 2 x 8 micro-batches), DDP 2 and 4, ZeRO-3 x 2, pp 2, tp 2 and one process
# accumulating 4 or 1, each against its own depth and seed's reference (docs/data_parallel.md,
# "bf16 and depth"; about a minute).
#   bash tests/integration/equivalence_spread.sh build/cleave . build/testdata WORK_DIR moe [DTYPE [TOP_K]]
# With "moe": moe_test.sh's Llama mixture of experts (4 experts) in DTYPE (bf16 unless given),
# top TOP_K (2 unless given), seeds 1234, 1 and 2: DDP 2, tp 2, ep 2 and 4, cp 2 with ep 2,
# ZeRO-3 x 2 with ep 2, and one process accumulating 4 (docs/moe.md, "Equivalence"; 30 s).
#   bash tests/integration/equivalence_spread.sh build/cleave . build/testdata WORK_DIR fp8 [RECIPE...]
# With "fp8": fp8_layouts.sh's layouts of each RECIPE (all four unless given), seeds 1234, 1 and 2
# (docs/precision.md#fp8; about 8 minutes).
# STEPS (20 unless set) steps in every mode.
set -euo pipefail
cleave=$1 src=$2 data=$3 work=${4:-$(mktemp -d)}
mkdir -p "$work"
cfg=$src/tests/configs/tiny_train.toml
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
common=(--set data.dir="$data" --set train.steps="${STEPS:-20}" --set train.log_interval=1
        --set train.val_interval=10 --set train.checkpoint_interval=10 --set train.threads=1
        --set parallel.comm_timeout_s=60)

run() {  # name ranks [--set ...]
  local name=$1 np=$2; shift 2
  if ! timeout 300 mpirun --oversubscribe -np "$np" "$cleave" train "$cfg" "${common[@]}" \
      --set train.out_dir="$work/$name" "$@" > "$work/$name.log" 2>&1; then
    echo "FAIL: run $name"; tail -20 "$work/$name.log"; exit 1
  fi
}
dtype_args() {  # fp32, bf16, fp16, or fp8-RECIPE (fp8-delayed, fp8-current, fp8-blockwise, fp8-mxfp8)
  case $1 in
    fp8-*) echo --set train.dtype=fp8 --set train.fp8_recipe="${1#fp8-}" ;;
    *) echo --set train.dtype="$1" ;;
  esac
}
layout() {  # replicate shard zero [--set ...]
  echo --set parallel.dp_replicate="$1" --set parallel.dp_shard="$2" --set parallel.zero_stage="$3" "${@:4}"
}

if [ "${5:-}" = depth ]; then
  b16() { echo --set train.micro_batch_size="$1" --set train.grad_accum_steps=$((16 / $1)); }
  for seed in 1234 1 2; do
    for L in ${DEPTHS:-2 4 8}; do
      at=($(dtype_args "${6:-bf16}") --set train.seed=$seed --set model.n_layers=$L)
      run s$seed-L$L-ref 1 "${at[@]}" $(b16 2)
      run s$seed-L$L-ddp2 2 "${at[@]}" $(b16 2)
      run s$seed-L$L-ddp4 4 "${at[@]}" $(b16 4)
      run s$seed-L$L-zero3x2 2 "${at[@]}" $(b16 2) $(layout 1 2 3)
      run s$seed-L$L-pp2 2 "${at[@]}" $(b16 2) --set parallel.pp=2
      run s$seed-L$L-tp2 2 "${at[@]}" $(b16 2) --set parallel.tp=2
      run s$seed-L$L-a4 1 "${at[@]}" $(b16 4)
      run s$seed-L$L-a1 1 "${at[@]}" $(b16 16)
      /usr/bin/python3 "$src/tests/integration/compare_runs.py" "$work/s$seed-L$L-ref" \
        "$work/s$seed-L$L"-{ddp2,ddp4,zero3x2,pp2,tp2,a4,a1} || echo "(runs above exceed the bounds)"
    done
  done
  exit 0
fi

if [ "${5:-}" = moe ]; then
  moe=(--set model.family=llama --set model.n_kv_heads=2 --set model.moe_experts=4
       --set model.moe_ffn_hidden=64 --set model.moe_shared_experts=1
       --set model.moe_aux_loss_coef=0.01 --set model.moe_z_loss_coef=0.001
       --set train.micro_batch_size=4 --set train.grad_accum_steps=2)
  for seed in 1234 1 2; do
    at=("${moe[@]}" --set train.dtype="${6:-bf16}" --set model.moe_top_k="${7:-2}"
        --set train.seed=$seed)
    run s$seed-ref 1 "${at[@]}"
    run s$seed-ddp2 2 "${at[@]}" $(layout 1 2 0)
    run s$seed-tp2 2 "${at[@]}" --set parallel.tp=2
    run s$seed-ep2 2 "${at[@]}" $(layout 1 2 0) --set parallel.ep=2
    run s$seed-ep4 4 "${at[@]}" $(layout 1 4 0) --set parallel.ep=4
    run s$seed-cp2-ep2 2 "${at[@]}" --set parallel.cp=2 --set parallel.ep=2
    run s$seed-zero3-ep2 2 "${at[@]}" $(layout 1 2 3) --set parallel.ep=2
    run s$seed-a4 1 "${at[@]}" --set train.micro_batch_size=2 --set train.grad_accum_steps=4
    /usr/bin/python3 "$src/tests/integration/compare_runs.py" --report "$work/s$seed-ref" \
      "$work/s$seed"-{ddp2,tp2,ep2,ep4,cp2-ep2,zero3-ep2,a4} || echo "(runs above exceed the bounds)"
  done
  exit 0
fi

if [ "${5:-}" = fp8 ]; then
  # fp8_layouts.sh's layouts of each recipe, seeds 1234, 1 and 2, each seed in its own folder.
  source "$src/tests/integration/fp8_layouts.sh"
  root=$work
  compare() { /usr/bin/python3 "$src/tests/integration/compare_runs.py" "$@" || true; }
  layout() {  # as layouts.sh's, once, without stopping at a failed comparison
    local ref=$1 name=$2 np=$3; shift 3
    run "$name" "$np" "$@"
    compare "$work/$ref" "$work/$name"
  }
  recipes=("${@:6}")
  [ ${#recipes[@]} -gt 0 ] || recipes=(delayed current blockwise mxfp8)
  base=("${common[@]}")
  for seed in 1234 1 2; do
    work=$root/s$seed
    mkdir -p "$work"
    common=("${base[@]}" --set train.seed=$seed)
    for r in "${recipes[@]}"; do fp8_layouts "$r"; done
  done
  exit 0
fi

dtypes=("${@:5}")
[ ${#dtypes[@]} -gt 0 ] || dtypes=(fp32 bf16 fp16)
for dtype in "${dtypes[@]}"; do
  # Global batch 8 against the one-process run without accumulation: data_parallel_test.sh's
  # layouts with accumulation 1 and 2, 8 ranks, small buckets, one process accumulating 2 and 4,
  # one process on 2 threads.
  batch() { echo --set train.dtype=$dtype --set train.micro_batch_size=$((8 / $1)) --set train.grad_accum_steps="$1"; }
  run $dtype-ref 1 $(batch 1)
  runs=()
  for accum in 1 2; do
    for l in "2 ddp 1 2 0" "2 zero1 1 2 1" "2 zero2 1 2 2" "2 zero3 1 2 3" "4 ddp 1 4 0" "4 zero1 1 4 1" \
             "4 zero2 1 4 2" "4 zero3 1 4 3" "4 hsdp 2 2 3" "4 hybrid-zero1 2 2 1"; do
      read -r np name replicate shard zero <<<"$l"
      run $dtype-$name$np-a$accum "$np" $(batch $accum) $(layout "$replicate" "$shard" "$zero")
      runs+=("$work/$dtype-$name$np-a$accum")
    done
  done
  run $dtype-ddp8 8 $(batch 1) $(layout 1 8 0)
  run $dtype-zero38 8 $(batch 1) $(layout 1 8 3)
  run $dtype-hsdp2x4 8 $(batch 1) $(layout 2 4 3)
  run $dtype-hsdp4x2 8 $(batch 1) $(layout 4 2 3)
  run $dtype-ddp4-10kb-buckets 4 $(batch 1) $(layout 1 4 0 --set parallel.bucket_mb=0.01)
  run $dtype-one-a2 1 $(batch 2)
  run $dtype-one-a4 1 $(batch 4)
  run $dtype-one-2threads 1 $(batch 1) --set train.threads=2
  /usr/bin/python3 "$src/tests/integration/compare_runs.py" --report "$work/$dtype-ref" "${runs[@]}" \
    "$work/$dtype"-{ddp8,zero38,hsdp2x4,hsdp4x2,ddp4-10kb-buckets,one-a2,one-a4,one-2threads} \
    || echo "(runs above exceed the bounds)"

  # Global batch 6: 3 and 6 ranks (rings of other sizes) against their own reference.
  b6=(--set train.dtype=$dtype --set train.micro_batch_size=6 --set train.grad_accum_steps=1)
  run $dtype-ref-b6 1 "${b6[@]}"
  run $dtype-ddp3-b6 3 "${b6[@]}" $(layout 1 3 0)
  run $dtype-zero23-b6 3 "${b6[@]}" $(layout 1 3 2)
  run $dtype-zero33-b6 3 "${b6[@]}" $(layout 1 3 3)
  run $dtype-zero26-b6 6 "${b6[@]}" $(layout 1 6 2)
  /usr/bin/python3 "$src/tests/integration/compare_runs.py" --report "$work/$dtype-ref-b6" \
    "$work/$dtype"-{ddp3,zero23,zero33,zero26}-b6 || echo "(runs above exceed the bounds)"
done
