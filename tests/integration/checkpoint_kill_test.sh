#!/usr/bin/env bash
# kill -9 of a rank in the middle of a save (docs/checkpoints.md): the checkpoints before it are
# untouched, the one it was writing never appears under its final name, and --resume latest
# continues from the previous one with the uninterrupted run's losses, bit for bit (the same
# layout). Two ranks, pp 2, so that each writes a file of every checkpoint; one every 5 steps.
#
# "In the middle", deterministically: the run stops after step 10 and resumes with rank 1 under
# strace, which holds every fsync rank 1 makes for 5 minutes (strace's syscall delay injection: no
# hook in cleave). Rank 1's first fsync is that of its state file in the save of step 15 (loading
# writes nothing), so once that file is in the temporary folder the save can neither complete nor
# be abandoned: rank 1 is killed there, rank 0 waiting for it in the same save.
set -euo pipefail
cleave=$1 src=$2 data=$3
source "$src/tests/integration/layouts.sh"
command -v strace > /dev/null || { echo "FAIL: strace is not installed (setup.sh installs it)"; exit 1; }
common=(--set data.dir="$data" --set train.steps=20 --set train.log_interval=1
        --set train.val_interval=10 --set train.checkpoint_interval=5 --set train.keep_checkpoints=10
        --set train.threads=1 --set parallel.comm_timeout_s=60 --set parallel.pp=2)
run ref 2
run killed 2 --exit-after 10
ls "$work/killed/step_00000005" "$work/killed/step_00000010" > /dev/null
saved() { (cd "$work/killed" && md5sum step_00000005/* step_00000010/*); }
before=$(saved)

job=
fail() {
  echo "FAIL: $*"
  [ -n "$job" ] && kill -KILL "$job" 2> /dev/null
  exit 1
}
args=(train "$cfg" "${common[@]}" --set train.out_dir="$work/killed" --resume latest)
# Rank 1 writes its pid (the shell's, which exec keeps for cleave) and strace's before it runs.
mpirun --oversubscribe -np 1 "$cleave" "${args[@]}" : \
  -np 1 strace -f -o /dev/null -e trace=fsync -e inject=fsync:delay_enter=300000000 \
  sh -c 'echo $$ $PPID > "$0"; exec "$@"' "$work/rank1.pid" "$cleave" "${args[@]}" \
  > "$work/killed-mid-save.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  ls "$work"/killed/step_00000015.tmp-*/model-rank00001.safetensors > /dev/null 2>&1 && break
  sleep 0.1
done
ls "$work"/killed/step_00000015.tmp-*/model-rank00001.safetensors > /dev/null 2>&1 \
  || { tail -20 "$work/killed-mid-save.log"; fail "rank 1 never began writing step 15's checkpoint"; }
read -r rank1 tracer < "$work/rank1.pid"
kill -KILL "$rank1"
# strace would wait out its delay on the dead rank before it exits and mpirun sees the rank gone.
kill -KILL "$tracer"
rc=0
wait "$job" || rc=$?
job=
[ "$rc" -ne 0 ] || fail "the job whose rank was killed exited with 0"
[ ! -e "$work/killed/step_00000015" ] || fail "the save cut short appeared as step_00000015"
[ "$(saved)" = "$before" ] || fail "the earlier checkpoints changed"

run killed 2 --resume latest
grep -q "^resumed at step 10$" "$work/killed.log" || fail "the rerun did not resume at step 10"
! grep -q "skipping" "$work/killed.log" || fail "the rerun skipped a checkpoint"
# metrics.jsonl holds steps 11 to 15 twice, the killed run's and the rerun's: each step's last.
last_numbers() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    last[(r["step"], "val_loss" in r)] = r
for key in sorted(last):
    r = last[key]
    print(*(r[k] for k in ("loss", "val_loss", "grad_norm") if k in r))
' "$1/metrics.jsonl"
}
diff <(last_numbers "$work/ref") <(last_numbers "$work/killed") > /dev/null \
  || fail "the resumed run logged other losses than the uninterrupted one"
for f in "$work"/ref/step_00000020/*.safetensors; do
  cmp -s "$f" "$work/killed/step_00000020/$(basename "$f")" || fail "step 20's $(basename "$f") differs"
done
echo "killed: rank 1 killed in step 15's save (job exit $rc); steps 5 and 10 untouched; resumed" \
     "from step 10 with the reference's losses and final checkpoint"
