#!/usr/bin/env bash
# cleave pipeline parallelism: every schedule (gpipe, 1f1b, interleaved v=2, zb1p, zbv) at pp 2
# and pp 4 (one rank per stage, 1 thread each) with m = 8 micro-batches of 1 sequence of 256
# tokens, on a GPT-2 of d_model 512, 8 heads, 8 layers (so a pp 4 stage's forward takes tens of
# milliseconds), fp32, vocabulary VOCAB (small by default: the LM head then costs about a third
# of a layer, and the stages are nearly even), 7 steps per run, the runs alternating, REPEATS
# rounds (about 3 minutes each). The runs (metrics.jsonl, logs and one Chrome trace of step 4 each, train.trace_step)
# are kept in PP_OUT (default runs/bench_pp); bench/pp_report.py reads them. Prints per pp and
# schedule, medians over the rounds:
#   tok/s: the median tokens/s of steps 2-7, and its ratio to 1f1b's at the same pp;
#   idle mean/max: metrics.jsonl's idle_fraction_per_rank (each rank's share of its step program
#     spent outside compute instructions: bubble, exposed transfers, and also the optimizer step
#     and the end-of-step sums), the median over steps 2-7 of the mean and of the max over ranks;
#   trace mean/max: the bubble from the trace, each rank's 1 - (sum of its action spans) /
#     makespan, the makespan being the latest action span end of any rank, each rank's times
#     counted from its own start of the step program (the ranks leave the previous step's
#     all-gather together); the trace's step-end spans (finish_grads, sum_loss, grad_norm, clip,
#     "update G", "gather_params G"), which follow the actions, are not in it;
#   F/B/W ms: the slowest rank's (largest F + B) cost of one micro-batch through its layers, the
#     sum over its stages of each stage's median span: F forward, B = I + W the whole backward
#     (the whole B span for gpipe/1f1b/interleaved, which do not split it; under activation
#     checkpointing with its recompute span R), W the weight half;
#   even: the closed form's bubble as a share of the step, b / (b + m (F + B)), b the bubble time
#     per rank below with the slowest rank's F, B, W: what every rank would idle were all ranks
#     that slow. The published forms (Narayanan et al. and Qi et al. quote b / (m (F + B)), the
#     bubble against the ideal time, e.g. (p - 1)/m for 1F1B):
#       gpipe, 1f1b: b = (p - 1)(F + B), a share of (p - 1)/(m + p - 1) (Huang et al., GPipe,
#         2019: O((p - 1)/(m + p - 1)); Narayanan et al., SC 2021, section 2.2.1: (p - 1)/m);
#       interleaved: b = (p - 1)(F + B)/v, a share of (p - 1)/(v m + p - 1) (Narayanan et al.,
#         SC 2021, section 2.2.2: (1/v)(p - 1)/m);
#       zb1p: b = (p - 1)(F + B - 2W) = (p - 1)(F + I - W) (Qi et al., Zero Bubble Pipeline
#         Parallelism, ICLR 2024, ZB-H1: (p - 1)(T_F + T_B - T_W), their T_B being our I; the
#         DualPipe README's ZB1P row, deepseek-ai/DualPipe, writes it with the whole backward);
#       zbv: b = (p - 1)(F + B - 2W)/2, ZB1P's form for one V stage, which costs half a rank's
#         F, B, W. No paper gives this order's bubble without DualPipe's F&B overlap: at
#         F = I = W it is the (p - 1)/2 units that the checker simulates for cleave's zbv (docs/
#         pipeline_parallel.md); the DualPipe README's DualPipeV row, (PP/2 - 1)(F&B + B - 3W)
#         per stage with PP = 2p, read with F&B = F + B, gives twice that, (p - 1) units; the
#         ZB-V paper's own order (Qi et al., Pipeline Parallelism with Controllable Memory, 2024;
#         sail-sg/zero-bubble-pipeline-parallelism) claims 0 at T_F = T_B = T_W;
#   theory mean, x theory: the same b with the slowest rank setting the makespan, m (F + B) + b,
#     and each rank idle for what its own m (F + B) leaves of it, the mean over ranks; and the
#     trace mean against it (target: within 10%);
#   sim mean, x sim: the traced order of every rank replayed with each stage's mean F, B, I, W
#     (so each rank's busy time is the measured one) and free transfers (the checker's timed
#     simulation, with measured per-stage costs), its
#     mean bubble over ranks, and the trace mean against it (target: within 10%), and their
#     difference in points of the step (-sim: a bubble of a few % is missed by 10% at 0.3 points);
#   lag ms: the traced makespan minus that of the same replay with every action's own measured
#     duration: the time the engine lost to stage-to-stage transfers and waking up;
#   imbal: the slowest rank's F + B over the fastest's (the first stage has the embedding, the
#     last the LM head and the loss);
#   step end ms: the slowest rank's step-end spans added up, and their share of the traced step
#     (the latest end of any span).
# At pp 4 the 4 ranks share this machine's 2 cores: a span's wall time then includes time the
# rank waited for a core, and the bubble of one rank is filled by another's work.
# Then the peak RSS of rank 0 (stage 0: the most micro-batches in flight) under gpipe and 1f1b
# against a baseline run with m = 2 (gpipe: two activation slots): gpipe keeps all m micro-
# batches' activations, 1f1b min(p, m) on rank 0. gpipe's growth over the baseline, over its m - 2
# extra slots, is one micro-batch's activations on stage 0 (per layer and sequence about
# 4 s (16 h + a + 4) bytes in fp32, docs/performance.md, plus the stage's stream buffers); 1f1b's
# growth is predicted as (min(p, m) - 2) such slots.
# Benchmarks are not CI gates. CLEAVE_BENCH_SMOKE=1 (bench/common.sh): vocab 256, d_model 64,
# 4 heads, 8 layers, sequences of 32 tokens, pp 2 only, 4 steps (step 3 traced), one round, the
# runs kept in the work folder unless PP_OUT is set.
# Usage: [CLEAVE_BENCH_SMOKE=1] [CLEAVE=build/cleave] [PP_OUT=runs/bench_pp] bench/pp.sh
#       [VOCAB=2048] [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
vocab=${1:-2048} repeats=${2:-3}
source bench/common.sh
keep=${PP_OUT:-runs/bench_pp} d_model=512 heads=8 seq=256 m=8 steps=7 trace=4
[ "$smoke" = 1 ] && keep=${PP_OUT:-$work/pp} vocab=256 repeats=1 d_model=64 heads=4 seq=32 steps=4 trace=3
/usr/bin/python3 bench/random_tokens.py "$work" "$vocab" 2000000

schedules="gpipe 1f1b interleaved zb1p zbv" pps="2 4"
[ "$smoke" = 1 ] && pps=2
mkdir -p "$keep"

pp_run() {  # name pp schedule micro-batches; the run folder is $keep/name
  local out=$keep/$1 pp=$2 schedule=$3 micro=$4
  rm -rf "$out"
  # One thread per rank: mpirun binds each of 2 ranks to a core; 4 ranks are not bound.
  mpirun --oversubscribe -np "$pp" "$cleave" train configs/gpt2_124m.toml --set data.dir="$work" \
    --set model.vocab_size="$vocab" --set model.d_model=$d_model --set model.n_heads=$heads \
    --set model.n_layers=8 --set train.seq_len=$seq --set train.micro_batch_size=1 \
    --set train.grad_accum_steps="$micro" --set train.dtype=fp32 --set train.threads=1 \
    --set train.steps=$steps --set train.log_interval=1 --set train.val_interval=0 \
    --set train.checkpoint_interval=-1 --set train.trace_step=$trace --set parallel.pp="$pp" \
    --set parallel.pp_schedule="$schedule" --set train.out_dir="$out" \
    > "$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
}
after_first() { grep '"tokens_per_s"' "$1/metrics.jsonl" | tail -n +2 |
  sed 's/.*"tokens_per_s":\([^,}]*\).*/\1/' | median; }

for round in $(seq "$repeats"); do
  line="round $round:"
  for pp in $pps; do
    for s in $schedules; do
      pp_run "pp$pp-$s-r$round" "$pp" "$s" $m
      line+=" pp$pp $s $(after_first "$keep/pp$pp-$s-r$round" | xargs printf %.0f) |"
    done
  done
  echo "$line" >&2
done
# m = 2: one micro-batch a step crashed before 2276e81 (docs/performance.md).
for pp in $pps; do pp_run "pp$pp-m2" "$pp" gpipe 2; done

echo "GPT-2 d_model $d_model, 8 layers, vocab $vocab, fp32, m = $m micro-batches of 1 x $seq tokens, 1 thread per rank ($cleave)"
/usr/bin/python3 bench/pp_report.py table "$keep" "${pps// /,}" "${schedules// /,}" "$repeats" $m
p=${pps##* }  # the largest pp
/usr/bin/python3 bench/pp_report.py svg "$keep/pp$p-zb1p-r1/trace_step_$trace.json" "$keep/timeline.svg" \
  "cleave zb1p, pp $p, m = $m: step $trace as traced (GPT-2 d_model $d_model, 8 layers, $p ranks on $(nproc) cores)"
echo "runs and traces kept in $keep (open a trace_step_$trace.json in ui.perfetto.dev; zb1p at pp $p drawn in $keep/timeline.svg)"
