"""cleave plot: loss, validation loss, tokens/s and MFU against step from each run's
metrics.jsonl, several runs overlaid (cleave embeds this script and runs it with python3).

    python3 plot_runs.py OUT_FILE RUN_DIR [RUN_DIR ...]

The output format follows OUT_FILE's extension (svg, png or pdf)."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in an SVG: smaller, searchable
import matplotlib.pyplot as plt  # noqa: E402


def read_run(run):
    path = os.path.join(run, "metrics.jsonl")
    train, val = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"cleave plot: {path} line {number} is not JSON: {e}")
            if "val_loss" in record:
                val.append(record)
            elif "loss" in record:
                train.append(record)
    if not train and not val:
        sys.exit(f"cleave plot: {path} holds no training or validation records")
    return train, val


def main():
    out, runs = sys.argv[1], sys.argv[2:]
    panels = [("loss", "training loss"), ("val_loss", "validation loss"),
              ("tokens_per_s", "tokens/s"), ("mfu", "MFU (% of the GEMM peak)")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for run in runs:
        train, val = read_run(run)
        label = os.path.basename(os.path.normpath(run)) or run
        for ax, (key, title) in zip(axes.flat, panels):
            records = val if key == "val_loss" else train
            points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
            if key == "mfu":
                points = [(s, 100 * v) for s, v in points]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="." if len(points) < 50 else None, label=label,
                        gid=f"{label}:{key}:{len(points)}")
            ax.set_title(title)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out)
    print(f"plotted {len(runs)} run{'s' if len(runs) != 1 else ''} to {out}")


main()
