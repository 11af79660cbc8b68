#!/usr/bin/env bash
# `cleave plan --report` in a real browser (docs/planner.md, Report): Debian's headless Chromium
# loads the page of a 3-D layout (pp 2 x dp_shard 2 x tp 2 on two hosts of 4 ranks) planned on the
# H100 cluster with a search, and the test checks that the page logged nothing to the console (no
# script error), that each section holds its SVG (the ranked layouts' too), that the timeline is
# the cost model's (each action's time in ms, every schedule action drawn), that the script
# coloured every rank by its group (the pp axis first: ranks 0 and 4 alike, 0 and 1 not), and
# takes a screenshot. A copy of the page with a broken script must log an error: the console check
# can fail. Without a cluster the timeline is the schedule's on unit costs.
set -euo pipefail
cleave=$1 src=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
browser=$(command -v chromium || true)
[ -n "$browser" ] || { echo "FAIL: no chromium (setup.sh installs Debian's)"; exit 1; }

layout=(--world 8 --set data.dir="$data" --set parallel.pp=2 --set parallel.dp_shard=2
        --set parallel.tp=2 --set train.grad_accum_steps=4 --ranks-per-host 4)
"$cleave" plan "$src/tests/configs/tiny_train.toml" "${layout[@]}" \
  --cluster "$src/clusters/h100_sxm_ib.toml" --search --top 5 --report "$work/plan.html" > "$work/plan.log"
grep -q "^wrote $work/plan.html" "$work/plan.log" || { echo "FAIL: no report written"; cat "$work/plan.log"; exit 1; }
"$cleave" plan "$src/tests/configs/tiny_train.toml" "${layout[@]}" --report "$work/units.html" > /dev/null
grep -q "simulated on unit costs" "$work/units.html" || { echo "FAIL: no unit-cost timeline"; exit 1; }
[ "$(grep -o 'class="action"' "$work/units.html" | wc -l)" -eq 16 ] \
  || { echo "FAIL: the unit-cost timeline does not draw pp 2 x 4 micro-batches x F, B"; exit 1; }

load() {  # page: its DOM after the scripts ran into $work/dom, the browser's log into $work/log
  timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --user-data-dir="$work/profile" \
    --enable-logging=stderr --v=0 --window-size=1000,900 --screenshot="$work/shot.png" \
    "file://$1" > /dev/null 2> "$work/log"
  timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --user-data-dir="$work/profile" \
    --enable-logging=stderr --v=0 --dump-dom "file://$1" > "$work/dom" 2>> "$work/log"
}

sed 's/function paint(){/function paint(){undefinedCall();/' "$work/plan.html" > "$work/broken.html"
load "$work/broken.html"
grep -q "CONSOLE.*undefinedCall is not defined" "$work/log" \
  || { echo "FAIL: a script error in the page was not seen in the browser's log"; cat "$work/log"; exit 1; }

load "$work/plan.html"
if grep "CONSOLE" "$work/log"; then echo "FAIL: the report logged to the console"; exit 1; fi
[ -s "$work/shot.png" ] || { echo "FAIL: no screenshot"; exit 1; }
/usr/bin/python3 - "$work/dom" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
for section in ("mesh", "memory", "timeline", "axes", "search"):
    m = re.search(r'<section id="%s">(.*?)</section>' % section, dom, re.S)
    assert m and "<svg" in m.group(1) and "<rect" in m.group(1), f"section {section} has no drawing"
fills = {}
for g in re.finditer(r'<g class="rank"[^>]*><rect[^>]*fill="([^"]+)"[^>]*>.*?<text[^>]*>(\d+)</text>', dom):
    fills[int(g.group(2))] = g.group(1)
assert sorted(fills) == list(range(8)), f"ranks coloured: {sorted(fills)}"
assert fills[0] == fills[4] and fills[0] != fills[1], fills
assert len(re.findall(r'class="host"', dom)) == 2, "hosts not boxed"
timed = re.findall(r'class="action"[^>]*><title>(\d+[FB]\d+): ([0-9.]+) ms</title>', dom)
assert len(timed) == 16, f"expected 2 stages x 4 micro-batches x F, B timed in ms: {timed}"
assert "simulated on h100_sxm_ib" in dom, "the timeline does not name the cluster"
layouts = re.findall(r'class="layout"', dom)
assert len(layouts) == 5, f"expected the 5 best layouts ranked, found {len(layouts)}"
print("report: 5 sections drawn, 16 actions timed on the cluster, 5 ranked layouts, 8 ranks "
      "coloured by their pp group, 2 hosts, no console output")
PY
