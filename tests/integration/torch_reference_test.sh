#!/usr/bin/env bash
# The whole model against an independent PyTorch implementation (torch_reference.py): logits,
# loss and every parameter gradient, fp32, for GPT-2 (tied and untied head) and Llama (GQA with
# untied head, multi-query with tied head; short sequences and sequences of several attention
# blocks), each with the model's own init and with its norm
# weights and biases moved off their trivial init (--perturb). Also checks that the comparison can
# fail: deliberately broken references must be rejected.
# Usage: torch_reference_test.sh CLEAVE_BINARY SOURCE_DIR [TEST_DATA_DIR (unused)]
# model_dump is found next to the cleave binary under tests/, or at $MODEL_DUMP.
set -euo pipefail
cleave=$1 src=$2
dump=${MODEL_DUMP:-$(dirname "$cleave")/tests/model_dump}
python=${PYTHON:-/usr/bin/python3}
ref=$src/tests/integration/torch_reference.py
[ -x "$dump" ] || { echo "FAIL: model_dump not found at $dump (build the model_dump target)"; exit 1; }
"$python" -c "import torch, numpy" || { echo "FAIL: $python cannot import torch and numpy"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gpt2=$src/tests/configs/tiny_gpt2.toml llama=$src/tests/configs/tiny_llama.toml
moe="--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=48 --set model.moe_aux_loss_coef=0.05 --set model.moe_z_loss_coef=0.01"
# name | config | overrides
variants=(
  "gpt2_tied|$gpt2|"
  "gpt2_untied|$gpt2|--set model.tie_embeddings=false"
  "llama_gqa_untied|$llama|"
  "llama_mqa_tied|$llama|--set model.n_kv_heads=1 --set model.tie_embeddings=true"
  # Several attention blocks with ragged edges, head sizes 40 and 12.
  "gpt2_long|$gpt2|--set model.d_model=80 --set model.n_heads=2 --set model.max_seq_len=160 --set train.seq_len=129"
  "llama_long|$llama|--set model.d_model=48 --set model.max_seq_len=160 --set train.seq_len=150 --set train.micro_batch_size=1"
  # Mixtures of experts, the balancing terms in the gradients: Mixtral's layout, and cleave's own
  # for the other routers, shared experts, a dense first layer and GPT-2's experts.
  "mixtral|$llama|$moe --set model.moe_router=topk_softmax"
  "llama_moe_softmax_topk|$llama|$moe --set model.moe_router=softmax_topk --set model.moe_shared_experts=1 --set model.moe_first_dense=1"
  "llama_moe_sigmoid|$llama|$moe --set model.moe_router=sigmoid_bias --set model.moe_shared_experts=2"
  "gpt2_moe|$gpt2|$moe --set model.moe_shared_experts=1"
)
dirs=()
for v in "${variants[@]}"; do
  IFS='|' read -r name cfg sets <<< "$v"
  for init in own perturbed; do
    extra=()
    [ "$init" = perturbed ] && extra=(--perturb)
    # shellcheck disable=SC2086  # $sets is a list of words
    "$dump" "$cfg" "$work/${name}_$init" $sets "${extra[@]}" \
      || { echo "FAIL: model_dump $name ($init init) failed"; exit 1; }
    dirs+=("$work/${name}_$init")
  done
done

# --self-test: on every model, each applicable deliberate break of the reference (exact GELU,
# flipped RoPE, no causal mask, wrong norm eps, wrong GQA grouping) must be caught.
"$python" "$ref" --self-test "${dirs[@]}" || { echo "FAIL: cleave disagrees with the PyTorch reference"; exit 1; }

# And a failed comparison makes the script exit non-zero.
if "$python" "$ref" --sabotage gelu_exact "$work/gpt2_tied_own" > "$work/sabotage.log" 2>&1; then
  cat "$work/sabotage.log"
  echo "FAIL: torch_reference.py exited 0 with a broken reference"
  exit 1
fi
echo "PASS: cleave matches the PyTorch reference"
