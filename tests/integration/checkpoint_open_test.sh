#!/usr/bin/env bash
# A checkpoint of many pieces opens quickly and reads right: a one-process checkpoint rewritten
# so that its parameters lie in 10,000 flat pieces (what as many ZeRO shards would write) loads
# and generates within 5 s (0.5-0.8 s here) the same tokens as the checkpoint it came from. The
# pieces' overlap check runs over a tensor's distinct boxes, not its pieces, and a piece finds its
# file by a map: neither grows with the square of the pieces.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set train.steps=2 --set train.checkpoint_interval=0 --set train.val_interval=0)
run one 1
ck=$work/one/step_00000002
mkdir -p "$work/many"
cp "$ck/meta.json" "$work/many/"
/usr/bin/python3 - "$ck" "$work/many" 10000 <<'PY'
import json, struct, sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
meta = json.load(open(f"{src}/meta.json"))
data = open(f"{src}/model-rank00000.safetensors", "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header, body = json.loads(data[8:8 + n]), data[8 + n:]
params = [k for k in meta["tensors"] if k.startswith("param/")]
sizes = {k: header[k]["data_offsets"][1] // 4 - header[k]["data_offsets"][0] // 4 for k in params}
total = sum(sizes.values())
out_header, chunks, at = {}, [], 0
for name in params:
    b0 = header[name]["data_offsets"][0]
    numel = sizes[name]
    k = max(1, count * numel // total)  # pieces of this tensor, about count in all
    bounds = [numel * i // k for i in range(k + 1)]
    pieces = []
    for i in range(k):
        if bounds[i] == bounds[i + 1]:
            continue
        key = f"{name}@{i}"
        raw = body[b0 + 4 * bounds[i]:b0 + 4 * bounds[i + 1]]
        out_header[key] = {"dtype": "F32", "shape": [bounds[i + 1] - bounds[i]],
                           "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
        pieces.append({"file": "many.safetensors", "key": key, "begin": bounds[i],
                       "end": bounds[i + 1], "box": meta["tensors"][name]["shape"],
                       "offset": [0] * len(meta["tensors"][name]["shape"])})
    meta["tensors"][name]["pieces"] = pieces
meta["tensors"] = {k: v for k, v in meta["tensors"].items() if k.startswith("param/")}
text = json.dumps(out_header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(f"{dst}/many.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
meta["version"] = 3  # one checksum per file: the one cleave names below
meta["files"] = {"many.safetensors": "0" * 16}
json.dump(meta, open(f"{dst}/meta.json", "w"))
print(sum(len(meta["tensors"][k]["pieces"]) for k in params), "pieces")
PY
# The checksum of the rewritten file, as cleave computes it (its mismatch message names it).
found=$("$cleave" generate "$work/many" --prompt "To be" 2>&1 | sed -n 's/.*found \([0-9a-f]*\).*/\1/p' || true)
sed -i "s/\"0000000000000000\"/\"$found\"/" "$work/many/meta.json"
start=$(date +%s%N)
many=$("$cleave" generate "$work/many" --prompt "To be" --max-new-tokens 8 --ids --tokenizer "$data/tokenizer.model")
ms=$(( ($(date +%s%N) - start) / 1000000 ))
whole=$("$cleave" generate "$ck" --prompt "To be" --max-new-tokens 8 --ids --tokenizer "$data/tokenizer.model")
[ "$many" = "$whole" ] || { echo "FAIL: 10,000 pieces generate '$many', the checkpoint '$whole'"; exit 1; }
echo "a checkpoint of 10,000 pieces opened and generated in $ms ms"
[ "$ms" -lt 5000 ] || { echo "FAIL: it took $ms ms"; exit 1; }
