#!/usr/bin/env bash
# Each rank reads only its share of a checkpoint: 4-way ZeRO-3 and tp 2 x pp 2 each save at step
# 2 and resume from it; every rank's bytes read, as cleave counts them and as the kernel does
# (read system calls: /proc/self/io's rchar, which sees the reader's pread calls whatever the
# file system), stay within the state it keeps plus the metadata (meta.json and every file's
# header). Resuming from a format-3 copy of the same checkpoint, whose whole-file checksums make
# every rank read every file, must exceed that bound: the check can fail. `cleave checkpoint
# verify` passes the checkpoint and names the bytes of one with a flipped bit; `info` lists its
# pieces with their checksums.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set train.steps=4 --set train.checkpoint_interval=2 --set train.val_interval=0
        --set train.log_interval=1 --set train.threads=1)

# check NAME: the resume line's per-rank figures against the bound.
check() {
  /usr/bin/python3 - "$work/$1.log" "$work/$1/step_00000002" <<'PY'
import json, os, re, struct, sys
log, ck = open(sys.argv[1]).read(), sys.argv[2]
m = re.search(r"resume read per rank \(MiB, of ([0-9.]+) in \S+\): ([0-9. ]+); kernel-counted "
              r"([0-9. -]+); state kept ([0-9. ]+)", log)
assert m, "no resume line in " + sys.argv[1]
counted, kernel, kept = ([float(x) * 2**20 for x in g.split()] for g in m.groups()[1:])
meta = os.path.getsize(f"{ck}/meta.json")
headers = 0
for f in os.listdir(ck):
    if f.endswith(".safetensors"):
        with open(f"{ck}/{f}", "rb") as fh:
            headers += 8 + struct.unpack("<Q", fh.read(8))[0]
rounding = 0.0005 * 2**20 * 3  # the figures are printed to 0.001 MiB
for r, (c, k, s) in enumerate(zip(counted, kernel, kept)):
    bound = s + meta + headers + rounding
    print(f"rank {r}: read {c:.0f} bytes (kernel {k:.0f}), keeps {s:.0f}, bound {bound:.0f}")
    assert k <= bound + 64 * 1024, f"rank {r} read {k:.0f} bytes, over its share's bound {bound:.0f}"
    assert c <= bound, f"rank {r} counted {c:.0f} bytes, over its share's bound {bound:.0f}"
    assert abs(k - c) <= 64 * 1024, f"rank {r}: cleave counted {c:.0f} bytes, the kernel {k:.0f}"
PY
}

run zero3 4 --set parallel.dp_shard=4 --set parallel.zero_stage=3 --exit-after 2
run zero3 4 --set parallel.dp_shard=4 --set parallel.zero_stage=3 --resume "$work/zero3/step_00000002"
check zero3
run tp_pp 4 --set parallel.tp=2 --set parallel.pp=2 --exit-after 2
run tp_pp 4 --set parallel.tp=2 --set parallel.pp=2 --resume "$work/tp_pp/step_00000002"
check tp_pp

# The same checkpoint as format 3 (one checksum per file): every rank reads every file whole,
# and the bound above no longer holds.
ck=$work/zero3/step_00000002
mkdir -p "$work/old/step_00000002"
cp "$ck"/*.safetensors "$work/old/step_00000002/"
/usr/bin/python3 - "$ck/meta.json" "$work/old/step_00000002" "$src/tests/integration" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[3])
from old_format import whole_file_checksums
meta = whole_file_checksums(json.load(open(sys.argv[1])), sys.argv[2])
json.dump(meta, open(sys.argv[2] + "/meta.json", "w"))
PY
run old 4 --set parallel.dp_shard=4 --set parallel.zero_stage=3 --resume "$work/old/step_00000002"
if check old > "$work/old.check" 2>&1; then
  echo "FAIL: resuming a format-3 checkpoint stayed within the per-rank bound"; exit 1
fi
$compare "$work/zero3" "$work/old" --from-step 3

# verify and info.
grep -q "every checksum matches" <<<"$("$cleave" checkpoint verify "$ck")" || { echo "FAIL: verify"; exit 1; }
info=$("$cleave" checkpoint info "$ck")
grep -q "dp_shard = 4" <<<"$info" || { echo "FAIL: info shows no layout"; echo "$info"; exit 1; }
grep -q "param/blocks.0.attn.qkv.weight F32 \[192,64\], [0-9]* pieces" <<<"$info" \
  || { echo "FAIL: info lists no pieces"; echo "$info" | head -30; exit 1; }
grep -q "xxh64 [0-9a-f]\{16\}" <<<"$info" || { echo "FAIL: info shows no checksums"; exit 1; }
f=$ck/model-rank00002.safetensors
/usr/bin/python3 - "$f" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[-100] ^= 1
open(sys.argv[1], "wb").write(b)
PY
if out=$("$cleave" checkpoint verify "$ck" 2>&1); then echo "FAIL: verify passed a flipped bit"; exit 1; fi
echo "$out" | grep -q "checksum mismatch in $f: tensor '.*' bytes \[" \
  || { echo "FAIL: verify's message: $out"; exit 1; }
echo "per-rank reads within their shares; format 3 read everything; verify and info work"
