#!/usr/bin/env bash
# Installs the official OpenAI TypeScript/JavaScript client (npm "openai" 5.23.2, pinned; it runs
# on Debian 12's node 18) into NPM_DIR once and keeps it, for serve_openai_test.sh and
# bench/serve.sh.
#   install.sh NPM_DIR
# Exit 77: the npm registry cannot be reached (the callers skip); 1: node or npm is missing.
set -euo pipefail
npm_dir=$1
command -v node > /dev/null && command -v npm > /dev/null \
  || { echo "FAIL: node and npm are needed (setup.sh installs them)"; exit 1; }
version=5.23.2
mkdir -p "$(dirname "$npm_dir")"
exec 9> "$npm_dir.lock"
flock 9
[ "$(cat "$npm_dir/.installed" 2>/dev/null)" != "$version" ] || exit 0
if ! timeout 30 npm ping > /dev/null 2>&1; then
  echo "SKIP: the npm registry cannot be reached to install the openai client"; exit 77
fi
rm -rf "$npm_dir" && mkdir -p "$npm_dir"
echo '{"private": true}' > "$npm_dir/package.json"
(cd "$npm_dir" && npm i -E --ignore-scripts --no-audit --no-fund --loglevel=error "openai@$version")
echo "$version" > "$npm_dir/.installed"
