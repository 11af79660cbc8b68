#!/usr/bin/env bash
# cleave calibrate --quick writes a cluster file that cleave's reader takes back (tests/tools/
# cluster_info) with every figure measured:
#  (a) under mpirun with 2 ranks on this host: the GEMM tables of fp32 and bf16, their peaks, the
#      memory bandwidth, the element-wise kernels', packing's and attention's rates, and every
#      collective's alpha-beta on intra_host, each > 0, and the ranks' compute imbalance; inter_host
#      left out with a comment saying why; each figure printed as it was measured; the file says
#      when, on what CPU and oneDNN ISA, with how many ranks and threads;
#  (b) on one rank: no collectives and no imbalance, and it says so; --threads sets the threads
#      it measures with;
#  (c) a bad command line is refused.
# Args: the cleave binary (its folder holds tests/cluster_info), the source folder, test data.
set -u
cleave=$1
info="$(dirname "$1")/tests/cluster_info"
[ -x "$info" ] || { echo "FAIL: $info not built"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
check() {  # description, then a command that must succeed
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
positive() {  # file, awk pattern of lines, field numbers: each must be a number > 0
  local file=$1 pattern=$2
  shift 2
  awk -v fields="$*" "$pattern"' {
         n = split(fields, f, " ")
         for (i = 1; i <= n; i++) if (!($f[i] + 0 > 0)) { print "not > 0: " $0; bad = 1 }
         seen++
       }
       END { exit bad || !seen }' "$file"
}

# (a) two ranks on one host (a sanitized build runs many times slower: 20 minutes at most)
start=$SECONDS
limit=120
! ldd "$cleave" | grep -q libasan || limit=1200
timeout $limit mpirun --oversubscribe -np 2 "$cleave" calibrate --quick --out "$work/two.toml" \
  > "$work/two.log" 2>&1
rc=$?
echo "calibrate --quick, 2 ranks: $((SECONDS - start)) s, exit $rc"
if [ $rc -ne 0 ]; then cat "$work/two.log"; exit 1; fi
if ! "$info" "$work/two.toml" > "$work/two.info" 2>&1; then
  echo "FAIL: the file calibrate wrote does not read back:"; cat "$work/two.info"; exit 1
fi
cat "$work/two.info"
check "devices_per_host is the 2 ranks on this host" grep -q "^cluster two devices_per_host 2 " "$work/two.info"
check "memory per device and bandwidth > 0" positive "$work/two.info" '/^cluster /' 6 8
check "fp32 and bf16 peaks > 0" positive "$work/two.info" '/^peak (fp32|bf16) /' 3
check "fp16 and fp8 peaks unknown" test "$(grep -c '^peak fp\(16\|8\) unknown$' "$work/two.info")" = 2
check "GEMM tables of fp32 and bf16 (a 2x2x2 grid), predicting > 0" \
  test "$(grep -cE '^gemm (fp32|bf16) 8 seconds_1024 ' "$work/two.info")" = 2
check "GEMM predictions > 0" positive "$work/two.info" '/^gemm /' 5
for op in all_reduce all_gather reduce_scatter all_to_all send_recv; do
  check "intra_host $op: lines, beta and a 1 MiB prediction > 0" \
    positive "$work/two.info" "/^link intra_host $op /" 5 9 11
  check "intra_host $op printed as measured and fitted" \
    grep -qE "^intra_host $op +fit: alpha [0-9.]+ us per step" "$work/two.log"
done
check "intra_host compute_slowdown measured and printed" \
  grep -qE "^intra_host compute_slowdown: [0-9]+\.[0-9]{2}$" "$work/two.log"
check "... with what it was measured from" \
  grep -qE "^# all_reduce of [0-9.]+ [KM]iB alone [0-9.]+ ms; a computation alone" "$work/two.toml"
check "compute_imbalance measured and printed" \
  grep -qE "^compute imbalance: [0-9]+\.[0-9]{3} \(the slowest of 2 ranks that wait for each other" "$work/two.log"
check "... in the file, with what it was measured from" bash -c \
  "grep -qE '^compute_imbalance [1-9][0-9.]*$' '$work/two.info' && grep -qE '^# each followed by a sum over all 2 ranks: [0-9.]+ ms each' '$work/two.toml'"
check "alpha >= 0 everywhere" awk '/^link / && !($7 + 0 >= 0) { bad = 1 } END { exit bad }' "$work/two.info"
check "no inter_host figures (one host)" bash -c "! grep -q '^link inter_host' '$work/two.info'"
check "the file says why inter_host is left out" \
  grep -q "^# \[collectives.inter_host\] not measured: all 2 ranks share one host" "$work/two.toml"
check "the file says when, on what CPU and ISA, ranks and threads" \
  grep -qE "^# CPU: .*; oneDNN [0-9.]+ \(ISA [a-z0-9_ ]+\)\.$" "$work/two.toml"
check "... and with how many ranks and threads" \
  grep -q "^# 2 ranks on 1 host x 1 OpenMP thread\." "$work/two.toml"
check "... and when" grep -qE "^# Measured by \`cleave calibrate\` on [0-9]{4}-[0-9]{2}-[0-9]{2} " "$work/two.toml"
check "every GEMM shape printed as measured" \
  test "$(grep -cE '^gemm (fp32|bf16) tokens [0-9]+, in [0-9]+, out [0-9]+, GF/s:  fwd [0-9.]+' "$work/two.log")" = 16
check "every collective size printed as measured" \
  test "$(grep -cE '^intra_host [a-z_]+ +[0-9]+ [KM]iB: +[0-9.]+ us' "$work/two.log")" = 25
check "the GEMM table says its rounds (one with --quick)" \
  grep -q "^# timing at once; the median of 1 round over the grid; 1 thread per rank\.$" "$work/two.toml"
check "memory bandwidth printed" grep -qE "^memory bandwidth: [0-9.]+ GB/s per rank" "$work/two.log"
check "the element-wise kernels' rate > 0" positive "$work/two.info" '/^rates /' 3
check "... printed as measured" \
  grep -qE "^element-wise kernels: [0-9.]+ GB/s per rank \(GPT-2's \(hidden 512\) and Llama's" "$work/two.log"
check "weight packing measured (or said to need none) and printed" \
  grep -qE "^weight packing: ([0-9.]+ GB/s per rank of copies written|none )" "$work/two.log"
check "packing in the file when measured" \
  awk '/^rates / { if (($5 > 0) != packs) bad = 1 } END { exit bad }' \
  packs="$(grep -c '^weight packing: [0-9]' "$work/two.log")" "$work/two.info"
check "FP8's kernels measured (or said to take no time beyond bf16) and printed" \
  grep -qE "^FP8 kernels: ([0-9.]+ GB/s per rank \([0-9.]+ ms beyond bf16 for [0-9.e+-]+ MB\)|no time measured)" "$work/two.log"
check "FP8's rate in the file when measured" \
  awk '/^rates / { if (($11 > 0) != fp8) bad = 1 } END { exit bad }' \
  fp8="$(grep -c '^FP8 kernels: [0-9]' "$work/two.log")" "$work/two.info"
check "released memory's refault rates > 0, in the file and printed" \
  awk '/^rates / && $7 > 0 && $9 > 0 { ok = 1 } END { exit !ok }' "$work/two.info"
check "... printed as measured" grep -qE "^released memory written again: [0-9.e+-]+ GB/s per rank \(4 KiB pages\), [0-9.e+-]+ GB/s \(huge pages\); 256 KiB ranges of a 4 MiB buffer" "$work/two.log"
check "attention rates at 64 and 256 keys, > 0" \
  test "$(awk '/^attention (64|256) gflops / && $4 > 0 && $6 > 0' "$work/two.info" | wc -l)" = 2
check "... printed as measured" \
  test "$(grep -cE '^attention over (64|256) keys: [0-9.]+ GF/s per rank$' "$work/two.log")" = 2

# (b) one rank
start=$SECONDS
if ! "$cleave" calibrate --quick --threads 2 --out "$work/one.toml" > "$work/one.log" 2>&1; then
  echo "FAIL: calibrate on one rank"; cat "$work/one.log"; exit 1
fi
echo "calibrate --quick, 1 rank: $((SECONDS - start)) s"
"$info" "$work/one.toml" > "$work/one.info" 2>&1 || { echo "FAIL: one.toml"; cat "$work/one.info"; exit 1; }
check "one rank: no collectives in the file" bash -c "! grep -q '^link ' '$work/one.info'"
check "one rank: it says so" grep -q "^collectives: not measured: one rank (run under mpirun)" "$work/one.log"
check "one rank: the file says so" \
  grep -q "^# \[collectives.intra_host\] not measured: one rank" "$work/one.toml"
check "one rank: no compute_imbalance (nothing waits)" grep -q "^compute_imbalance 0$" "$work/one.info"
check "one rank: it says there is no imbalance" \
  grep -q "^compute imbalance: none: one rank waits for no other$" "$work/one.log"
check "one rank: devices_per_host 1" grep -q "^cluster one devices_per_host 1 " "$work/one.info"
check "one rank: measured with --threads 2" \
  grep -q "^# 1 rank on 1 host x 2 OpenMP threads\." "$work/one.toml"

# (c) bad command lines
"$cleave" calibrate --out "$work/no/such/dir/x.toml" > "$work/bad.log" 2>&1
check "a missing output folder is refused" \
  grep -q "cleave calibrate: --out $work/no/such/dir/x.toml: no folder" "$work/bad.log"
"$cleave" calibrate --fast > "$work/bad.log" 2>&1
check "an unknown option is refused" grep -q "cleave calibrate: unknown option --fast" "$work/bad.log"
"$cleave" calibrate --threads 0 > "$work/bad.log" 2>&1
check "--threads 0 is refused" grep -q -- "--threads = 0 is out of range" "$work/bad.log"

[ $fail -eq 0 ] && echo "calibrate writes a cluster file that reads back" || exit 1
