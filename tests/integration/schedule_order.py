"""Checks that a run executed its pipeline schedule: each rank's compute spans in a step's trace
(trace_step_N.json, names like "0F3": stage, action, micro-batch), in the order they ran, are the
compute actions (F, B, I, W) of that rank's line of the schedule `cleave schedule --csv` wrote.
A schedule setting the trainer ignored (gpipe or zb1p running as 1f1b) fails here, where the
losses alone would not tell.

    schedule_order.py TRACE.json SCHEDULE.csv
"""
import json
import re
import sys

COMPUTE = re.compile(r"^\d+[FBIW]\d+$")


def main():
    trace_path, csv_path = sys.argv[1:3]
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    ran = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if COMPUTE.match(e["name"]):
            ran.setdefault(e["tid"], []).append(e["name"])
    planned = [[a.strip() for a in line.split(",") if COMPUTE.match(a.strip())]
               for line in open(csv_path) if line.strip() and not line.startswith("#")]
    if sorted(ran) != list(range(len(planned))):
        sys.exit(f"FAIL: the trace has ranks {sorted(ran)}, the schedule {len(planned)}")
    for rank, actions in enumerate(planned):
        if ran[rank] != actions:
            first = next((i for i, (a, b) in enumerate(zip(ran[rank], actions)) if a != b),
                         min(len(ran[rank]), len(actions)))
            sys.exit(f"FAIL: rank {rank} ran {' '.join(ran[rank][first:first + 6])} ... at action "
                     f"{first}, the schedule says {' '.join(actions[first:first + 6])} ...")
    print(f"{trace_path}: every rank ran its {csv_path} line's {sum(map(len, planned))} compute "
          "actions in order")


if __name__ == "__main__":
    main()
