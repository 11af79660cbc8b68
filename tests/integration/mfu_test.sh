#!/usr/bin/env bash
# MFU is quoted against a peak that bounds what a step can reach:
#  - `cleave peak` measures the GEMM peak once per machine, oneDNN version, dtype and threads,
#    caches it, reuses it on the next start and measures again with --refresh; the GEMM peak is
#    no higher than the hardware's FMA peak measured beside it;
#  - a tiny model, the quick start's model and GPT-2 124M each report MFU <= 100%, against the
#    cached (or just measured) GEMM peak, naming its source in the progress line and metrics.jsonl;
#  - bf16 forced to emulation (CLEAVE_EMULATE_BF16=1) says so and uses the fp32 peak.
# Args: the cleave binary, the source folder, the tokenized test data (vocabulary 256).
set -u
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_CACHE_HOME=$work/cache  # a cache of its own: the first start measures
fail() { echo "FAIL (mfu): $*"; exit 1; }
field() { sed -n "s/.*$1 \([0-9.]*\) GF\/s (\([a-z]*\)).*/\1 \2/p"; }  # "GEMM peak" -> "F source"

out=$("$cleave" peak --dtype fp32 --threads 2) || fail "cleave peak: $out"
echo "$out"
read -r first source <<<"$(field "GEMM peak" <<<"$out")"
[ "$source" = measured ] || fail "a fresh cache should be measured, got '$source'"
hardware=$(sed -n 's/.*hardware FMA peak \([0-9.]*\) GF\/s.*/\1/p' <<<"$out")
awk -v g="$first" -v h="$hardware" 'BEGIN { exit !(g > 0 && h > 0 && g <= 1.03 * h) }' \
  || fail "the GEMM peak $first GF/s should be positive and no higher than the hardware's $hardware GF/s"
stamp=$(grep -c measured_at "$XDG_CACHE_HOME/cleave/peaks.json")
[ "$stamp" = 1 ] || fail "the cache should hold one entry, holds $stamp"

read -r again source <<<"$("$cleave" peak --dtype fp32 --threads 2 | field "GEMM peak")"
[ "$source" = cached ] && [ "$again" = "$first" ] \
  || fail "a second start should reuse $first (cached), got $again ($source)"
read -r fresh source <<<"$("$cleave" peak --dtype fp32 --threads 2 --refresh | field "GEMM peak")"
[ "$source" = measured ] || fail "--refresh should measure again, got $source"
read -r after source <<<"$("$cleave" peak --dtype fp32 --threads 2 | field "GEMM peak")"
[ "$source" = cached ] && [ "$after" = "$fresh" ] \
  || fail "after --refresh the cache should hold $fresh, got $after ($source)"
# A timed hardware peak below the GEMM peak was disturbed (no GEMM outruns its FMA units): a
# cached one of 1 GF/s, with the GEMM figure gone, is timed again once the GEMM is measured.
/usr/bin/python3 - "$XDG_CACHE_HOME/cleave/peaks.json" <<'EOF'
import json, sys
cache = json.load(open(sys.argv[1]))
for entry in cache.values():
    entry["hardware"]["gflops"] = 1.0
    del entry["gemm_gflops"]
json.dump(cache, open(sys.argv[1], "w"))
EOF
out=$("$cleave" peak --dtype fp32 --threads 2) || fail "cleave peak: $out"
read -r gemm source <<<"$(field "GEMM peak" <<<"$out")"
hardware=$(sed -n 's/.*hardware FMA peak \([0-9.]*\) GF\/s.*/\1/p' <<<"$out")
[ "$source" = measured ] || fail "a cache without the GEMM peak should measure it, got '$source'"
awk -v g="$gemm" -v h="$hardware" 'BEGIN { exit !(h > 1 && g <= 1.03 * h) }' \
  || fail "a hardware peak of 1 GF/s under the GEMM's $gemm should be timed again, got $hardware"

train() {  # name config [--set ...]: every logged MFU <= 1, and the peak's source named
  local name=$1 cfg=$2; shift 2
  "$cleave" train "$cfg" --set train.out_dir="$work/$name" --set train.peak_gflops=0 \
    --set train.val_interval=0 --set train.checkpoint_interval=-1 --set train.threads=2 \
    --set train.log_interval=1 "$@" > "$work/$name.log" 2>&1 \
    || { tail -20 "$work/$name.log"; fail "$name: training failed"; }
  grep -E '^step +[0-9]+/' "$work/$name.log" | tail -3
  grep -qE 'MFU [0-9.]+% of [0-9]+ GF/s (measured|cached) \(hw [0-9]+\)' "$work/$name.log" \
    || fail "$name: the progress line should name the peak's source and the hardware peak"
  /usr/bin/python3 - "$work/$name/metrics.jsonl" "$name" <<'EOF' || exit 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"mfu"' in l]
if not rows:
    sys.exit(f"FAIL (mfu): {sys.argv[2]}: no MFU in metrics.jsonl")
for r in rows:
    if not (0 < r["mfu"] <= 1 and r["mfu_hardware"] <= r["mfu"] * 1.03):
        sys.exit(f"FAIL (mfu): {sys.argv[2]}: step {r['step']}: MFU {r['mfu']:.3f} against "
                 f"{r['peak_gflops']:.0f} GF/s ({r['peak_source']}), {r['mfu_hardware']:.3f} "
                 f"against the hardware's {r['hardware_peak_gflops']:.0f}")
    if r["peak_source"] not in ("measured", "cached"):
        sys.exit(f"FAIL (mfu): {sys.argv[2]}: peak source {r['peak_source']}")
print(f"{sys.argv[2]}: MFU at most {100 * max(r['mfu'] for r in rows):.1f}% "
      f"of {rows[0]['peak_gflops']:.0f} GF/s ({rows[0]['peak_source']})")
EOF
}

train tiny "$src/tests/configs/tiny_train.toml" --set data.dir="$data" --set train.steps=8
grep -q "(cached GEMM peak)" "$work/tiny.log" || fail "the tiny run should quote the cached fp32 peak"
# The quick start's model (bf16) on the test data's vocabulary.
train quickstart "$src/configs/quickstart.toml" --set data.dir="$data" \
  --set model.vocab_size=256 --set train.steps=12
# Forced emulation of bf16 products (the path of a CPU without bf16 matmuls): the run says so and
# quotes MFU against the fp32 peak cached above (a bf16 peak would be measured afresh).
CLEAVE_EMULATE_BF16=1 train emulated "$src/tests/configs/tiny_train.toml" --set data.dir="$data" \
  --set train.steps=4 --set train.dtype=bf16
grep -q "bf16 products emulated in fp32" "$work/emulated.log" \
  || fail "CLEAVE_EMULATE_BF16=1 should say the bf16 products are emulated"
grep -q "(cached GEMM peak)" "$work/emulated.log" \
  || fail "emulated bf16 should quote the cached fp32 peak"
# GPT-2 124M as bench/vs_pytorch.sh runs it, fp32, on random tokens.
mkdir -p "$work/tokens"
/usr/bin/python3 "$src/bench/random_tokens.py" "$work/tokens" 8192 200000
train gpt2_124m "$src/configs/gpt2_124m.toml" --set data.dir="$work/tokens" \
  --set train.dtype=fp32 --set train.steps=3
echo "mfu test: OK"
