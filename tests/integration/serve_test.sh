#!/usr/bin/env bash
# cleave serve (docs/serving.md) on 127.0.0.1 with a free port and an API key, driven by real HTTP
# clients (tests/integration/serve_client.py: urllib and raw sockets): completions whole and
# streamed, chat, log-probabilities against the trainer's forward (tests/tools/score_tokens), every
# bad input with its status and field, a disconnect mid-stream, batch invariance (alone and among
# 16 others), a shared 1,000-token prefix, a full cache queueing requests, a bounded load test (32
# clients, 300 requests, a fifth of them bad; RSS back within 5%), signals kept off every thread
# but cleave-signals (signals_routed.sh), SIGTERM draining; then the same API checks, batch
# invariance, prefix and full cache at tp 2 under mpirun, both ranks' signals routed, and its
# drain; a mixture of experts at ep 2, its answers equal to one process's, and its full cache.
# The official OpenAI client is serve_openai_test.sh's.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1
client="/usr/bin/python3 $src/tests/integration/serve_client.py"
score=$(dirname "$cleave")/tests/score_tokens
key=sekrit

"$cleave" train "$src/tests/configs/tiny_train.toml" --set data.dir="$data" \
  --set train.out_dir="$work/run" --set train.steps=20 --set train.val_interval=0 \
  --set train.checkpoint_interval=20 --set train.threads=1 --set model.family=llama \
  --set model.n_kv_heads=2 --set model.max_seq_len=1100 > /dev/null
ckpt=$work/run/step_00000020

# shellcheck source=tests/integration/serve_start.sh
source "$src/tests/integration/serve_start.sh"
# shellcheck source=tests/integration/signals_routed.sh
source "$src/tests/integration/signals_routed.sh"
# A SIGTERM to mpirun reaches every rank and drains the server the same way, but OpenMPI's mpirun
# then exits 1, as for any signalled job: the tests signal the serving process.
stop() {  # LOG [signalled]: SIGTERM (unless sent already), then the server must exit 0, drained
  [ "${2:-}" = signalled ] || kill -TERM "$server"
  local rc=0
  wait "$pid" || rc=$?
  [ $rc = 0 ] || { echo "FAIL: the server exited $rc after SIGTERM:"; cat "$1"; exit 1; }
  grep -q "# serve: drained, exiting" "$1" || { echo "FAIL: no drain:"; cat "$1"; exit 1; }
}

# Bad settings are refused at start-up, naming the key.
refused() {  # MESSAGE ARGS...: cleave serve with ARGS exits 1 saying MESSAGE
  local msg=$1 out rc=0
  shift
  out=$("$cleave" serve "$ckpt" --port 0 "$@" 2>&1) || rc=$?
  [ $rc = 1 ] && grep -qF -- "$msg" <<< "$out" || { echo "FAIL: $* (exit $rc): $out"; exit 1; }
}
refused "serve.kv_cache_mb expects a number, got 'lots'" --set serve.kv_cache_mb=lots
refused "serve.kv_cache_mb = 0 is out of range [0.001, 1e+09]" --set serve.kv_cache_mb=0
refused "--set parallel.sp=2: the server takes parallel.tp, parallel.pp, parallel.ep, parallel.comm_timeout_s and serve." --set parallel.sp=2
refused "parallel.ep = 2 makes 2 ranks, but 1 were started" --set parallel.ep=2
refused "holds fewer than 2 blocks of 64 tokens" --set serve.kv_cache_mb=0.01
refused "parallel.comm_timeout_s = 0 is out of range [0.1, 1e+07]" --set parallel.comm_timeout_s=0
refused "serve.max_step_ratio=0.5: a step cannot take less than its decodes alone" --set serve.max_step_ratio=0.5
refused "serve.kv_cache_dtype must be auto, fp32 or bf16, not 'fp16'" --set serve.kv_cache_dtype=fp16

# One process: a pool of 32 blocks (1 MiB of 32 KiB blocks: 2 layers x 2 kv heads x 16 dims x
# K and V x 64 tokens x 4 bytes), one of which pads the steps' rows.
start "$work/serve.log" "$cleave" serve "$ckpt" --port 0 --api-key "$key" --model-name tiny \
  --threads 1 --set serve.kv_cache_mb=1 --set serve.step_tokens=256
grep -q "requests must carry 'Authorization: Bearer" "$work/serve.log" || { cat "$work/serve.log"; exit 1; }
grep -q "# serve: key/value cache 32 blocks of 64 tokens, fp32 (serve.kv_cache_dtype=auto; 1 MiB a rank" \
  "$work/serve.log" || { cat "$work/serve.log"; exit 1; }
# Row counts 1-32, then 48 to 256 by 16: every count a step of serve.step_tokens=256 can have.
grep -q "# serve: the forward warmed up at 46 row counts" "$work/serve.log" || { cat "$work/serve.log"; exit 1; }
# serve.max_step_ratio (2) holds the prompt rows beside decodes by the warm-up's timings.
grep -q "# serve: a step with prompt rows takes at most 2x the forward of one in which every request decodes" "$work/serve.log" \
  || { cat "$work/serve.log"; exit 1; }
$client api "$base" "$key" tiny "$score" "$ckpt"
$client invariance "$base" "$key" tiny
$client prefix "$base" "$key" tiny
$client queue "$base" "$key" tiny
$client load "$base" "$key" tiny "$server"
signals_routed "$server"
$client drain "$base" "$key" tiny "$server"
stop "$work/serve.log" signalled

# Without a key the server says at start-up that it is open. bf16 weights take a bf16 cache: the
# same 32 blocks in half the memory, its answers batch invariant.
start "$work/open.log" "$cleave" serve "$ckpt" --port 0 --model-name tiny --threads 1 \
  --set serve.max_step_ratio=0 --dtype bf16 --set serve.kv_cache_mb=0.5
grep -q "# serve: OPEN: no API key" "$work/open.log" || { echo "FAIL: not said open:"; cat "$work/open.log"; exit 1; }
grep -q "# serve: prompt rows fill every step to serve.step_tokens (serve.max_step_ratio=0)" "$work/open.log" \
  || { echo "FAIL: the ratio's off not said:"; cat "$work/open.log"; exit 1; }
grep -q "# serve: key/value cache 32 blocks of 64 tokens, bf16 (serve.kv_cache_dtype=auto; 0.5 MiB a rank" \
  "$work/open.log" || { echo "FAIL: no bf16 cache:"; cat "$work/open.log"; exit 1; }
$client invariance "$base" "" tiny
stop "$work/open.log"

# tp 2 under mpirun: rank 0 serves, each step's batch goes to both ranks (each holds half the kv
# heads), here with fp32 weights over a bf16 cache on both ranks (0.25 MiB a rank: the same 32
# blocks).
start "$work/tp2.log" mpirun --oversubscribe -np 2 "$cleave" serve "$ckpt" --port 0 \
  --api-key "$key" --model-name tiny --threads 1 --set parallel.tp=2 --set serve.kv_cache_mb=0.25 \
  --set serve.kv_cache_dtype=bf16
grep -q "# serve: key/value cache 32 blocks of 64 tokens, bf16 (serve.kv_cache_dtype=bf16; 0.25 MiB a rank" \
  "$work/tp2.log" || { echo "FAIL: no bf16 cache at tp 2:"; cat "$work/tp2.log"; exit 1; }
$client api "$base" "$key" tiny - "$ckpt"
$client invariance "$base" "$key" tiny
$client prefix "$base" "$key" tiny
$client queue "$base" "$key" tiny
mapfile -t ranks < <(pgrep -P "$pid")
[ ${#ranks[@]} = 2 ] || { echo "FAIL: mpirun has ${#ranks[@]} children, not 2 ranks"; exit 1; }
signals_routed "${ranks[@]}"
stop "$work/tp2.log"

# A rank stopped mid-service: rank 0's broadcast of a step's batches cannot complete, and after
# parallel.comm_timeout_s the comm layer ends the job with its report naming that broadcast on
# the world group, not a server that hangs
# for good. The batches must be too large for the transport to hold for the stopped rank: a
# 1,000-token prompt in one step, over a shared-memory transport told to send at most 2 KB ahead.
OMPI_MCA_btl_vader_rndv_eager_limit=2048 OMPI_MCA_btl_vader_max_send_size=2048 \
  start "$work/stuck.log" mpirun --oversubscribe -np 2 "$cleave" serve "$ckpt" --port 0 \
  --api-key "$key" --model-name tiny --threads 1 --set parallel.tp=2 --set serve.kv_cache_mb=0.5 \
  --set serve.step_tokens=1024 --set parallel.comm_timeout_s=5
grep -q "step transfers time out after 5 s" "$work/stuck.log" || { cat "$work/stuck.log"; exit 1; }
other=$(pgrep -P "$pid" -x cleave | grep -vx "$server" || true)
[ -n "$other" ] || { echo "FAIL: no second rank under mpirun $pid"; exit 1; }
kill -STOP "$other"
# The request, by Python's urllib (curl is not among setup.sh's packages: a fresh machine has none,
# and a request never sent would leave the job waiting with nothing to time out).
/usr/bin/python3 - "$base" "$key" > "$work/stuck-client.log" 2>&1 <<'PY' &
import json, sys, urllib.request
base, key = sys.argv[1], sys.argv[2]
body = json.dumps({"model": "tiny", "prompt": [7] * 1000, "max_tokens": 2}).encode()
request = urllib.request.Request(base + "/v1/completions", body, {
    "Authorization": "Bearer " + key, "Content-Type": "application/json"})
print("sending", flush=True)
urllib.request.urlopen(request, timeout=30).read()
PY
for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
kill -0 "$pid" 2> /dev/null && { kill -KILL "$other" "$pid"; echo "FAIL: the job still runs 30 s after a rank stopped"; cat "$work/stuck.log" "$work/stuck-client.log"; exit 1; }
wait "$pid" && { echo "FAIL: the job exited 0 after a rank stopped"; exit 1; }
# Rank 0 is held either at the step's head (raw MPI, its own report) or at the batches' broadcast
# (the comm layer's), as far as the stopped rank's queue lets the head through.
grep -qE "^cleave (comm: TIMEOUT on rank 0: broadcast #[0-9]+ on group \"world\" \([0-9.]+ [KM]iB, mpi\)|serve: TIMEOUT on rank 0: the broadcast of a step's head) has not completed after" \
  "$work/stuck.log" || { echo "FAIL: no timeout report naming the step's broadcast:"; cat "$work/stuck.log"; exit 1; }
echo "serve_test: a stopped rank ends the job after parallel.comm_timeout_s, the transfer named"

# A mixture of experts at ep 2: each rank is a lane serving requests of its own over its own
# pool, its experts reached by all-to-all; the answers equal one process's, and a full cache
# queues and preempts within each lane.
"$cleave" train "$src/tests/configs/tiny_train.toml" --set data.dir="$data" \
  --set train.out_dir="$work/moe" --set train.steps=10 --set train.val_interval=0 \
  --set train.checkpoint_interval=10 --set train.threads=1 --set model.family=llama \
  --set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64 \
  --set model.max_seq_len=400 > /dev/null
moe=$work/moe/step_00000010
start "$work/moe1.log" "$cleave" serve "$moe" --port 0 --api-key "$key" --model-name tiny --threads 1
$client answers "$base" "$key" tiny "$work/answers.json" 1
stop "$work/moe1.log"
start "$work/ep2.log" mpirun --oversubscribe -np 2 "$cleave" serve "$moe" --port 0 \
  --api-key "$key" --model-name tiny --threads 1 --set parallel.ep=2 --set serve.kv_cache_mb=1
grep -q "ep 2 (each ep rank serves requests of its own)" "$work/ep2.log" || { cat "$work/ep2.log"; exit 1; }
$client answers "$base" "$key" tiny "$work/answers.json" 2
# The comparison can fail: one log-probability one float step away is a difference.
/usr/bin/python3 -c 'import json, math, sys
a = json.load(open(sys.argv[1])); a[5][1][3] = math.nextafter(a[5][1][3], 0.0)
json.dump(a, open(sys.argv[2], "w"))' "$work/answers.json" "$work/answers-off.json"
if out=$($client answers "$base" "$key" tiny "$work/answers-off.json" 2); then
  echo "FAIL: answers one float step off were taken as equal: $out"; exit 1
fi
grep -q "request 5 differs from the other layout's" <<<"$out" || { echo "FAIL: $out"; exit 1; }
$client queue "$base" "$key" tiny
stop "$work/ep2.log"
# And composed, tp 2 x ep 2: the lanes' logits reach rank 0 from tp rank 0 of each (tp's sums
# round differently from one process's).
start "$work/tp2ep2.log" mpirun --oversubscribe -np 4 "$cleave" serve "$moe" --port 0 \
  --api-key "$key" --model-name tiny --threads 1 --set parallel.tp=2 --set parallel.ep=2
$client answers "$base" "$key" tiny "$work/answers.json" 2 1e-4
stop "$work/tp2ep2.log"
echo "serve_test: one process, tp 2 and ep 2: ok"
