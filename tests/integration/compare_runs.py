"""Compares a run with the one-process reference (docs/architecture.md, Equivalence): every logged
loss within a relative tolerance, and every parameter of the final checkpoints within the
depth-aware bound k * C^(L+1-l) * eps, where l is the tensor's layer (embeddings 0, block i at
i+1, final norm and head at L+1): errors introduced early in the forward pass are amplified by
every layer after them. The error of a tensor is the norm of the difference over the norm of
the reference (over the elements compared).

Elements whose gradient is rounding noise only are left out of the parameter comparison: the
bias of the keys, for one, has an exactly zero gradient (softmax ignores a shift shared by all
keys), and AdamW's normalisation turns its noise into learning-rate-sized steps of random sign in
any two runs. They are found in the reference's AdamW second moment: sqrt(v) below 1e-6 of the
model's largest.

usage: compare_runs.py REF_RUN RUN --loss-rtol R --eps E [--k K] [--c C] [--from-step S]"""
import argparse
import glob
import json
import re
import struct
import sys

import numpy as np


def losses(run, from_step):
    out = {}
    for line in open(f"{run}/metrics.jsonl"):
        rec = json.loads(line)
        if "loss" in rec and rec["step"] >= from_step:
            out[rec["step"]] = rec["loss"]
    return out


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {name: np.frombuffer(data[info["data_offsets"][0]:info["data_offsets"][1]], dtype=np.float32)
            for name, info in header.items() if name != "__metadata__"}


def tensors(run, prefix):
    """The newest checkpoint's tensors under prefix, each assembled from the pieces meta.json lists."""
    ck = sorted(glob.glob(f"{run}/step_*"))[-1]
    meta = json.load(open(f"{ck}/meta.json"))
    files = {name: read_safetensors(f"{ck}/{name}") for name in meta["files"]}
    out = {}
    for name, info in meta["tensors"].items():
        if name.startswith(prefix):
            whole = np.concatenate([files[p["file"]][name] for p in sorted(info["pieces"], key=lambda p: p["begin"])])
            out[name[len(prefix):]] = whole.reshape(info["shape"])
    return ck, out


def layer_of(name, n_layers):
    m = re.match(r"blocks\.(\d+)\.", name)
    if m:
        return int(m.group(1)) + 1
    return 0 if name.startswith("embed.") else n_layers + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--loss-rtol", type=float, required=True)
    ap.add_argument("--eps", type=float, required=True, help="unit roundoff of the compute dtype")
    ap.add_argument("--k", type=float, default=50.0)
    ap.add_argument("--c", type=float, default=2.0)
    ap.add_argument("--from-step", type=int, default=0)
    a = ap.parse_args()

    ref_l, run_l = losses(a.ref, a.from_step), losses(a.run, a.from_step)
    if not run_l or set(ref_l) != set(run_l):
        sys.exit(f"FAIL: logged steps differ: reference {sorted(ref_l)}, run {sorted(run_l)}")
    worst_loss = max(abs(run_l[s] - ref_l[s]) / abs(ref_l[s]) for s in ref_l)

    (ref_ck, ref_p), (run_ck, run_p) = tensors(a.ref, "param/"), tensors(a.run, "param/")
    grad_rms = {k: np.sqrt(v.astype(np.float64)) for k, v in tensors(a.ref, "adam_v/")[1].items()}
    noise_floor = 1e-6 * max(g.max() for g in grad_rms.values())
    left_out = 0
    if set(ref_p) != set(run_p):
        sys.exit(f"FAIL: parameter names differ between {ref_ck} and {run_ck}")
    n_layers = 1 + max([int(m.group(1)) for m in (re.match(r"blocks\.(\d+)\.", n) for n in ref_p) if m] + [-1])
    failures, worst_ratio = [], 0.0
    for name in sorted(ref_p):
        ref, got = ref_p[name].astype(np.float64), run_p[name].astype(np.float64)
        signal = grad_rms[name] >= noise_floor
        left_out += int((~signal).sum())
        if not signal.any():
            continue
        rel = np.linalg.norm((got - ref)[signal]) / max(np.linalg.norm(ref[signal]), 1e-30)
        bound = a.k * a.c ** (n_layers + 1 - layer_of(name, n_layers)) * a.eps
        worst_ratio = max(worst_ratio, rel / bound)
        if rel > bound:
            failures.append(f"{name}: relative error {rel:.3g} > bound {bound:.3g}")
    print(f"{a.run}: {len(run_l)} losses, worst relative loss error {worst_loss:.3g} "
          f"(tolerance {a.loss_rtol:g}); parameters at {worst_ratio:.3g} of their bound "
          f"({left_out} elements with noise-only gradients left out)")
    if worst_loss > a.loss_rtol:
        failures.append(f"loss error {worst_loss:.3g} > {a.loss_rtol:g}")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))


main()
