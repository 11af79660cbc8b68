"""Compares runs against the single-process reference run (docs/architecture.md, Equivalence)
with bounds measured from honest runs; docs/data_parallel.md ("Equivalence bounds") has the
derivation.

    compare_runs.py REF_RUN RUN [RUN ...] [--from-step S] [--report]

The compute dtype (fp32, bf16, fp16, or fp8 with its recipe) is read from the runs' checkpoints
(they must agree) and picks the bounds; callers pass none, so none can loosen them.

- Losses: every logged loss, training and validation, from step S on within LOSS_RTOL[dtype] of
  the reference's (relative).
- Parameters, final checkpoints: for every tensor, the RMS of (run - reference) over its
  elements, in units of the peak learning rate optim.lr, at most PARAM_BOUND[dtype]. AdamW moves
  every element by about lr per step whatever the tensor's scale, so an error of 1 means the
  elements are, on average, one whole update off. Honest errors in this measure are alike
  across tensors (those of the test model's 28 tensors lie within 10-20x of each other), and a
  wrong update shows up the same in any tensor. The error relative to the tensor's norm does
  not: layer norm weights sit near 1 and move 1% in 20 steps, so their relative errors are
  100x below the others' and a bound that fits the others hides them. The largest 0.5% of a
  tensor's element errors are left out (TRIM).
- Rows and experts, final checkpoints: each row of embed.wte and lm_head.weight (one token's),
  of every router (one expert's) and of every expert's tensors (a bias is one row), the RMS of
  its element errors but its largest 1 in 16 (row_trim: 4 of a 64-wide row), in lr units, at
  most ROW_BOUND[dtype]. A row of the test model's embedding is 0.4% of it, less than TRIM: one
  token's row one whole update off moved the tensor's trimmed RMS by nothing, and showed, if at
  all, only in the loss.
- sigmoid_bias's balancing biases (meta.json moe_bias): each expert's within MOE_BIAS_BOUND of
  one update step (model.moe_bias_update_rate) of the reference's.
- Reduced precision (bf16, fp16, fp8) only where its bounds were measured: at most
  MEASURED_LAYERS layers and MEASURED_STEPS steps; a deeper or longer run fails with a message
  that says so (see "Depth and steps" below).

Elements whose gradient is rounding noise only are left out of the parameter comparison: the
bias of the keys, for one, has an exactly zero gradient (softmax ignores a shift shared by all
keys), and AdamW's normalisation turns its noise into learning-rate-sized steps of random sign in
any two runs. They are found in the reference's AdamW second moment: sqrt(v) below 1e-6 of the
model's largest.

Derivation (docs/data_parallel.md has the sabotages that prove the bounds). The test model,
tests/configs/tiny_train.toml (GPT-2, 2 layers, d_model 64, lr 3e-3), 20 steps. Honest runs,
each against the one-process run of the same global batch (8, or 6 for 3 and 6 ranks): every
data_parallel_test.sh layout (DDP, ZeRO-1/2/3 on 2 and 4 ranks, HSDP 2x2, hybrid ZeRO-1 2x2)
with gradient accumulation 1 and 2; DDP and ZeRO-3 on 8 ranks; HSDP 2x4 and 4x2; DDP on 4 ranks
with 10 KB buckets; DDP, ZeRO-2 and ZeRO-3 on 3 ranks, ZeRO-2 on 6; one process accumulating 2
and 4; one process on 2 threads (bitwise equal). The largest errors seen over all runs (loss relative;
parameters in lr units: per layer, and the range of the 28 tensors' largest), as
tests/integration/equivalence_spread.sh prints them:

          loss    embed    block 0  block 1  final    per tensor     bound: loss  params  factor
    fp32  1.3e-7  4.3e-6   1.7e-5   1.2e-5   8.2e-6   9.3e-7-1.7e-5      1e-5   5e-4    79x, 2.8x
    bf16  1.5e-5  9.7e-3   1.05e-2  8.7e-3   4.1e-3   1.1e-3-1.05e-2     1e-4   5e-2    6.5x, 4.8x
    fp16  2.0e-6  6.1e-4   1.4e-3   1.1e-3   5.3e-4   2.0e-4-1.4e-3      1e-4   5e-2

    fp8   4.6e-4  (each recipe: every layout of fp8_layouts.sh, seeds 1234, 1, 2)  2e-3   1.0  4.3x, 2.7x
          the largest parameter error 0.38 lr (current, tp 2); delayed's 0.23 lr

FP8 rounds to 3 mantissa bits (E4M3) or 2 (E5M2): a reordered fp32 sum that moves a value across
a rounding boundary moves it by 6-12%, not bf16's 0.4%, and training amplifies it. The FP8 bounds
are each recipe's honest spread at the test model (docs/precision.md#fp8 has the table and the
sabotages); they check the FP8 code under each layout, while the layouts themselves are held to
fp32's and bf16's bounds by their own tests. FP8's own reductions (amax over shards) are checked
directly: the amax history in the checkpoints, and tests/mpi/parallel_fp8_amax_test.cpp.

fp16's data-parallel spread is 8x below bf16's (3 more mantissa bits), but tp reorders the sums
inside every product, forward included: in the depth runs (equivalence_spread.sh WORK depth fp16,
2 layers, seeds 1234, 1, 2) tp 2 reached 2.2e-5 in the loss and 1.1e-2 lr, bf16's data-parallel
spread, against 1.2e-3 for the other layouts. So fp16 takes bf16's bounds (4.5x and 4.6x tp's).

Rows and experts (ROW_BOUND). tests/integration/row_spread.sh prints each row tensor's worst row
over honest runs; measured on a 2-core AVX2 machine (bf16 and FP8 products there are fp32
products of the same bf16 values), 20 steps of the test model, seeds 1234, 1 and 2 each: GPT-2
(tied) and Llama (2 kv heads, untied head), global batch 8 against one process of 8 x 1: DDP 2,
ZeRO-3 x 2 accumulating 2, tp 2, tp 2 with SP, pp 2, cp 2, DDP 4, HSDP 2x2, tp 2 x ZeRO-1 x 2,
one process accumulating 2 and 4 (11 layouts); a 257-token Llama at tp 2 (the last row beside
tp's padding); moe_test.sh's Llama MoE (4 experts, sigmoid_bias, one shared; top 2 in fp32,
all 4 in bf16 as moe_test.sh runs it) at ep 2, tp 2, ep 2 x pp 2, cp 2 x ep 2, ZeRO-3 x ep 2,
one process accumulating 4; FP8: fp8_layouts.sh's layouts of each recipe (seed 1234; current,
the widest, also seeds 1 and 2) and fp8_delayed_test.sh's Llama at tp 2 and MoE at ep 2. The
largest row error (lr units), against the largest whole-tensor error of the same runs:

          rows: dense  v257 tp 2  MoE                  tensors  row bound  margin  a row 1 lr off
    fp32        3.7e-5 4.6e-5     1.1e-4 (expert row)  7.2e-5   1e-3       9x      1000x the bound
    bf16        1.6e-2 1.4e-2     5.4e-2 (expert row)  1.9e-2   0.3        5.5x    3.3x
    fp16        1.7e-2 2.0e-3     -                    2.6e-2   0.3        18x     3.3x
    fp8         0.155  -          9.2e-2 (expert row)  0.42     0.5        3.2x    2x

Untrimmed, bf16's and fp16's rows reached 0.66 lr: single elements 0.1-5.3 lr off (one with a
gradient at rounding noise, sqrt(v) 2e-7 against its row's 3e-4, which AdamW turns into
lr-sized steps of random sign) in rows whose other elements agree within 2e-2 lr. No row held
more than 2 such elements (of 64); row_trim leaves out 4. (The whole tensors' TRIM is there for
the same elements.) fp16 takes bf16's row bound as it takes its other bounds. FP8's rows stay
well below its tensors (the embedding and the head are not FP8 products), so its row bound is
tighter than its tensor bound of 1 lr and still catches a row one lr off. (fp16's tensors here,
its products emulated in fp32, reached 2.6e-2 lr, HSDP 2x2 of GPT-2 seed 2: half its bound, 18x
the table's 1.4e-3; bf16's here 1.9e-2, GPT-2 seed 1234 cp 2, and its loss 4.5e-5.)
The MoE biases of fp32's honest runs above are bitwise the reference's (the same tokens choose
the same experts, so the loads are equal); one flipped choice moves a bias one whole step, so
MOE_BIAS_BOUND is half a step. bf16 tests choose every expert, whose biases then never move.
compare_sabotage_test.sh plants each fault (a row, the padded vocabulary's last row, a head row,
an expert, an expert's row, a router row, a tp half, a pipeline stage's layer, a bias, a logged
loss; a row in bf16 and FP8) in copies of honest runs and checks that this comparison fails
and names it.

Depth and steps. The reduced-precision bounds hold for the 2-layer model and 20 steps they were
measured at, and every bf16, fp16 and fp8 layout test runs that model for 20 steps. Deeper, the
bf16 spread outgrows them with no rule in depth (docs/data_parallel.md, "bf16 and depth", native
bf16 products: at 4 layers 0.036-0.078 lr, the seed moving it more than depth does), and in
issue 27's 4-layer Llama (4 kv heads, untied, vocabulary 320, 8 x 4 micro-batches of 32, lr
3e-3, 12 steps) the bf16 loss spread was 8e-6 to step 10 and 2.4e-4 at step 11 (one process of
4 x 8 1.6e-4, DDP 2 1.4e-4, tp 2 2.4e-4): 2.4x LOSS_RTOL. Rather than scale the bounds by a
rule the measurements do not show, a reduced-precision run beyond MEASURED_LAYERS or
MEASURED_STEPS fails. The same 4-layer Llama here (row_spread.sh ... llama4 DTYPE, the test
corpus tokenized to 320 pieces; one process of 4 x 8, DDP 2, tp 2), whose step 11 did not jump:
bf16 loss 6.1e-6, tensors 1.0e-2 lr, rows 2.0e-2 lr; fp16 2.6e-6, 3.9e-3, 4.8e-3 (within their
bounds); fp32 loss 7.4e-8, rows 2.8e-4 lr, but tensors 1.76e-4 lr (blocks.0.norm1.weight; DDP 2
1.3e-4, tp 2 9.3e-5). fp32's parameter bound was 1e-4, 6x the 2-layer spread above, but deeper
models reach it on an AVX2-only CPU (Zen 3, whose oneDNN blocks its fp32 products otherwise):
that 1.76e-4, and document_mask_test.sh's 4-layer tp 2 (with or without SP) 1.05e-4, all of it
one LayerNorm weight element whose gradient's RMS is a third of its tensor's median (AdamW turns
a small gradient's rounding into a larger step). So fp32's bound is 5e-4: 2.8x the largest honest
error seen at any depth the tests use, and still 2000x below a tensor one lr off.

The parameter bound is about 5x the largest honest error. The errors do not grow toward the
embedding, so it is one number per dtype, not depth-aware. The fp32 loss tolerance is
the team design's; its bf16 2e-2 is 1300x the honest spread and caught none of the sabotages
(the largest moved the loss 2.7e-3), so it is 1e-4 here. Same layout, same bits: a rerun of an
honest run lands on the same error, so the margin guards new layouts, not flakiness.
"""
import argparse
import glob
import json
import math
import re
import struct
import sys
import tomllib

import numpy as np

FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
LOSS_RTOL = {"fp32": 1e-5, "bf16": 1e-4, "fp16": 1e-4} | {f"fp8-{r}": 2e-3 for r in FP8_RECIPES}
PARAM_BOUND = {"fp32": 5e-4, "bf16": 5e-2, "fp16": 5e-2} | {f"fp8-{r}": 1.0 for r in FP8_RECIPES}  # RMS error of each tensor, in units of optim.lr
# The 0.5% largest element errors of each tensor are left out of its RMS: a few elements whose
# gradient is rounding noise in one run move lr-sized steps apart (Llama's untied embedding had
# one row, token 180 of the test data, 1e-3-2.6e-3 lr off in fp32 while the rest of the tensor
# stayed within 7e-6 lr). Rounded up, but never more than a row's trim (row_trim): a tensor of 64
# (a norm's weights) drops its largest, one below 16 none. Native bf16 products (AVX-512 BF16,
# Zen 5) moved one weight of blocks.0.norm1.weight 0.44 lr apart in tp 2 against one process, and
# the next largest 0.02 lr: a gradient near zero whose sign the rounding flipped at the first
# update, which AdamW makes a whole lr. Rows are held by ROW_BOUND, with a trim of their own.
TRIM = 0.005
# The RMS error of one row (of embed.wte, lm_head.weight, a router, an expert's tensor) but its
# row_trim largest elements, in units of optim.lr (the docstring has the measurements).
ROW_BOUND = {"fp32": 1e-3, "bf16": 0.3, "fp16": 0.3} | {f"fp8-{r}": 0.5 for r in FP8_RECIPES}
# Where the reduced-precision bounds were measured: the test model's 2 layers, 20 steps. Deeper
# or longer, the honest bf16 spread outgrows them (docs/data_parallel.md, "bf16 and depth"), so a
# run beyond is refused rather than judged by a bound that does not hold there.
MEASURED_LAYERS, MEASURED_STEPS = 2, 20
# sigmoid_bias's balancing biases (meta.json moe_bias): the largest difference of one expert's
# bias, in units of model.moe_bias_update_rate (one step's move).
MOE_BIAS_BOUND = 0.5
EXPERT = re.compile(r"(.*\.experts\.\d+)\.")


def row_trim(n):
    """Elements of a row of n left out of its RMS: 1 in 16 (4 of a 64-wide row), none below 16."""
    return n // 16


def tensor_trim(n):
    """Elements of a tensor of n left out of its RMS (see TRIM)."""
    return min(math.ceil(TRIM * n), row_trim(n))


# A validation's samples: val_batches micro-batches of micro_batch_size sequences of seq_len.
VALIDATION_KEYS = ("val_batches", "micro_batch_size", "seq_len")


def losses(run, from_step, kinds):
    """{(kind, step): loss} of the logged losses of `kinds` ("loss", "val_loss")."""
    out = {}
    for line in open(f"{run}/metrics.jsonl"):
        rec = json.loads(line)
        for kind in kinds:
            if kind in rec and rec["step"] >= from_step:
                out[kind, rec["step"]] = rec[kind]
    return out


def read_safetensors(path):
    # Mapped, not read: each tensor is a view of the file (the layout tests compare some 300 runs,
    # and reading a checkpoint into new memory cost more than comparing it).
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return {name: data[info["data_offsets"][0]:info["data_offsets"][1]].view(np.float32)
            for name, info in header.items() if name != "__metadata__"}


class Checkpoint:
    """A run's newest checkpoint: its config and tensors (each assembled from the pieces
    meta.json lists)."""

    def __init__(self, run):
        self.dir = run
        self.path = sorted(glob.glob(f"{run}/step_*"))[-1]
        meta = json.load(open(f"{self.path}/meta.json"))
        self.config = tomllib.loads(meta["config"])
        self.step = meta["step"]
        self.moe_bias = {int(layer): np.array(b, dtype=np.float64)
                         for layer, b in (meta.get("moe_bias") or {}).items()}
        self.dtype = self.config["train"]["dtype"]
        if self.dtype == "fp8":  # each recipe has its own bounds: "fp8-delayed"
            self.dtype += "-" + self.config["train"].get("fp8_recipe", "delayed")
        self.lr = self.config["optim"]["lr"]
        files = {name: read_safetensors(f"{self.path}/{name}") for name in meta["files"]}
        self.tensors = {}
        for name, info in meta["tensors"].items():
            # Each piece is a box of the global tensor (offset, extent) and a range of the box's
            # elements; every element must be covered exactly once.
            whole = np.zeros(info["shape"], dtype=np.float64)
            seen = np.zeros(info["shape"], dtype=np.int32)
            for p in info["pieces"]:
                box = p.get("box", info["shape"])
                offset = p.get("offset", [0] * len(box))
                data = files[p["file"]][p.get("key", name)]
                flat = np.full(int(np.prod(box)), np.nan)
                flat[p.get("begin", 0):p.get("end", flat.size)] = data
                covered = np.zeros(flat.size, dtype=np.int32)
                covered[p.get("begin", 0):p.get("end", flat.size)] = 1
                where = tuple(slice(o, o + b) for o, b in zip(offset, box))
                region = whole[where].reshape(-1)
                region[covered == 1] = flat[covered == 1]
                whole[where] = region.reshape(box)
                seen[where] += covered.reshape(box)
            if not (seen == 1).all():
                raise SystemExit(f"{self.path}: the pieces of {name} do not cover it exactly once")
            self.tensors[name] = whole

    def group(self, prefix):
        return {n[len(prefix):]: t for n, t in self.tensors.items() if n.startswith(prefix)}


def layer_of(name):
    """For the report: embeddings 'embed', block i 'block i', the rest (final norm, head) 'final'."""
    m = re.match(r"blocks\.(\d+)\.", name)
    return f"block {m.group(1)}" if m else "embed" if name.startswith("embed.") else "final"


def compare(ref, run_dir, from_step):
    """-> (dtype, worst relative loss error, {tensor: (error in lr units, relative error)},
    {row or expert: error in lr units}, elements left out, failures, whether validation losses
    were compared)"""
    failures = []
    run = Checkpoint(run_dir)
    if run.dtype != ref.dtype:
        failures.append(f"dtype {run.dtype} against a {ref.dtype} reference")
    if run.lr != ref.lr:
        failures.append(f"optim.lr {run.lr} against the reference's {ref.lr}")
    layers = run.config["model"]["n_layers"]
    if ref.dtype != "fp32" and (layers > MEASURED_LAYERS or run.step > MEASURED_STEPS):
        failures.append(f"{ref.dtype}'s bounds were measured at up to {MEASURED_LAYERS} layers and "
                        f"{MEASURED_STEPS} steps, this run has {layers} layers and {run.step} steps: "
                        f"measure its honest spread first (equivalence_spread.sh, row_spread.sh)")
    # Validation losses compare only where both runs validate on the same samples.
    same_val = all(run.config["train"][k] == ref.config["train"][k] for k in VALIDATION_KEYS)
    kinds = ("loss", "val_loss") if same_val else ("loss",)
    ref_l, run_l = losses(ref.dir, from_step, kinds), losses(run_dir, from_step, kinds)
    if not run_l or set(ref_l) != set(run_l):
        failures.append(f"logged losses differ: reference {sorted(ref_l)}, run {sorted(run_l)}")
        return ref.dtype, float("inf"), {}, {}, 0, failures, same_val
    worst_loss = max(abs(run_l[s] - ref_l[s]) / abs(ref_l[s]) for s in ref_l)
    if worst_loss > LOSS_RTOL[ref.dtype]:
        failures.append(f"loss error {worst_loss:.3g} > {LOSS_RTOL[ref.dtype]:g}")

    ref_p, run_p = ref.group("param/"), run.group("param/")
    if set(ref_p) != set(run_p):
        failures.append(f"parameter names differ between {ref.path} and {run.path}")
        return ref.dtype, worst_loss, {}, {}, 0, failures, same_val
    grad_rms = {k: np.sqrt(v) for k, v in ref.group("adam_v/").items()}
    noise_floor = 1e-6 * max(g.max() for g in grad_rms.values())
    errors, left_out = {}, 0
    for name in sorted(ref_p):
        signal = grad_rms[name] >= noise_floor
        left_out += int((~signal).sum())
        if not signal.any():
            continue
        diff = (run_p[name] - ref_p[name])[signal]
        # The largest TRIM of a tensor's errors are left out of its RMS (see TRIM).
        kept = np.sort(diff ** 2)[:diff.size - tensor_trim(diff.size)]
        err = np.sqrt(np.mean(kept)) / ref.lr
        rel = np.linalg.norm(diff) / max(np.linalg.norm(ref_p[name][signal]), 1e-30)
        errors[name] = (err, rel)
        if err > PARAM_BOUND[ref.dtype]:
            failures.append(f"{name}: error {err:.3g} lr > bound {PARAM_BOUND[ref.dtype]:g} lr")
    units = {row_label(name, row): err for name, (err, row) in row_errors(ref, ref_p, run_p).items()}
    for unit, err in units.items():
        if err > ROW_BOUND[ref.dtype]:
            failures.append(f"{unit}: error {err:.3g} lr > row bound {ROW_BOUND[ref.dtype]:g} lr")
    failures += moe_bias_failures(ref, run)
    return ref.dtype, worst_loss, errors, units, left_out, failures, same_val


def row_errors(ref, ref_p, run_p):
    """The trimmed whole-tensor RMS cannot see one vocabulary row or one expert go wrong (a row of
    embed.wte is 0.4% of it, less than TRIM). So each row of the vocabulary tensors (embed.wte,
    lm_head.weight), of the routers (a row per expert) and of every expert's tensors (a 1-d bias
    is one row) is held on its own: the RMS error of its elements but its row_trim() largest, in lr
    units, every element included (an unseen token's row has no gradient and moves by weight
    decay alone, alike in every run). -> {tensor: (error, row)}, each tensor's worst row."""
    out = {}
    for name in sorted(ref_p):
        if not (name in ("embed.wte", "lm_head.weight") or name.endswith(".router.weight")
                or EXPERT.match(name)):
            continue
        d = run_p[name] - ref_p[name]
        sq = np.sort((d * d).reshape(-1 if d.ndim == 1 else d.shape[0], d.shape[-1]), axis=1)
        keep = sq.shape[1] - row_trim(sq.shape[1])
        err = np.sqrt(np.mean(sq[:, :keep], axis=1)) / ref.lr
        r = int(np.argmax(err))
        out[name] = (float(err[r]), r)
    return out


def row_label(name, row):
    if name.endswith(".router.weight"):
        return f"{name} expert {row}"
    return name if EXPERT.match(name) and "bias" in name.rsplit(".", 1)[-1] else f"{name} row {row}"


def moe_bias_failures(ref, run):
    """sigmoid_bias's balancing biases (meta.json): each expert's within MOE_BIAS_BOUND steps of
    the reference's. Honest layouts route alike and so count the same loads (moe_test.sh checks
    that the drops agree), hence the same biases; one flipped choice moves one by a whole step."""
    if set(ref.moe_bias) != set(run.moe_bias):
        return [f"moe_bias layers {sorted(run.moe_bias)} against the reference's {sorted(ref.moe_bias)}"]
    rate = ref.config["model"].get("moe_bias_update_rate", 1e-3) or 1e-3  # 0: biases never move
    out = []
    for layer in sorted(ref.moe_bias):
        a, b = ref.moe_bias[layer], run.moe_bias[layer]
        if a.shape != b.shape:
            out.append(f"moe_bias of layer {layer}: {b.size} experts against {a.size}")
            continue
        diff = np.abs(b - a) / rate
        e = int(np.argmax(diff))
        if diff[e] > MOE_BIAS_BOUND:
            out.append(f"moe_bias of layer {layer} expert {e}: {b[e]:.6g} against the reference's "
                       f"{a[e]:.6g}, {diff[e]:.3g} update steps > bound {MOE_BIAS_BOUND:g}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--from-step", type=int, default=0, help="compare the losses from this step on")
    ap.add_argument("--report", action="store_true",
                    help="print every tensor's error: the largest over the runs, and which run")
    a = ap.parse_args()

    ref = Checkpoint(a.ref)
    if ref.dtype not in PARAM_BOUND:
        sys.exit(f"FAIL: no bounds for dtype {ref.dtype}")
    bound, rtol = PARAM_BOUND[ref.dtype], LOSS_RTOL[ref.dtype]
    row_bound = ROW_BOUND[ref.dtype]
    failed, worst, worst_unit, worst_loss = False, {}, {}, (0.0, None)
    for run in a.runs:
        dtype, loss, errors, units, left_out, failures, same_val = compare(ref, run, a.from_step)
        top = max(errors, key=lambda n: errors[n][0]) if errors else None
        top_unit = max(units, key=units.get) if units else None
        which = "training and validation" if same_val else "training; validation on other samples"
        print(f"{run} ({dtype}): worst relative loss error {loss:.3g} ({which}; tolerance {rtol:g}); "
              + (f"largest parameter error {errors[top][0]:.3g} lr, {errors[top][0] / bound:.3g} of "
                 f"the bound {bound:g} lr ({top})" if top else "no parameters compared")
              + (f"; largest row/expert error {units[top_unit]:.3g} lr, {units[top_unit] / row_bound:.3g} "
                 f"of the bound {row_bound:g} lr ({top_unit})" if top_unit else "")
              + f"; {left_out} elements with noise-only gradients left out")
        if failures:
            print(f"FAIL {run}: " + "; ".join(failures))
            failed = True
        for name, (err, rel) in errors.items():
            if name not in worst or err > worst[name][0]:
                worst[name] = (err, rel, run)
        for unit, err in units.items():
            tensor = re.sub(r"experts\.\d+", "experts.*", unit.split(" ")[0])  # the worst row of
            # each tensor (of each layer's experts together) over the runs
            if tensor not in worst_unit or err > worst_unit[tensor][0]:
                worst_unit[tensor] = (err, unit, run)
        worst_loss = max(worst_loss, (loss, run), key=lambda w: w[0])
    if a.report:
        print(f"\nlargest over {len(a.runs)} run(s) against {a.ref} ({ref.dtype}, lr {ref.lr:g})")
        print(f"  loss: relative error {worst_loss[0]:.3g} ({worst_loss[1]})")
        print(f"  {'tensor':32s} {'layer':8s} {'error/lr':>9s} {'of bound':>8s} {'rel. to norm':>12s}  run")
        for name in sorted(worst, key=lambda n: (layer_of(n), n)):
            err, rel, at = worst[name]
            print(f"  {name:32s} {layer_of(name):8s} {err:9.3g} {err / bound:8.3g} {rel:12.3g}  {at}")
        by_layer = {}
        for name, (err, _, _) in worst.items():
            by_layer[layer_of(name)] = max(by_layer.get(layer_of(name), 0), err)
        print("  per layer, largest error/lr: "
              + ", ".join(f"{l} {e:.3g}" for l, e in sorted(by_layer.items())))
        if worst_unit:
            print(f"  rows and experts, untrimmed (bound {row_bound:g} lr):")
            print(f"  {'row or expert':48s} {'error/lr':>9s} {'of bound':>8s}  run")
            for tensor in sorted(worst_unit):
                err, unit, at = worst_unit[tensor]
                print(f"  {unit:48s} {err:9.3g} {err / row_bound:8.3g}  {at}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
