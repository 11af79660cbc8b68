#!/usr/bin/env bash
# Installs cleave's dependencies from Debian packages (only those missing), builds it (Release,
# -O3 -march=native) into build/, and writes the default corpus data/fortunes.txt from Debian's
# fortunes package.
set -euo pipefail
cd "$(dirname "$0")"

# ocl-icd-opencl-dev: oneDNN's dnnl-config.cmake requires OpenCL, but libdnnl-dev only recommends
# it (and recommends are not installed). iproute2 and procps: the multi-host test's ip and pkill.
# slurmctld, slurmd, slurm-client and munge: slurm_test's private cluster on the simulated hosts.
# python3-matplotlib: cleave plot.
# strace: the checkpoint tests hold a save in fsync with its syscall delay injection.
# clang and libclang-rt-dev: the fuzz targets (tests/fuzz), which need clang's libFuzzer; clang only
# recommends the runtime that holds it.
# chromium: plan_report_test loads cleave plan's HTML report in the headless browser.
# libcpp-httplib-dev: cleave serve's HTTP server.
# libonig-dev: tokenizer.json patterns; nodejs and npm: the tokenizer test's transformers.js (npm
# only where no node of another origin brings its own, which would conflict with Debian's).
packages=(build-essential cmake pkg-config libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev
          openmpi-bin libtomlplusplus-dev nlohmann-json3-dev libsentencepiece-dev libgtest-dev
          libxxhash-dev python3 python3-numpy python3-matplotlib python3-torch fortunes iproute2 procps
          strace clang libclang-rt-dev libonig-dev libcpp-httplib-dev nodejs chromium)
packages+=(slurmctld slurmd slurm-client munge)
command -v npm > /dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

# The default corpus: every fortune, one document per fortune (fortune files separate them by
# lines holding only "%"; cleave's tokenizer separates documents by blank lines).
mkdir -p data
if [ ! -s data/fortunes.txt ]; then
  for f in /usr/share/games/fortunes/*; do
    case "$f" in *.dat|*.u8) continue ;; esac
    [ -f "$f" ] && sed 's/^%$//' "$f"
  done > data/fortunes.txt
fi
echo "setup: built build/cleave; default corpus data/fortunes.txt ($(wc -c < data/fortunes.txt) bytes)"
