"""The tables of bench/pp.sh, from its kept run folders, and the timeline picture of one traced step.

  pp_report.py table DIR PPS SCHEDULES REPEATS M   (PPS and SCHEDULES comma-separated)
  pp_report.py svg TRACE.json OUT.svg TITLE

A run folder DIR/pp<p>-<schedule>-r<round> holds cleave's metrics.jsonl and one trace_step_N.json
(train.trace_step); DIR/pp<p>-m2 is the two-micro-batch baseline of the memory table. What each
column means, and the formulas, are in bench/pp.sh's header.
"""
import glob
import json
import re
import statistics
import sys
from collections import defaultdict

VIRTUAL = {"gpipe": 1, "1f1b": 1, "zb1p": 1, "interleaved": 2, "zbv": 2}


def steps(run):
    """metrics.jsonl's step records after the first step."""
    with open(f"{run}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f if '"tokens_per_s"' in line]
    return rows[1:]


# A schedule action's span, "<stage><F|B|I|W|R><micro-batch>" (R: the recompute of activation
# checkpointing, before its backward); every other span is one of the step-end instructions
# (finish_grads, sum_loss, grad_norm, clip, "update G", "gather_params G").
ACTION = re.compile(r"(\d+)([FBIWR])(\d+)")


def events_of(path):
    """The compute spans of a trace: rank -> [(name, start_ms, duration_ms)], in time order (a
    rank's collectives, on their own track, are not its schedule's actions)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ranks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") != "comm":
            ranks[e["tid"]].append((e["name"], e["ts"] / 1e3, e["dur"] / 1e3))
    return {r: sorted(ranks[r], key=lambda a: a[1]) for r in sorted(ranks)}


def coalesce(spans):
    """One action per schedule action. Under activation checkpointing a backward runs unit by
    unit, each unit's recompute before it, so its spans alternate R, I, R, I, ...: the R spans
    before the first I (or B) stay a recompute action of their own (it needs no gradient, and runs
    while the rank waits for one); the rest is one I (or B) action, its duration their sum."""
    out = []
    for s, t, k, start, d in spans:
        if out and out[-1][0] == s and out[-1][2] == k and (
                t == out[-1][1] or (out[-1][1] in "IB" and t == "R")):
            out[-1] = out[-1][:4] + (out[-1][4] + d,)
        else:
            out.append((s, t, k, start, d))
    return out


def trace(run):
    """The traced step: every rank's schedule actions in time order, [(stage, type, mb, start_ms,
    duration_ms)] (coalesced), every rank's step-end spans, [(name, start_ms, duration_ms)], and
    the latest end of an action's span. Times are since that rank's own start of the step
    program."""
    actions, ends, makespan = [], [], 0.0
    for spans in events_of(glob.glob(f"{run}/trace_step_*.json")[0]).values():
        mine, end = [], []
        for name, t, d in spans:
            a = ACTION.fullmatch(name)
            if a:
                s, kind, k = a.groups()
                mine.append((int(s), kind, int(k), t, d))
                makespan = max(makespan, t + d)
            else:
                end.append((name, t, d))
        actions.append(coalesce(mine))
        ends.append(end)
    return actions, ends, makespan


def idle_of(busy, makespan):
    idle = [1 - b / makespan for b in busy]
    return statistics.mean(idle), max(idle)


def simulate(ranks, cost):
    """The ranks' action orders replayed with cost(action) per action and free, instant transfers
    (the checker's timed simulation, docs/pipeline_parallel.md): an action starts at the later of
    its rank's clock and the end of the action it waits for. Returns (makespan, busy per rank)."""
    stages = 1 + max(a[0] for r in ranks for a in r)
    end, pc, clock, busy = {}, [0] * len(ranks), [0.0] * len(ranks), [0.0] * len(ranks)
    moved = True
    while moved:
        moved = False
        for r, acts in enumerate(ranks):
            while pc[r] < len(acts):
                s, t, k = acts[pc[r]][:3]
                if t == "F" and s > 0:
                    deps = [(s - 1, "F", k)]
                elif t in "BI" and s < stages - 1:
                    deps = [(s + 1, "B", k), (s + 1, "I", k)]
                else:
                    deps = []
                ready = [end[d] for d in deps if d in end]
                if deps and not ready:
                    break
                d = cost(acts[pc[r]])
                clock[r] = end[(s, t, k)] = max([clock[r]] + ready) + d
                busy[r] += d
                pc[r] += 1
                moved = True
    assert all(pc[r] == len(a) for r, a in enumerate(ranks)), "the traced order deadlocks"
    return max(clock), busy


def closed_form(schedule, p, m, F, B, W):
    """Bubble time per rank and its share of the step, F, B = I + W and W of one micro-batch
    through a rank's layers."""
    if schedule in ("gpipe", "1f1b"):
        bubble = (p - 1) * (F + B)
    elif schedule == "interleaved":
        bubble = (p - 1) * (F + B) / VIRTUAL[schedule]
    elif schedule == "zb1p":
        bubble = (p - 1) * (F + B - 2 * W)
    else:  # zbv: ZB1P's bubble of one V stage (chunk), half a rank's costs (bench/pp.sh's header)
        bubble = (p - 1) * (F + B - 2 * W) / 2
    return bubble, bubble / (bubble + m * (F + B))


def analyse(run, schedule, p, m):
    rows = steps(run)
    out = {
        "tok": statistics.median(r["tokens_per_s"] for r in rows),
        "idle_mean": statistics.median(statistics.mean(r["idle_fraction_per_rank"]) for r in rows),
        "idle_max": statistics.median(max(r["idle_fraction_per_rank"]) for r in rows),
        "rss0": rows[-1]["peak_rss_mib_per_rank"][0],
        "rss_max": rows[-1]["peak_rss_mib"],
    }
    # The pipeline's makespan: the bubble figures, traced and predicted alike, are of the
    # schedule's actions; the step-end spans that follow them are counted apart.
    ranks, ends, makespan = trace(run)
    step = max([makespan] + [t + d for r in ends for _, t, d in r])
    out["end"] = max(sum(d for _, _, d in r) for r in ends)
    out["end_share"] = out["end"] / step
    out["trace_mean"], out["trace_max"] = idle_of([sum(a[4] for a in r) for r in ranks], makespan)
    spans = defaultdict(list)
    for r in ranks:
        for s, t, k, _, d in r:
            spans[(s, t)].append(d)
    # The mean, not the median: each rank's simulated busy time is then its measured one, and
    # the simulation differs from the trace only in when the actions start.
    cost = {key: statistics.mean(v) for key, v in spans.items()}
    sim_makespan, sim_busy = simulate(ranks, lambda a: cost[a[:2]])
    out["sim_mean"], out["sim_max"] = idle_of(sim_busy, sim_makespan)
    # Every action with its own measured duration: what is left of the makespan is what the
    # engine lost to transfers and waking up, beyond the dependencies.
    out["lag"] = makespan - simulate(ranks, lambda a: a[4])[0]
    out["makespan"] = makespan
    # Each stage's F, its backward (a micro-batch's B span, or its I and W spans added, and its
    # R span under activation checkpointing) and W,
    # medians over micro-batches; a rank's are the sums over its stages.
    per_rank = []
    for r in ranks:
        F = B = W = 0.0
        for stage in sorted({a[0] for a in r}):
            mine = [a for a in r if a[0] == stage]
            back = defaultdict(float)
            for s, t, k, _, d in mine:
                if t != "F":
                    back[k] += d
            F += statistics.median(a[4] for a in mine if a[1] == "F")
            B += statistics.median(back.values())
            w = [a[4] for a in mine if a[1] == "W"]
            W += statistics.median(w) if w else 0.0
        per_rank.append((F, B, W))
    F, B, W = max(per_rank, key=lambda c: c[0] + c[1])  # the slowest rank's
    out["F"], out["B"], out["W"] = F, B, W
    # The slowest rank sets the makespan, m (F + B) + bubble; each rank idles for the rest of it.
    bubble = closed_form(schedule, p, m, F, B, W)[0]
    out["theory_mean"], out["theory_max"] = idle_of([m * (c[0] + c[1]) for c in per_rank],
                                                    m * (F + B) + bubble)
    out["theory_even"] = closed_form(schedule, p, m, F, B, W)[1]
    out["imbalance"] = max(c[0] + c[1] for c in per_rank) / min(c[0] + c[1] for c in per_rank)
    out["x_theory"] = out["trace_mean"] / out["theory_mean"]
    out["x_sim"] = out["trace_mean"] / out["sim_mean"]
    out["d_sim"] = out["trace_mean"] - out["sim_mean"]
    return out


def table(folder, pps, schedules, repeats, m):
    med = lambda xs: statistics.median(xs)
    results = {}
    for p in pps:
        for s in schedules:
            runs = [analyse(f"{folder}/pp{p}-{s}-r{i}", s, p, m) for i in range(1, repeats + 1)]
            results[p, s] = {k: med([r[k] for r in runs]) for k in runs[0]}
            results[p, s]["rounds"] = [r["tok"] for r in runs]
    print(f"tokens/s and bubble, m = {m} micro-batches; medians over {repeats} round(s) "
          "(tokens/s and idle: of steps 2..N; trace and theory: of the traced step; ratios: of each round's)")
    head = ("pp", "schedule", "tok/s", "vs 1f1b", "idle mean/max", "trace mean/max", "F/B/W ms",
            "even", "theory mean", "x theory", "sim mean", "x sim", "-sim", "lag ms", "imbal",
            "step end ms")
    print("%-3s %-15s %6s %7s %14s %15s %14s %6s %12s %8s %8s %6s %5s %6s %6s %13s" % head)
    for p in pps:
        for s in schedules:
            r = results[p, s]
            pct = lambda a, b: "%.1f/%.1f%%" % (100 * a, 100 * b)
            print("%-3d %-15s %6.0f %6.2fx %14s %15s %14s %5.1f%% %11.1f%% %7.2fx %7.1f%% %5.2fx %+5.1f %6.0f %5.2fx %13s" % (
                p, s + (" v=2" if VIRTUAL[s] == 2 else ""), r["tok"], r["tok"] / results[p, "1f1b"]["tok"],
                pct(r["idle_mean"], r["idle_max"]), pct(r["trace_mean"], r["trace_max"]),
                "%.0f/%.0f/%s" % (r["F"], r["B"], "%.0f" % r["W"] if r["W"] else "-"),
                100 * r["theory_even"], 100 * r["theory_mean"], r["x_theory"], 100 * r["sim_mean"],
                r["x_sim"], 100 * r["d_sim"], r["lag"], r["imbalance"],
                "%.0f (%.1f%%)" % (r["end"], 100 * r["end_share"])))
    print("rounds, tokens/s: " + "; ".join(
        f"pp{p} {s} " + " / ".join("%.0f" % t for t in results[p, s]["rounds"])
        for p in pps for s in schedules))
    for p in pps:
        for z in ("zb1p", "zbv"):
            if z in schedules and "1f1b" in schedules:
                faster = results[p, z]["tok"] > results[p, "1f1b"]["tok"]
                print(f"pp {p}: {z} {'beats' if faster else 'does NOT beat'} 1f1b in tokens/s "
                      f"({results[p, z]['tok']:.0f} against {results[p, '1f1b']['tok']:.0f})")
    if "gpipe" not in schedules or "1f1b" not in schedules:
        return
    print()
    print("peak RSS of rank 0 (stage 0), MiB; baseline: gpipe with m = 2 (two activation slots)")
    print("%-3s %6s %6s %6s %12s %14s %14s %16s %7s" % (
        "pp", "m = 2", "gpipe", "1f1b", "gpipe - m2", "per slot", "1f1b - m2", "predicted 1f1b", "formula"))
    for p in pps:
        base = steps(f"{folder}/pp{p}-m2")[-1]["peak_rss_mib_per_rank"][0]
        g, o = results[p, "gpipe"]["rss0"], results[p, "1f1b"]["rss0"]
        slot = (g - base) / (m - 2)
        # One micro-batch's activations on stage 0: layers x 4 s (16 h + a + 4) bytes.
        layers, s, h, a = 8 // p, 256, 512, 8
        formula = layers * 4 * s * (16 * h + a + 4) / 2**20
        print("%-3d %6.0f %6.0f %6.0f %12.0f %14.1f %14.0f %16.0f %7.1f" % (
            p, base, g, o, g - base, slot, o - base, (min(p, m) - 2) * slot, formula))
    print("peak RSS of rank 0 for every schedule, MiB: " + "; ".join(
        f"pp{p} {s} {results[p, s]['rss0']:.0f}" for p in pps for s in schedules))


COLOURS = {"F": "#f0a030", "B": "#5cb85c", "I": "#9ad77e", "W": "#5b9bd5", "R": "#c9a0dc",
           "end": "#999"}


def svg(path, out, title):
    ranks = events_of(path)
    n = len(ranks)
    chunks = {r: len({a.group(1) for a in (ACTION.fullmatch(e[0]) for e in ranks[r]) if a})
              for r in ranks}
    end = max(t + d for r in ranks.values() for _, t, d in r)
    left, right, top, row, gap = 70, 20, 50, 34, 8
    width = 1400
    scale = (width - left - right) / end
    height = top + n * (row + gap) + 60
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'font-family="sans-serif" font-size="11">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{left}" y="20" font-size="14">{title}</text>']
    step = 100 if end < 1500 else 250 if end < 4000 else 500
    t = 0
    while t <= end:
        x = left + t * scale
        o.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{top + n * (row + gap)}" '
                 'stroke="#ddd"/>')
        o.append(f'<text x="{x:.1f}" y="{top - 10}" text-anchor="middle" fill="#555">{t} ms</text>')
        t += step
    for i, r in enumerate(sorted(ranks)):
        y = top + i * (row + gap)
        o.append(f'<text x="{left - 8}" y="{y + row / 2 + 4}" text-anchor="end">rank {r}</text>')
        o.append(f'<rect x="{left}" y="{y}" width="{end * scale:.1f}" height="{row}" fill="#eee"/>')
        for name, t0, d in ranks[r]:
            a = ACTION.fullmatch(name)
            kind = a.group(2) if a else "end"
            x, w = left + t0 * scale, max(d * scale, 0.5)
            o.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row}" '
                     f'fill="{COLOURS[kind]}" stroke="white" stroke-width="0.6">'
                     f'<title>{name}: {t0:.1f} ms + {d:.1f} ms</title></rect>')
            label = name if not a or chunks[r] > 1 else kind + a.group(3)
            if w > 7 * len(label):
                o.append(f'<text x="{x + w / 2:.1f}" y="{y + row / 2 + 4}" '
                         f'text-anchor="middle">{label}</text>')
    y = top + n * (row + gap) + 20
    x = left
    for kind, what in (("F", "F: forward"), ("B", "B: whole backward"), ("I", "I: input gradient"),
                       ("W", "W: weight gradient"), ("R", "R: recompute"), ("end", "step end")):
        o.append(f'<rect x="{x}" y="{y - 10}" width="14" height="14" fill="{COLOURS[kind]}"/>')
        o.append(f'<text x="{x + 20}" y="{y + 1}">{what}</text>')
        x += 30 + 7 * len(what)
    o.append(f'<rect x="{x}" y="{y - 10}" width="14" height="14" fill="#eee"/>')
    o.append(f'<text x="{x + 20}" y="{y + 1}">idle (waiting, or descheduled between spans)</text>')
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "table":
        folder, pps, schedules, repeats, m = sys.argv[2:7]
        table(folder, [int(p) for p in pps.split(",")], schedules.split(","), int(repeats), int(m))
    elif sys.argv[1] == "svg":
        svg(*sys.argv[2:5])
    else:
        sys.exit(__doc__)
