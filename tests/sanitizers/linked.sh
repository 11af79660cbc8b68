#!/usr/bin/env bash
# The build's -fsanitize list took effect: each binary loads the runtime of every sanitizer in it
# (GCC links them dynamically).
# Usage: linked.sh SANITIZERS BINARY...   (SANITIZERS as CLEAVE_SANITIZE: address,undefined)
set -euo pipefail
list=$1; shift
for bin in "$@"; do
  for s in ${list//,/ }; do
    case $s in
      address) lib=asan ;; undefined) lib=ubsan ;; thread) lib=tsan ;; leak) lib=lsan ;;
      *) echo "-fsanitize=$s: no runtime library to look for"; continue ;;
    esac
    if ! ldd "$bin" | grep -q "lib$lib\.so"; then
      echo "FAIL $bin is not linked with lib$lib (-fsanitize=$s)"
      exit 1
    fi
    echo "ok   $bin links lib$lib"
  done
done
