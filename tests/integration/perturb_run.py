"""Copies a run folder and plants one fault in the copy, for compare_sabotage_test.sh: the
comparison (compare_runs.py) must then fail and name it.

    perturb_run.py RUN OUT param NAME [--rows A:B] [--file F] [--size S]
    perturb_run.py RUN OUT expert PREFIX [--size S]
    perturb_run.py RUN OUT moe_bias LAYER EXPERT [--size S]
    perturb_run.py RUN OUT loss STEP [--size S]

param: every element of tensor NAME in the newest checkpoint (only the global rows [A, B) with
--rows, only the pieces file F holds with --file: one tp rank's half, one pipeline stage's
layers) moves by S x optim.lr (S = 1 unless given), each by a sign drawn at random, so the
elements' RMS error is S lr. expert: the same for every tensor whose name starts with
PREFIX + "." (one expert: blocks.1.mlp.experts.2). moe_bias: sigmoid_bias's balancing bias of
one expert in meta.json moves by S x model.moe_bias_update_rate (S steps of its own update).
loss: the training loss logged at STEP is multiplied by 1 + S x 1e-4. S = 0 copies the run
unchanged through the same code.

The safetensors files are changed in place, byte for byte the same size. meta.json's checksums
are left as they were: compare_runs.py does not read them (cleave verifies them when it loads a
checkpoint, which the comparison never asks it to do).
"""
import argparse
import glob
import json
import shutil
import struct
import sys
import tomllib

import numpy as np


def newest(run):
    return sorted(glob.glob(f"{run}/step_*"))[-1]


def tensor_entries(path):
    """{key: (absolute byte offset of its data, element count)} of a safetensors file (fp32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        assert info["dtype"] == "F32", (path, key, info["dtype"])
        begin, end = info["data_offsets"]
        out[key] = (8 + n + begin, (end - begin) // 4)
    return out


def perturb_tensor(ckpt, meta, name, lr, size, rows, only_file, rng):
    """Moves the elements of tensor `name` (global rows `rows` = (a, b) or all) held by the
    pieces of `only_file` (or all files). -> elements moved."""
    info = meta["tensors"].get(name)
    if info is None:
        sys.exit(f"perturb_run.py: no tensor {name} in {ckpt}/meta.json")
    moved = 0
    for p in info["pieces"]:
        if only_file and p["file"] != only_file:
            continue
        box = p.get("box", info["shape"])
        offset = p.get("offset", [0] * len(box))
        begin, end = p.get("begin", 0), p.get("end", int(np.prod(box)))
        flat = np.arange(begin, end)
        row_len = int(np.prod(box[1:])) if len(box) > 1 else 1
        global_row = offset[0] + flat // row_len
        hit = np.ones(flat.size, dtype=bool) if rows is None else \
            (global_row >= rows[0]) & (global_row < rows[1])
        if not hit.any():
            continue
        path = f"{ckpt}/{p['file']}"
        at, count = tensor_entries(path)[p.get("key", name)]
        assert count == end - begin, (name, p, count)
        with open(path, "r+b") as f:
            f.seek(at)
            data = np.frombuffer(f.read(4 * count), dtype="<f4").copy()
            signs = rng.choice([-1.0, 1.0], size=int(hit.sum()))
            data[hit] = (data[hit].astype(np.float64) + signs * size * lr).astype(np.float32)
            f.seek(at)
            f.write(data.tobytes())
        moved += int(hit.sum())
    if moved == 0:
        sys.exit(f"perturb_run.py: nothing of {name} matched {rows=} {only_file=}")
    return moved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("out")
    ap.add_argument("kind", choices=("param", "expert", "moe_bias", "loss"))
    ap.add_argument("what", nargs="+")
    ap.add_argument("--rows")
    ap.add_argument("--file")
    ap.add_argument("--size", type=float, default=1.0)
    a = ap.parse_args()

    shutil.rmtree(a.out, ignore_errors=True)
    shutil.copytree(a.run, a.out)
    ckpt = newest(a.out)
    meta = json.load(open(f"{ckpt}/meta.json"))
    config = tomllib.loads(meta["config"])
    lr = config["optim"]["lr"]
    rng = np.random.default_rng(27)
    if a.kind == "param":
        rows = tuple(int(x) for x in a.rows.split(":")) if a.rows else None
        n = perturb_tensor(ckpt, meta, f"param/{a.what[0]}", lr, a.size, rows, a.file, rng)
        print(f"{a.out}: {n} elements of param/{a.what[0]} moved by {a.size:g} lr")
    elif a.kind == "expert":
        names = [t for t in meta["tensors"] if t.startswith(f"param/{a.what[0]}.")]
        if not names:
            sys.exit(f"perturb_run.py: no tensors of {a.what[0]}")
        n = sum(perturb_tensor(ckpt, meta, t, lr, a.size, None, None, rng) for t in names)
        print(f"{a.out}: {n} elements of {len(names)} tensors of {a.what[0]} moved by {a.size:g} lr")
    elif a.kind == "moe_bias":
        layer, expert = a.what[0], int(a.what[1])
        rate = config["model"].get("moe_bias_update_rate", 1e-3)
        meta["moe_bias"][layer][expert] += a.size * rate
        with open(f"{ckpt}/meta.json", "w") as f:
            json.dump(meta, f, indent=2)
        print(f"{a.out}: moe_bias of layer {layer} expert {expert} moved by {a.size:g} steps")
    else:
        step = int(a.what[0])
        lines = open(f"{a.out}/metrics.jsonl").read().splitlines()
        found = False
        for i, line in enumerate(lines):
            rec = json.loads(line)
            if rec.get("step") == step and "loss" in rec:
                rec["loss"] *= 1 + a.size * 1e-4
                lines[i] = json.dumps(rec)
                found = True
        if not found:
            sys.exit(f"perturb_run.py: no loss logged at step {step}")
        open(f"{a.out}/metrics.jsonl", "w").write("\n".join(lines) + "\n")
        print(f"{a.out}: the loss at step {step} moved by {a.size * 1e-4:g} (relative)")


if __name__ == "__main__":
    main()
