#!/usr/bin/env bash
# Installs node-llama-cpp 3.21.1 (llama.cpp's prebuilt CPU build) into NPM_DIR once and keeps it,
# for gguf_llamacpp_test.sh and bench/inference.sh: pinned, its CPU binary package only, no
# install scripts, and told never to build or download llama.cpp.
#   install.sh NPM_DIR
# Exit 77: the npm registry cannot be reached (the callers skip); 1: node or npm is missing, or the
# machine has no prebuilt build. Callers running llama.cpp export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true
# and NODE_LLAMA_CPP_GPU=false as this does.
set -euo pipefail
npm_dir=$1
command -v node > /dev/null && command -v npm > /dev/null \
  || { echo "FAIL: node and npm are needed (setup.sh installs them)"; exit 1; }
version=3.21.1
case $(uname -m) in
  x86_64) platform=linux-x64 ;;
  aarch64) platform=linux-arm64 ;;
  *) echo "FAIL: node-llama-cpp ships no prebuilt CPU build for $(uname -m)"; exit 1 ;;
esac
export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true NODE_LLAMA_CPP_GPU=false
# The test and the benchmark's smoke run may both get here at once under ctest -j2: one installs,
# the other waits for it (the folder is removed and rewritten while installing).
mkdir -p "$(dirname "$npm_dir")"
exec 9> "$npm_dir.lock"
flock 9
[ "$(cat "$npm_dir/.installed" 2>/dev/null)" != "$version $platform" ] || exit 0
if ! timeout 30 npm ping > /dev/null 2>&1; then
  echo "SKIP: the npm registry cannot be reached to install node-llama-cpp"; exit 77
fi
rm -rf "$npm_dir" && mkdir -p "$npm_dir"
echo '{"private": true}' > "$npm_dir/package.json"
# Optional dependencies left out: they are the CUDA and Vulkan builds (650 MB); the CPU build is
# named instead.
(cd "$npm_dir" && npm i -E --omit=optional --ignore-scripts --no-audit --no-fund \
   --loglevel=error "node-llama-cpp@$version" "@node-llama-cpp/$platform@$version")
echo "$version $platform" > "$npm_dir/.installed"
