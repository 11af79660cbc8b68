# Shared by fp8_delayed_test.sh, fp8_recipes_test.sh and equivalence_spread.sh's fp8 mode: source it
# after layouts.sh. fp8_layouts RECIPE runs the one-process references and each layout of an FP8
# recipe (docs/precision.md#fp8): DDP 2, ZeRO-3 x 2, HSDP 2x2, tp 2 with SP, pp 2 under 1f1b, cp 2,
# global batch 8 as 2 micro-batches, each compared (compare_runs.py's fp8 bounds) with the one
# process whose micro-batches hold what each of the layout's ranks multiplies at once: current
# scales and the tiles along the tokens are taken per micro-batch, so data parallelism with 4
# samples per global micro-batch is compared with one process running micro-batches of 4 / dp
# (for delayed scaling every such reference is the same run, up to rounding).
fp8_layouts() {
  local r=$1
  local fp8=(--set train.dtype=fp8 --set train.fp8_recipe="$r")
  batch() { echo --set train.micro_batch_size="$1" --set train.grad_accum_steps=$((8 / $1)); }
  run "$r-ref" 1 "${fp8[@]}" $(batch 4)
  run "$r-ref-m2" 1 "${fp8[@]}" $(batch 2)
  run "$r-ref-m1" 1 "${fp8[@]}" $(batch 1)
  layout "$r-ref-m2" "$r-ddp2" 2 "${fp8[@]}" $(batch 4) --set parallel.dp_shard=2
  layout "$r-ref-m2" "$r-zero3x2" 2 "${fp8[@]}" $(batch 4) --set parallel.dp_shard=2 \
    --set parallel.zero_stage=3
  layout "$r-ref-m1" "$r-hsdp2x2" 4 "${fp8[@]}" $(batch 4) --set parallel.dp_replicate=2 \
    --set parallel.dp_shard=2 --set parallel.zero_stage=3
  layout "$r-ref" "$r-tp2-sp" 2 "${fp8[@]}" $(batch 4) --set parallel.tp=2 \
    --set parallel.sequence_parallel=true
  layout "$r-ref" "$r-pp2" 2 "${fp8[@]}" $(batch 4) --set parallel.pp=2 --set parallel.pp_schedule=1f1b
  layout "$r-ref" "$r-cp2" 2 "${fp8[@]}" $(batch 4) --set parallel.cp=2
}
