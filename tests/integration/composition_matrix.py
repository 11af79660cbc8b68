"""The pairwise matrix of composition_matrix_test.sh: its factors, their levels, the constraints
that make a row invalid, and what each row runs.

    composition_matrix.py check < ROWS        every valid pair of levels is in some row: prints
                                              the counts, exits 1 naming any pair left out
    composition_matrix.py plan WORK < ROWS    the references and rows to run (tab-separated)
    composition_matrix.py serial IN.csv OUT.csv   IN's stage placement, one micro-batch at a time

ROWS: one row per line, its name, then one level per factor in FACTORS' order (a "2sp" for tp is
tp 2 with sequence parallelism); # starts a comment.
"""
import itertools
import re
import sys

FACTORS = {
    "dtype": ["fp32", "bf16", "fp16", "fp8"],            # fp8: delayed scaling
    "pp": ["none", "gpipe", "1f1b", "interleaved", "zb1p", "zbv"],
    "tp": ["1", "2", "4"],
    "cp": ["1", "ring", "ulysses"],
    "moe": ["dense", "moe", "ep2"],                        # moe: 4 experts, top 2, on one ep rank
    "zero": ["0", "1", "2", "3"],
    "ac": ["none", "full", "selective"],
    "chunk": ["off", "on"],                                # train.loss_chunk 12 tokens
    "offload": ["off", "on"],                              # AdamW's moments; at ZeRO-3 the shards too
    "resume": ["no", "yes"],                               # stops at 10, one process resumes
}
NAMES = list(FACTORS)
# Pairs no row may hold. 4 heads over tp 4 leave 1 a rank, which Ulysses cannot split over cp 2
# (cleave's error). tp 4 with any other axis needs 8 ranks, about 2.5 s a run on 2 cores where a
# 4-rank one takes 1: rows stay within 4 ranks, so tp 4 is paired with no pp, cp, dp or ep
# (pipeline_composed_test.sh runs pp x tp x dp on 8).
INVALID_PAIRS = {(("tp", "4"), ("cp", "ulysses")), (("tp", "4"), ("cp", "ring")),
                 (("tp", "4"), ("moe", "ep2"))}
INVALID_PAIRS |= {(("pp", l), ("tp", "4")) for l in FACTORS["pp"][1:]}
INVALID_PAIRS |= {(("tp", "4"), ("zero", l)) for l in FACTORS["zero"][1:]}
MAX_RANKS = 4
MOE = ["model.moe_experts=4", "model.moe_ffn_hidden=64",
       "model.moe_shared_experts=1", "model.moe_aux_loss_coef=0.01", "model.moe_z_loss_coef=0.001"]


def ranks(r):
    """(dp, tp, pp, cp) of a row."""
    pp = 1 if r["pp"] == "none" else 2
    cp = 1 if r["cp"] == "1" else 2
    # ZeRO shards over dp_shard x cp and ep is carved out of it: dp 2 only without cp.
    dp = 2 if (r["zero"] != "0" or r["moe"] == "ep2") and cp == 1 else 1
    return dp, int(r["tp"]), pp, cp


def layers(r):
    """interleaved and zbv run 2 chunks a rank, a layer each: 4 layers at pp 2."""
    return 4 if r["pp"] in ("interleaved", "zbv") else 2


def top_k(r):
    """Experts each token chooses: top 2 of 4, but every expert in a reduced-precision row compared
    with one process (bf16's and fp16's rounding flips top-2 choices between honest layouts, after
    which the bounds do not hold: the test's comment has the numbers)."""
    return 4 if r["dtype"] != "fp32" and comparable(r) else 2


def comparable(r):
    """Compared with one process by compare_runs.py: 2 layers, or fp32 (whose bound holds at 4
    layers). It refuses bf16, fp16 and FP8 beyond the 2 layers their bounds were measured at."""
    return layers(r) == 2 or r["dtype"] == "fp32"


def twin(r):
    """Whether the row also runs as its twin, which must give the same bits: no activation
    checkpointing, nothing offloaded, and its schedule's stage placement run one micro-batch at a
    time. For 4-layer reduced-precision rows (no bound to compare them with) and FP8 rows with a
    schedule or checkpointing (FP8's bound, 1 lr, is too wide for a reused FP8 copy)."""
    if r["resume"] == "yes":
        return False
    return not comparable(r) or (r["dtype"] == "fp8" and (r["pp"] != "none" or r["ac"] != "none"))


def row_errors(r):
    out = []
    dp, tp, pp, cp = ranks(r)
    if dp * tp * pp * cp > MAX_RANKS:
        out.append(f"{dp * tp * pp * cp} ranks > {MAX_RANKS}")
    for (f1, l1), (f2, l2) in INVALID_PAIRS:
        if r[f1] == l1 and r[f2] == l2:
            out.append(f"{f1} {l1} with {f2} {l2}")
    if r["resume"] == "yes" and not comparable(r):
        out.append("a resumed row is compared with one process: at 4 layers fp32 only")
    if r["sp"] and r["tp"] == "1":
        out.append("sequence parallelism needs tp")
    return out


def read_rows(text):
    rows = []
    for line in text.splitlines():
        fields = line.split("#")[0].split()
        if not fields:
            continue
        if len(fields) != len(NAMES) + 1:
            sys.exit(f"FAIL: row {fields}: {len(NAMES) + 1} fields expected")
        r = dict(zip(["name"] + NAMES, fields))
        r["sp"] = r["tp"] == "2sp"
        if r["sp"]:
            r["tp"] = "2"
        for f in NAMES:
            if r[f] not in FACTORS[f]:
                sys.exit(f"FAIL: row {r['name']}: {f} {r[f]} is not one of {FACTORS[f]}")
        if errors := row_errors(r):
            sys.exit(f"FAIL: row {r['name']}: " + "; ".join(errors))
        rows.append(r)
    return rows


def check(rows):
    pairs = [((f1, l1), (f2, l2)) for f1, f2 in itertools.combinations(NAMES, 2)
             for l1 in FACTORS[f1] for l2 in FACTORS[f2]]
    valid = [p for p in pairs if p not in INVALID_PAIRS]
    missing = [p for p in valid if not any(r[p[0][0]] == p[0][1] and r[p[1][0]] == p[1][1] for r in rows)]
    for (f1, l1), (f2, l2) in missing:
        print(f"FAIL: no row has {f1} {l1} with {f2} {l2}")
    print(f"{len(NAMES)} factors, {len(rows)} rows: {len(valid) - len(missing)} of the {len(valid)} "
          f"valid pairs of levels covered ({len(pairs)} pairs, {len(pairs) - len(valid)} invalid)")
    return not missing


def sets(args):
    return " ".join(f"--set {a}" for a in args)


def model_args(r, ep):
    """What a row shares with its reference and its resuming process."""
    a = [f"train.dtype={r['dtype']}", f"model.n_layers={layers(r)}"]
    if r["moe"] != "dense":
        a += MOE + [f"model.moe_top_k={top_k(r)}"] + (["parallel.ep=2"] if ep and r["moe"] == "ep2" else [])
    return a


def batch(r):
    # zbv needs 2 x pp - 1 micro-batches: the pipelined rows accumulate 4 of 2, the others 2 of 4.
    return ["train.micro_batch_size=2", "train.grad_accum_steps=4"] if r["pp"] != "none" else \
        ["train.micro_batch_size=4", "train.grad_accum_steps=2"]


def row_args(r, work, as_twin=False):
    dp, tp, pp, cp = ranks(r)
    a = model_args(r, True) + batch(r)
    if dp > 1:
        a.append(f"parallel.dp_shard={dp}")
    if pp > 1:
        a += ["parallel.pp=2", f"parallel.pp_schedule_csv={work}/serial-{r['pp']}.csv" if as_twin
              else f"parallel.pp_schedule={r['pp']}"]
    if tp > 1:
        a.append(f"parallel.tp={tp}")
    if r["sp"]:
        a.append("parallel.sequence_parallel=true")
    if cp > 1:
        a += ["parallel.cp=2", f"parallel.cp_mode={r['cp']}"]
    if r["zero"] != "0":
        a.append(f"parallel.zero_stage={r['zero']}")
    if r["ac"] != "none" and not as_twin:
        a.append(f"train.activation_checkpointing={r['ac']}")
    if r["chunk"] == "on":
        a.append("train.loss_chunk=12")
    if r["offload"] == "on" and not as_twin:
        a.append("optim.offload=file")
        if r["zero"] == "3":
            a.append("parallel.offload_params=file")
    return a


def ref_name(r):
    return f"ref-{r['dtype']}-{'moe' + str(top_k(r)) if r['moe'] != 'dense' else 'dense'}-l{layers(r)}"


def plan(rows, work):
    """Lines `ref NAME ARGS` (one process) and `row NAME RANKS REF ARGS TWIN_ARGS RESUME
    RESUME_ARGS`, tab-separated; REF (compare_runs.py's reference), TWIN_ARGS and RESUME_ARGS are
    - where not used."""
    refs = {}
    for r in rows:
        if comparable(r):
            refs.setdefault(ref_name(r), sets(model_args(r, False)))
    for name, args in refs.items():
        print(f"ref\t{name}\t{args}")
    for r in rows:
        dp, tp, pp, cp = ranks(r)
        resume = r["resume"] == "yes"
        # The one process resuming: the row's model, batch, checkpointing and chunks, no axis.
        partner = [a for a in row_args(r, work) if not a.startswith(("parallel.", "optim."))]
        print("\t".join(["row", r["name"], str(dp * tp * pp * cp),
                         ref_name(r) if comparable(r) else "-", sets(row_args(r, work)),
                         sets(row_args(r, work, True)) if twin(r) else "-",
                         "yes" if resume else "no", sets(partner) if resume else "-"]))


def serial(src, dst):
    lines = [l.split(",") for l in open(src) if l.strip() and not l.lstrip().startswith("#")]
    owner, m = {}, 0
    for rank, cells in enumerate(lines):
        for c in cells:
            a = re.fullmatch(r"\s*(\d+)([FBIW])(\d+)\s*", c)
            if a:
                owner[int(a.group(1))] = rank
                m = max(m, int(a.group(3)) + 1)
    n = max(owner) + 1
    out = [[] for _ in lines]
    for k in range(m):  # micro-batch k forward through every stage, then backward, then k + 1
        for s in range(n):
            o = owner[s]
            if s > 0 and owner[s - 1] != o:
                out[o].append(f"{s}RECV_F{k}")
            out[o].append(f"{s}F{k}")
            if s < n - 1 and owner[s + 1] != o:
                out[o].append(f"{s}SEND_F{k}")
        for s in reversed(range(n)):
            o = owner[s]
            if s < n - 1 and owner[s + 1] != o:
                out[o].append(f"{s}RECV_B{k}")
            out[o].append(f"{s}B{k}")
            if s > 0 and owner[s - 1] != o:
                out[o].append(f"{s}SEND_B{k}")
    with open(dst, "w") as f:
        f.write(f"# {src}'s placement, one micro-batch at a time\n")
        f.writelines(",".join(o) + "\n" for o in out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "check":
        sys.exit(0 if check(read_rows(sys.stdin.read())) else 1)
    elif cmd == "plan":
        plan(read_rows(sys.stdin.read()), sys.argv[2])
    elif cmd == "serial":
        serial(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
