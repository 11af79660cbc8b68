#!/usr/bin/env bash
# cleave DDP (2 ranks x 1 thread) against the PyTorch gloo DDP peer (../shared/peer, 2 processes,
# modes installed and tuned) on GPT-2 124M (sequence 256, global batch 4), fp32 and bf16, the
# programs alternating, REPEATS rounds; and cleave 2x1 against cleave 1 rank x 2 threads at the
# same global batch (scaling efficiency); and cleave ZeRO-1 2x1 (the optimizer step sharded, as
# Megatron's distributed optimizer: each rank updates half the parameters). Every cleave run is
# unbound (mpirun --bind-to none), as the peer's spawned processes are. Prints median tokens/s,
# ratios and cleave's exposed communication per step. CLEAVE_BENCH_SMOKE=1 (bench/common.sh):
# vocab 256, the tiny model, fp32 only, 3 steps, one round.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] bench/ddp_vs_pytorch.sh [VOCAB=8192]
#       [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
vocab=${1:-8192} repeats=${2:-3}
source bench/common.sh
need_peer
dtypes="fp32 bf16" steps=13 model=() tokens=1024  # global tokens per step: 4 x 256
[ "$smoke" = 1 ] && vocab=256 repeats=1 dtypes=fp32 steps=3 model=("${tiny[@]}") tokens=128
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000

cleave_run() {  # dtype ranks threads zero_stage -> "tok/s exposed_ms step_ms"
  local dtype=$1 np=$2 threads=$3 zero=$4 out=$work/run-$1-$2x$3-z$4
  rm -rf "$out"
  # Unbound, as the peer's spawned processes are: a rank bound to one core shares it with its
  # communication progress thread, measured 9-33% slower at 2 x 1 bf16 (docs/performance.md).
  mpirun --oversubscribe --bind-to none -np "$np" "$cleave" train configs/gpt2_124m.toml --set data.dir="$work" \
    --set model.vocab_size="$vocab" "${model[@]}" --set train.dtype="$dtype" --set train.steps=$steps \
    --set train.log_interval=1 --set train.val_interval=0 --set train.checkpoint_interval=-1 \
    --set train.threads="$threads" --set parallel.dp_shard="$np" --set parallel.zero_stage="$zero" \
    --set train.out_dir="$out" \
    > "$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
  local tok; tok=$(field "$out" tokens_per_s)
  echo "$tok $(field "$out" exposed_comm_ms) $(awk -v n="$tokens" -v t="$tok" 'BEGIN {print 1e3 * n / t}')"
}

declare -A tok exposed step
for round in $(seq "$repeats"); do
  for dtype in $dtypes; do
    # Through r, so that a failed run stops the script (set -e).
    r=$(cleave_run "$dtype" 2 1 0)
    read -r t e s <<<"$r"
    tok[ddp-$dtype]+="$t " exposed[ddp-$dtype]+="$e " step[ddp-$dtype]+="$s "
    r=$(cleave_run "$dtype" 1 2 0)
    read -r t e s <<<"$r"
    tok[single-$dtype]+="$t "
    r=$(cleave_run "$dtype" 2 1 1)
    read -r t e s <<<"$r"
    tok[zero1-$dtype]+="$t "
    tok[installed-$dtype]+="$(peer_run installed "$dtype" 2) "
    tok[tuned-$dtype]+="$(peer_run tuned "$dtype" 2) "
    echo "round $round $dtype: ddp ${tok[ddp-$dtype]}| 1x2 ${tok[single-$dtype]}| zero1 ${tok[zero1-$dtype]}| installed ${tok[installed-$dtype]}| tuned ${tok[tuned-$dtype]}" >&2
  done
done
m() { tr ' ' '\n' <<<"$1" | grep . | median; }
echo "GPT-2 124M, vocab $vocab, seq 256, global batch 4; median tokens/s over $repeats rounds"
printf "%-6s %10s %12s %12s %10s %9s %11s %13s %12s %9s\n" dtype "cleave 2x1" "cleave 1x2" torch-inst torch-tuned "vs torch" "scaling" "exposed comm" "ZeRO-1 2x1" "vs torch"
for dtype in $dtypes; do
  d=$(m "${tok[ddp-$dtype]}") s=$(m "${tok[single-$dtype]}") i=$(m "${tok[installed-$dtype]}") t=$(m "${tok[tuned-$dtype]}")
  z=$(m "${tok[zero1-$dtype]}")
  e=$(m "${exposed[ddp-$dtype]}") st=$(m "${step[ddp-$dtype]}")
  best=$(awk -v a="$i" -v b="$t" 'BEGIN {print (a > b ? a : b)}')
  printf "%-6s %10.0f %12.0f %12.0f %10.0f %8.2fx %10.0f%% %6.0f ms (%.0f%%) %12.0f %8.2fx\n" "$dtype" "$d" "$s" "$i" "$t" \
    "$(awk -v c="$d" -v b="$best" 'BEGIN {print c / b}')" "$(awk -v d="$d" -v s="$s" 'BEGIN {print 100 * d / s}')" \
    "$e" "$(awk -v e="$e" -v s="$st" 'BEGIN {print 100 * e / s}')" "$z" "$(awk -v c="$z" -v b="$best" 'BEGIN {print c / b}')"
done
