#!/usr/bin/env bash
# The official OpenAI client (npm "openai", pinned: openai_client/install.sh) against cleave serve,
# unchanged: openai_client/client.mjs. Skips (77) only where the npm registry cannot be reached.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
pid=""
trap '[ -z "$pid" ] || kill -9 "$pid" 2> /dev/null || true; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
npm_dir=$(cd "$(dirname "$cleave")" && pwd)/openai_client
rc=0
bash "$src/tests/integration/openai_client/install.sh" "$npm_dir" || rc=$?
[ $rc = 0 ] || exit $rc
"$cleave" train "$src/tests/configs/tiny_train.toml" --set data.dir="$data" \
  --set train.out_dir="$work/run" --set train.steps=20 --set train.val_interval=0 \
  --set train.checkpoint_interval=20 --set train.threads=1 --set model.family=llama \
  --set model.max_seq_len=256 > /dev/null
pids=()
# shellcheck source=tests/integration/serve_start.sh
source "$src/tests/integration/serve_start.sh"
start "$work/serve.log" "$cleave" serve "$work/run" --port 0 --api-key sekrit --model-name tiny \
  --threads 1 --set serve.kv_cache_mb=1
node "$src/tests/integration/openai_client/client.mjs" "$npm_dir" "$base" sekrit tiny
kill -TERM "$pid"
wait "$pid"
pid=""
