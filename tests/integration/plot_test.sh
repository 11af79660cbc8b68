#!/usr/bin/env bash
# cleave plot draws each run's metrics.jsonl with matplotlib: two runs overlaid in an SVG (every
# panel holds a line per run with as many points as the run logged: training loss, tokens/s and
# MFU at each of 6 steps, validation loss at 2) and a PNG; a folder without metrics.jsonl, an
# unknown output type and a metrics file that is not JSON are refused, naming the file.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
common=(--set train.steps=6 --set train.log_interval=1 --set train.val_interval=3
        --set train.checkpoint_interval=0 --set train.threads=1)
run first 1
run second 1 --set optim.lr=1e-3
"$cleave" plot "$work/first" "$work/second" --out "$work/runs.svg" > "$work/plot.log"
grep -q "plotted 2 runs to $work/runs.svg" "$work/plot.log" || { echo "FAIL: $(cat "$work/plot.log")"; exit 1; }
/usr/bin/python3 - "$work/runs.svg" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()  # well-formed XML
ids = {e.get("id") for e in root.iter() if e.get("id")}
for run in ("first", "second"):
    for key, points in (("loss", 6), ("val_loss", 2), ("tokens_per_s", 6), ("mfu", 6)):
        assert f"{run}:{key}:{points}" in ids, f"no line of {run}'s {key} with {points} points"
text = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
for word in ("training loss", "validation loss", "tokens/s", "MFU", "first", "second", "step"):
    assert word in text, f"the SVG has no text '{word}'"
PY
"$cleave" plot "$work/first" --out "$work/one.png" > /dev/null
head -c 8 "$work/one.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: not a PNG"; exit 1; }

refused() {  # message args...: cleave plot fails with the message
  local want=$1; shift
  if out=$("$cleave" plot "$@" 2>&1); then echo "FAIL: plot $* succeeded"; exit 1; fi
  grep -qF -- "$want" <<<"$out" || { echo "FAIL: plot $*: $out"; exit 1; }
}
refused "$work/none has no metrics.jsonl" "$work/none"
refused "--out $work/x.jpg must end in .svg, .png or .pdf" "$work/first" --out "$work/x.jpg"
mkdir -p "$work/broken" && echo "{not json" > "$work/broken/metrics.jsonl"
refused "$work/broken/metrics.jsonl line 1 is not JSON" "$work/broken"
echo "plot: two runs in SVG and PNG; bad input refused"
