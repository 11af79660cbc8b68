#!/usr/bin/env bash
# Tensor- and sequence-parallel layouts against the single-process reference
# (docs/tensor_parallel.md): GPT-2 and Llama at tp 2 and 4 with sequence parallelism off and on,
# Llama's 2 kv heads replicated over tp 4, a vocabulary of 257 (padded over tp 2 and 4), tp with
# DDP, ZeRO-1, ZeRO-2 and ZeRO-3 under gradient accumulation, HSDP 2x2 x tp 2 on 8 ranks, and bf16.
# Every layout is run twice: the rerun is bitwise identical (losses, gradient norms, checkpoint
# files). Checkpoints resume across tp and data-parallel layouts with the reference's losses, and
# every layout error has its exact message. compare_runs.py holds the bounds.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=("${twenty_steps[@]}")
one_micro=(--set train.micro_batch_size=8 --set train.grad_accum_steps=1)
accum2=(--set train.micro_batch_size=4 --set train.grad_accum_steps=2)
llama=(--set model.family=llama --set model.n_kv_heads=4)
llama_kv2=(--set model.family=llama --set model.n_kv_heads=2)

# A 257-token vocabulary: not divisible by 2 or 4.
"$cleave" tokenize "$cfg" --set data.corpus="$data/corpus.txt" --set data.dir="$work/v257" \
  --set model.vocab_size=257 > /dev/null
vocab257=(--set data.dir="$work/v257" --set model.vocab_size=257)

sp=(--set parallel.sequence_parallel=true)
run ref 1 "${one_micro[@]}"
run ref-llama 1 "${one_micro[@]}" "${llama[@]}"
for tp in 2 4; do
  layout ref "gpt2-tp$tp" "$tp" "${one_micro[@]}" --set parallel.tp=$tp
  layout ref "gpt2-tp$tp-sp" "$tp" "${one_micro[@]}" --set parallel.tp=$tp "${sp[@]}"
  layout ref-llama "llama-tp$tp" "$tp" "${one_micro[@]}" "${llama[@]}" --set parallel.tp=$tp
  layout ref-llama "llama-tp$tp-sp" "$tp" "${one_micro[@]}" "${llama[@]}" --set parallel.tp=$tp "${sp[@]}"
done
axis_bytes tp gpt2-tp2
axis_bytes tp gpt2-tp4-sp
axis_bytes tp llama-tp4-sp
# Placement checks on every module boundary find nothing wrong in an honest layout.
run gpt2-tp2-checked 2 "${one_micro[@]}" --set parallel.tp=2 --set parallel.check_placements=true
$compare "$work/ref" "$work/gpt2-tp2-checked"
# Each rank keeps one of the 2 kv heads, shared with one other rank.
run ref-kv2 1 "${one_micro[@]}" "${llama_kv2[@]}"
layout ref-kv2 llama-kv2-tp4 4 "${one_micro[@]}" "${llama_kv2[@]}" --set parallel.tp=4
axis_bytes tp llama-kv2-tp4
run ref-v257 1 "${one_micro[@]}" "${vocab257[@]}"
layout ref-v257 v257-tp2 2 "${one_micro[@]}" "${vocab257[@]}" --set parallel.tp=2
layout ref-v257 v257-tp4-sp 4 "${one_micro[@]}" "${vocab257[@]}" --set parallel.tp=4 "${sp[@]}"
# The checkpoint holds the global 257-row tensors, as at tp 1.
/usr/bin/python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["tensors"]["param/embed.wte"]
assert t["shape"] == [257, 64] and len(t["pieces"]) == 4, t' \
  "$work/v257-tp4-sp/step_00000020/meta.json" \
  || { echo "FAIL: the tp 4 checkpoint does not hold embed.wte as [257, 64] in 4 pieces"; exit 1; }

# With data parallelism, under gradient accumulation.
run ref-a2 1 "${accum2[@]}"
layout ref-a2 tp2-ddp2 4 "${accum2[@]}" --set parallel.tp=2 --set parallel.zero_stage=0
layout ref-a2 tp2-zero1x2 4 "${accum2[@]}" --set parallel.tp=2 --set parallel.zero_stage=1
layout ref-a2 tp2-zero2x2-sp 4 "${accum2[@]}" --set parallel.tp=2 --set parallel.zero_stage=2 "${sp[@]}"
layout ref-a2 tp2-zero3x2 4 "${accum2[@]}" --set parallel.tp=2 --set parallel.zero_stage=3
axis_bytes tp tp2-zero3x2
layout ref-a2 hsdp2x2-tp2 8 "${accum2[@]}" --set parallel.tp=2 --set parallel.dp_replicate=2 \
  --set parallel.dp_shard=2 --set parallel.zero_stage=3

run ref-bf16 1 "${one_micro[@]}" --set train.dtype=bf16
layout ref-bf16 bf16-tp2 2 "${one_micro[@]}" --set train.dtype=bf16 --set parallel.tp=2
layout ref-bf16 bf16-tp2-sp 2 "${one_micro[@]}" --set train.dtype=bf16 --set parallel.tp=2 "${sp[@]}"

# Resume across layouts: tp 2 x ZeRO-3 x 2 stops at step 10 and tp 1 x DDP 4 resumes; the reverse;
# tp 4 stops and tp 2 with sequence parallelism resumes.
om="${one_micro[*]}"
resume tp2zero3-to-ddp4 4 "$om --set parallel.tp=2 --set parallel.zero_stage=3" 4 "$om --set parallel.zero_stage=0"
resume ddp4-to-tp2zero3 4 "$om --set parallel.zero_stage=0" 4 "$om --set parallel.tp=2 --set parallel.zero_stage=3"
resume tp4-to-tp2sp 4 "$om --set parallel.tp=4" 4 \
  "$om --set parallel.tp=2 --set parallel.dp_shard=2 --set parallel.sequence_parallel=true"

# export and generate read a tp checkpoint (as tp 1).
"$cleave" export "$work/tp2-zero3x2" "$work/hf" > /dev/null
"$cleave" export "$work/ref-a2" "$work/hf-ref" > /dev/null
/usr/bin/python3 - "$work/hf/model.safetensors" "$work/hf-ref/model.safetensors" <<'EOF'
import json, struct, sys
import numpy as np
def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (v["shape"], np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32))
            for k, v in header.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys(), "exports name other tensors"
for k in a:
    assert a[k][0] == b[k][0], f"{k}: shape {a[k][0]} against {b[k][0]}"
    assert np.abs(a[k][1] - b[k][1]).max() < 1e-3, f"{k}: values differ"
EOF
"$cleave" generate "$work/tp2-zero3x2" --prompt "The" --max-new-tokens 8 > "$work/gen.txt"
[ -s "$work/gen.txt" ] || { echo "FAIL: generate from a tp checkpoint printed nothing"; exit 1; }

# Layout errors: one message each, exactly.
expect_error 3 "model.n_heads = 4 cannot be split over parallel.tp = 3: n_heads must be divisible by tp" \
  --set parallel.tp=3
expect_error 4 "model.n_kv_heads = 3 cannot be split over parallel.tp = 2: n_kv_heads must be divisible by tp (kv heads split) or divide tp (kv heads replicated)" \
  --set model.family=llama --set model.n_heads=6 --set model.n_kv_heads=3 --set model.d_model=96 \
  --set parallel.tp=2
expect_error 4 "model.vocab_size = 6 cannot be split over parallel.tp = 4: with 2 rows per rank the last rank would hold none" \
  --set parallel.tp=4 --set model.vocab_size=6
expect_error 2 "parallel.sequence_parallel = true needs parallel.tp > 1: it splits the rows between the tensor-parallel linears over the tp ranks" \
  "${sp[@]}"
echo "tensor-parallel layouts match the reference"
