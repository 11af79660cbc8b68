// The step-time simulation: on every pipeline schedule it finds the schedule checker's makespan
// and timeline (the same bubble, from the lowered programs); gradient reductions hide under backward until
// they are longer than it; a prefetched gather waits only for what is left of its transfer; and
// the planner's prediction adds up: products at the table's rate, links by host, MFU and tokens/s
// from the step.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "cleave/kernels/linear_fp8.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/routing.h"
#include "cleave/plan/step_time.h"

namespace cleave {
namespace {

double unit_cost(Op op) {
  switch (op) {
    case Op::forward: return 1;
    case Op::backward: return 2;
    case Op::backward_input: return 1;
    case Op::backward_weight: return 1;
    default: return 0;
  }
}

TEST(PlanStepTime, PipelineMakespanIsTheScheduleCheckers) {
  struct Case {
    const char* name;
    int virtual_chunks;
  };
  for (const Case& c : {Case{"gpipe", 1}, Case{"1f1b", 1}, Case{"interleaved", 2},
                        Case{"zb1p", 1}, Case{"zbv", 2}}) {
    const int pp = 4, m = 8;
    const Schedule s = generate_schedule(c.name, pp, m, c.virtual_chunks);
    const ScheduleCheck check = check_schedule(s);
    // One unit per chunk, every unit with a weight half.
    UnitLayout layout;
    for (int k = 0; k < check.stages.chunks_per_rank; ++k) {
      layout.chunk_units.push_back({k});
      layout.uses.push_back({k});
      layout.has_weight_part.push_back(true);
    }
    std::vector<Program> programs;
    for (int r = 0; r < pp; ++r)
      programs.push_back(lower_schedule(s, check.stages, r, layout, {}));
    const std::vector<RankTime> t = simulate_programs(programs, [&](int r, size_t i) {
      InstructionCost cost;
      cost.compute = unit_cost(programs[size_t(r)].instructions[i].op);
      return cost;
    });
    double makespan = 0;
    for (const RankTime& rt : t) makespan = std::max(makespan, rt.end);
    EXPECT_DOUBLE_EQ(makespan, check.makespan) << c.name;
    // Each rank computes 3 units per micro-batch and chunk; the rest of the step it waits.
    for (const RankTime& rt : t)
      EXPECT_DOUBLE_EQ(rt.gemm, 3.0 * m * check.stages.chunks_per_rank) << c.name;
    EXPECT_GT(t[0].pipeline_wait, 0) << c.name;
    // The timeline: each rank's spans are the checker's compute actions, in order, at its times.
    for (int r = 0; r < pp; ++r) {
      std::vector<std::string> want;
      std::vector<double> start, end;
      for (size_t i = 0; i < s.ranks[size_t(r)].size(); ++i)
        if (is_compute(s.ranks[size_t(r)][i].type)) {
          want.push_back(to_string(s.ranks[size_t(r)][i]));
          start.push_back(check.start[size_t(r)][i]);
          end.push_back(check.end[size_t(r)][i]);
        }
      const std::vector<RankTime::Span>& got = t[size_t(r)].spans;
      ASSERT_EQ(got.size(), want.size()) << c.name << " rank " << r;
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].action, want[k]) << c.name << " rank " << r;
        EXPECT_DOUBLE_EQ(got[k].start, start[k]) << c.name << " " << want[k];
        EXPECT_DOUBLE_EQ(got[k].end, end[k]) << c.name << " " << want[k];
      }
    }
  }
}

// forward 0, 1; backward 1 then its reduction posted; backward 0 and its reduction; the step's end.
Program data_parallel_program() {
  Program p;
  p.instructions = {{Op::forward, 0},   {Op::forward, 1},       {Op::backward, 1},
                    {Op::reduce_grads, 1}, {Op::backward, 0},   {Op::reduce_grads, 0},
                    {Op::finish_grads}};
  return p;
}

double end_with_reduction(double reduce, std::map<std::string, double>* comm = nullptr) {
  const Program p = data_parallel_program();
  const std::vector<RankTime> t = simulate_programs({p}, [&](int, size_t i) {
    InstructionCost c;
    const Op op = p.instructions[i].op;
    c.compute = unit_cost(op);
    if (op == Op::reduce_grads) c.overlapped.push_back({"dp", reduce});
    return c;
  });
  if (comm) *comm = t[0].comm;
  return t[0].end;
}

TEST(PlanStepTime, GradientReductionsOverlapBackward) {
  // F F B | B: the first reduction (posted at 4) runs under the second backward (4 to 6); the last
  // one is exposed.
  std::map<std::string, double> comm;
  EXPECT_DOUBLE_EQ(end_with_reduction(1.5, &comm), 6 + 1.5);
  EXPECT_DOUBLE_EQ(comm["dp"], 1.5);
  // Longer than the backward beside it: the stream runs 4 to 7, then 7 to 10.
  EXPECT_DOUBLE_EQ(end_with_reduction(3, &comm), 10);
  EXPECT_DOUBLE_EQ(comm["dp"], 4);
  EXPECT_DOUBLE_EQ(end_with_reduction(0), 6);
}

TEST(PlanStepTime, GatherWaitsForItsPrefetch) {
  Program p;
  p.instructions = {{Op::gather, 0}, {Op::prefetch, 1}, {Op::forward, 0}, {Op::gather, 1},
                    {Op::forward, 1}};
  auto end = [&](double transfer) {
    return simulate_programs({p}, [&](int, size_t i) {
             InstructionCost c;
             const Instruction& in = p.instructions[i];
             c.compute = unit_cost(in.op);
             if (in.op == Op::gather && in.unit == 0) c.blocking.push_back({"dp_shard", transfer});
             if (in.op == Op::prefetch) c.overlapped.push_back({"dp_shard", transfer});
             return c;
           })[0]
        .end;
  };
  // Unit 0's gather blocks; unit 1's runs under unit 0's forward and is waited for where it is
  // used only past it.
  EXPECT_DOUBLE_EQ(end(0.5), 0.5 + 1 + 1);
  EXPECT_DOUBLE_EQ(end(3), 3 + 3 + 1);
}

ModelConfig small_gpt2() {
  ModelConfig m;
  m.family = Family::gpt2;
  m.vocab_size = 512;
  m.d_model = 128;
  m.n_layers = 4;
  m.n_heads = 4;
  m.n_kv_heads = 4;
  m.ffn_hidden = 512;
  m.max_seq_len = 128;
  return m;
}

// One rate for every product (one grid point: every shape clamps to it), memory and links as
// given.
Cluster flat_cluster(int devices_per_host, double inter_gbps, double slowdown = 0) {
  Cluster c;
  c.name = "flat";
  c.devices_per_host = devices_per_host;
  c.memory_gib = 16;
  c.memory_gbps = 10;
  c.peak_gflops[Precision::fp32] = 100;
  c.gemm[Precision::fp32] = GemmTable({{64, 64, 64, 50}}, "flat");
  LinkCosts intra, inter;
  for (Collective k : kCollectives) {
    intra[size_t(k)] = {{1.0, 10.0}};
    inter[size_t(k)] = {{10.0, inter_gbps}};
  }
  c.links[size_t(LinkClass::intra_host)] = intra;
  c.links[size_t(LinkClass::inter_host)] = inter;
  c.compute_slowdown = {slowdown, slowdown};
  return c;
}

struct Planned {
  StepPrediction prediction;
  std::vector<StepWork> work;
};

Planned plan(const ParallelConfig& parallel, int world, const Cluster& cluster) {
  const ModelConfig model = small_gpt2();
  StepOptions step;
  step.seq_len = 128;
  step.micro_batch_size = 8;
  const Layout layout = plan_layout(model, parallel, step, world);
  Planned p;
  for (int r = 0; r < layout.mesh.degree(Axis::pp); ++r)
    p.work.push_back(step_work(model, parallel, step, layout, r));
  p.prediction = predict_step(p.work, layout, cluster, model, step);
  return p;
}

TEST(PlanStepTime, OneRankIsItsWorkAtTheClustersRates) {
  const Cluster cluster = flat_cluster(1, 1);
  const Planned p = plan({}, 1, cluster);
  const StepPrediction& s = p.prediction;
  ASSERT_EQ(s.ranks.size(), 1u);
  double flops = 0, activations = 0, streamed = 0, packed = 0;
  for (const auto& w : p.work[0].work) {
    flops += w->flops();
    activations += w->elementwise_bytes;
    streamed += w->stream_bytes;
    packed += w->pack_bytes;
    EXPECT_TRUE(w->comms.empty());
  }
  EXPECT_GT(activations, 0);
  EXPECT_GT(streamed, 0);
  // Without measured rates: the element-wise kernels and the optimizer's streams at the streaming
  // bandwidth, packing free (the copies are this CPU's layouts, not the cluster's).
  const double bytes = activations + streamed;
  EXPECT_NEAR(s.ranks[0].gemm + s.ranks[0].attention, flops / 50e9, 1e-12);
  EXPECT_NEAR(s.ranks[0].elementwise, bytes / 10e9, 1e-12);
  EXPECT_DOUBLE_EQ(s.step_seconds, s.ranks[0].end);
  EXPECT_NEAR(s.step_seconds, flops / 50e9 + bytes / 10e9, 1e-12);
  // Measured rates of the element-wise kernels and of packing stand in where the cluster gives
  // them; the optimizer's streams keep the streaming bandwidth.
  Cluster measured = cluster;
  measured.elementwise_gbps = 4;
  measured.pack_gbps = 2;
  const Planned with_rates = plan({}, 1, measured);
  const RankTime& m = with_rates.prediction.ranks[0];
  EXPECT_NEAR(m.elementwise, activations / 4e9 + streamed / 10e9 + packed / 2e9, 1e-12);
  EXPECT_DOUBLE_EQ(s.tokens_per_second, 8 * 128 / s.step_seconds);
  EXPECT_DOUBLE_EQ(s.mfu, s.model_flops / s.step_seconds / 100e9);
  // The step's FLOPs as the trainer counts them are the products' and attention's within the
  // head's padding and the causal half.
  EXPECT_NEAR(p.work[0].model_flops / s.model_flops, 1.0, 0.02);
  // Attention takes the table its kernels run at: bf16's (here 4 times fp32's) when the cluster
  // says so; the linears' products stay at theirs.
  Cluster tensor_cores = cluster;
  tensor_cores.attention_dtype = Precision::bf16;
  tensor_cores.peak_gflops[Precision::bf16] = 400;
  tensor_cores.gemm[Precision::bf16] = GemmTable({{64, 64, 64, 200}}, "flat");
  const Planned on_tensor_cores = plan({}, 1, tensor_cores);
  const RankTime& t = on_tensor_cores.prediction.ranks[0];
  EXPECT_GT(s.ranks[0].attention, 0);
  EXPECT_NEAR(t.attention, s.ranks[0].attention / 4, 1e-12);
  EXPECT_DOUBLE_EQ(t.gemm, s.ranks[0].gemm);
  // Measured attention rates replace the table: every sequence here has 128 keys, so the rate
  // at 128, between the points at 64 and 256, is their geometric mean.
  Cluster rates = cluster;
  rates.attention = {{64, 10}, {256, 40}};
  const Planned with_attention = plan({}, 1, rates);
  const RankTime& r = with_attention.prediction.ranks[0];
  EXPECT_NEAR(r.attention, s.ranks[0].attention * 50 / 20, 1e-12);
  EXPECT_DOUBLE_EQ(r.gemm, s.ranks[0].gemm);
}

// Where a step packs its weights' copies and how much the optimizer streams, by ZeRO stage: the
// update packs the weights it writes whole; ZeRO-1/2's next products repack the gathered ones
// (costed at the gather); ZeRO-3's every product pass after a gather packs its own copy. Below
// ZeRO-2 the whole gradient buffer is zeroed and read by the norm; from ZeRO-2 on, the shard.
TEST(PlanStepTime, PackingAndTheOptimizersStreamsFollowTheZeroStage) {
  const ModelConfig model = small_gpt2();
  StepOptions step;
  step.seq_len = 128;
  step.micro_batch_size = 8;
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(zero));
    ParallelConfig parallel;
    parallel.dp_shard = 2;
    parallel.zero_stage = zero;
    const Layout layout = plan_layout(model, parallel, step, 2);
    const StepWork work = step_work(model, parallel, step, layout, 0);
    const int64_t rows = 4 * 128;  // the rank's micro-batch
    double copies = 0, forward_copies = 0, backward_copies = 0;
    for (const LinearGemm::WeightCopies& c : weight_copies(*work.model, rows, true)) {
      copies += double(c.total());
      forward_copies += double(c.forward + c.rounded);
      backward_copies += double(c.backward);
    }
    const double n = double(work.model->params().total());
    std::map<Op, double> packed, streamed;
    for (size_t i = 0; i < work.work.size(); ++i) {
      packed[work.program.instructions[i].op] += work.work[i]->pack_bytes;
      streamed[work.program.instructions[i].op] += work.work[i]->stream_bytes;
    }
    if (zero == 0) EXPECT_DOUBLE_EQ(packed[Op::update], copies);
    else EXPECT_DOUBLE_EQ(packed[Op::update], 0);
    if (zero == 1 || zero == 2) EXPECT_DOUBLE_EQ(packed[Op::gather_params], copies);
    else EXPECT_DOUBLE_EQ(packed[Op::gather_params], 0);
    if (zero == 3) {
      EXPECT_DOUBLE_EQ(packed[Op::forward], forward_copies);
      EXPECT_DOUBLE_EQ(packed[Op::backward], backward_copies);
    } else {
      EXPECT_DOUBLE_EQ(packed[Op::forward] + packed[Op::backward], 0);
    }
    const double updated = zero == 0 ? n : n / 2;
    EXPECT_DOUBLE_EQ(streamed[Op::update], 4 * (7 * updated + (zero < 2 ? n : 0)));
    EXPECT_DOUBLE_EQ(streamed[Op::grad_norm], 4 * (zero < 2 ? n : n / 2));
    // ZeRO-2/3's released gradients fault in again once a step, where backward first writes
    // them; ZeRO-3's parameters at every gather. Below ZeRO-2 nothing is released.
    std::map<Op, double> refaulted;
    for (size_t i = 0; i < work.work.size(); ++i) {
      refaulted[work.program.instructions[i].op] += work.work[i]->refault_bytes;
      EXPECT_FALSE(work.work[i]->refault_huge);  // this model's buffers are under 64 MiB
    }
    EXPECT_DOUBLE_EQ(refaulted[Op::backward], zero >= 2 ? 4 * n : 0);
    double gathered = 0;
    for (const auto& [op, bytes] : refaulted)
      if (op != Op::backward) gathered += bytes;
    EXPECT_EQ(gathered > 0, zero == 3);
    if (zero == 3) {
      EXPECT_DOUBLE_EQ(gathered, refaulted[Op::gather] + refaulted[Op::prefetch]);
    }
  }
  // Under ep a rank updates and packs 1 / ep of the experts (their fp16 roundings), once.
  ModelConfig moe = model;
  moe.moe_experts = 4;
  moe.moe_top_k = 2;
  moe.moe_ffn_hidden = 256;
  StepOptions fp16 = step;
  fp16.dtype = Precision::fp16;
  for (int zero : {0, 1}) {
    SCOPED_TRACE("MoE, ZeRO-" + std::to_string(zero));
    std::map<int, double> packed_at;  // by ep
    for (int ep : {1, 2}) {
      ParallelConfig parallel;
      parallel.dp_shard = 2;
      parallel.ep = ep;
      parallel.zero_stage = zero;
      const Layout layout = plan_layout(moe, parallel, fp16, 2);
      const StepWork work = step_work(moe, parallel, fp16, layout, 0);
      double copies = 0, experts = 0;
      const std::vector<LinearGemm::WeightCopies> by_group =
          weight_copies(*work.model, 4 * 128, true, work.group_share);
      for (int g = 0; g < int(by_group.size()); ++g) {
        copies += double(by_group[size_t(g)].total());
        if (work.model->params().group_name(g) == "experts")
          experts += double(by_group[size_t(g)].total());
      }
      ASSERT_GT(experts, 0);
      double packed = 0;
      for (size_t i = 0; i < work.work.size(); ++i) packed += work.work[i]->pack_bytes;
      EXPECT_DOUBLE_EQ(packed, copies);
      packed_at[ep] = packed;
      if (ep == 2) {
        EXPECT_NEAR(packed_at[1] - packed, experts, 1e-6 * experts);
      }
    }
  }

  // A cluster without refault rates costs none; with them, the bytes at the rate.
  ParallelConfig zero2;
  zero2.dp_shard = 2;
  zero2.zero_stage = 2;
  Cluster faults = flat_cluster(2, 1);
  const Planned free = plan(zero2, 2, faults);
  faults.refault_gbps = 0.5;
  faults.refault_huge_gbps = 1e-3;  // not this model's: its buffers are under 64 MiB
  const Planned faulted = plan(zero2, 2, faults);
  double refault = 0;
  for (const auto& w : faulted.work[0].work) refault += w->refault_bytes;
  EXPECT_NEAR(faulted.prediction.ranks[0].elementwise - free.prediction.ranks[0].elementwise,
              refault / 0.5e9, 1e-12);
}

TEST(PlanStepTime, TensorParallelAcrossHostsTakesTheSlowerLink) {
  ParallelConfig tp2;
  tp2.tp = 2;
  const Planned inside = plan(tp2, 2, flat_cluster(2, 1));
  const Planned across = plan(tp2, 2, flat_cluster(1, 1));
  const double in = inside.prediction.ranks[0].comm.at("tp");
  const double out = across.prediction.ranks[0].comm.at("tp");
  EXPECT_GT(in, 0);
  EXPECT_GT(out, 5 * in);  // beta 1 GB/s against 10, alpha 10 us against 1
  EXPECT_GT(across.prediction.step_seconds, inside.prediction.step_seconds);
}

TEST(PlanStepTime, CollectivesBesideComputeSlowItByTheLinksFactor) {
  ParallelConfig ddp;
  ddp.dp_shard = 2;
  // Every gradient reduction's time, as the cluster's model gives it.
  const Planned free = plan(ddp, 2, flat_cluster(2, 1, 0));
  double reductions = 0;
  for (const auto& w : free.work[0].work)
    for (const CommCall& c : w->comms) {
      ASSERT_TRUE(c.overlapped);
      reductions +=
          collective_seconds(flat_cluster(2, 1), c.kind, LinkClass::intra_host, c.bytes, c.ranks);
    }
  ASSERT_GT(reductions, 0);
  for (double slowdown : {0.5, 1.5}) {
    const Planned slowed = plan(ddp, 2, flat_cluster(2, 1, slowdown));
    // Each stalls the rank where it is posted; the wait at the end for the last of them shrinks
    // by at most what the free run waited there.
    const double grown = slowed.prediction.step_seconds - free.prediction.step_seconds;
    EXPECT_LE(grown, slowdown * reductions * (1 + 1e-9));
    EXPECT_GE(grown, slowdown * reductions - free.prediction.ranks[0].comm.at("dp") - 1e-12);
    EXPECT_GT(grown, 0.5 * slowdown * reductions);
  }
}

// Ranks that wait for each other wait for the slowest: compute_imbalance stretches every rank's
// compute on more than one rank, and shows as its own part of the step; one rank waits for none.
TEST(PlanStepTime, ImbalanceStretchesComputeOnMoreThanOneRank) {
  Cluster uneven = flat_cluster(2, 1);
  uneven.compute_imbalance = 1.25;
  const Planned alone = plan({}, 1, flat_cluster(2, 1));
  const Planned alone_uneven = plan({}, 1, uneven);
  EXPECT_DOUBLE_EQ(alone_uneven.prediction.step_seconds, alone.prediction.step_seconds);
  EXPECT_EQ(alone_uneven.prediction.ranks[0].imbalance, 0);
  ParallelConfig tp2;
  tp2.tp = 2;
  const Planned even = plan(tp2, 2, flat_cluster(2, 1));
  const Planned stretched = plan(tp2, 2, uneven);
  const RankTime& e = even.prediction.ranks[0];
  const RankTime& s = stretched.prediction.ranks[0];
  const double compute = e.gemm + e.attention + e.elementwise;
  EXPECT_EQ(e.imbalance, 0);
  EXPECT_NEAR(s.imbalance, 0.25 * compute, 1e-12);
  EXPECT_DOUBLE_EQ(s.gemm, e.gemm);
  // tp's collectives block: nothing overlaps the longer compute, so the step grows by all of it.
  EXPECT_NEAR(stretched.prediction.step_seconds - even.prediction.step_seconds, s.imbalance, 1e-12);
}

// Under ep with a measured routing every rank waits, at the all-to-all after the experts, for
// the busiest rank's rows: rank 0 holds experts 0-1, which get 0.6 of the choices in one record
// and 0.3 in the other (0.45 on the mean), while the busiest rank gets 0.6 and 0.7: rank 0's
// expert products wait for 0.65 / 0.45 - 1 of their rows more, costed as products in the
// imbalance column and not counted as its FLOPs.
TEST(PlanStepTime, EpRanksWaitForTheBusiestRanksExperts) {
  ModelConfig moe = small_gpt2();
  moe.moe_experts = 4;
  moe.moe_top_k = 2;
  moe.moe_ffn_hidden = 256;
  StepOptions step;
  step.seq_len = 128;
  step.micro_batch_size = 8;
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  parallel.ep = 2;
  ExpertRouting routing;
  routing.records.resize(2);
  for (int l = 0; l < moe.n_layers; ++l) {
    if (!moe.is_moe_layer(l)) continue;
    routing.records[0][l] = {0.4, 0.2, 0.2, 0.2};
    routing.records[1][l] = {0.1, 0.2, 0.3, 0.4};
    routing.share[l] = {0.25, 0.2, 0.25, 0.3};
  }
  const Layout layout = plan_layout(moe, parallel, step, 2);
  const std::vector<StepWork> work = {step_work(moe, parallel, step, layout, 0, &routing, 0)};
  // The experts' products: fc (d_model -> 256) and proj (256 -> d_model), forward.
  auto expert = [&](const GemmCall& g) {
    return (g.n == 256 && g.k == moe.d_model) || (g.n == moe.d_model && g.k == 256);
  };
  double own = 0, waited = 0, waited_seconds = 0;
  for (size_t i = 0; i < work[0].work.size(); ++i) {
    const InstructionWork& w = *work[0].work[i];
    for (const GemmCall& g : w.waited) waited_seconds += 2.0 * g.m * g.n * g.k * g.count / 50e9;
    if (work[0].program.instructions[i].op != Op::forward) continue;
    for (const GemmCall& g : w.gemms) own += expert(g) ? double(g.m) : 0;
    for (const GemmCall& g : w.waited) {
      EXPECT_TRUE(expert(g)) << g.m << " x " << g.n << " x " << g.k;
      waited += double(g.m);
    }
  }
  ASSERT_GT(own, 0);
  EXPECT_NEAR(waited / own, 0.65 / 0.45 - 1, 0.01);
  const StepPrediction p = predict_step(work, layout, flat_cluster(2, 1), moe, step);
  EXPECT_GT(waited_seconds, 0);
  EXPECT_NEAR(p.ranks[0].imbalance, waited_seconds, 1e-12);
  // Balanced routing (no records): nobody waits.
  const StepWork balanced = step_work(moe, parallel, step, layout, 0);
  for (const auto& w : balanced.work) EXPECT_TRUE(w->waited.empty());
}

// FP8 products quantise their operands beside the products (kernels/linear_fp8.h): each block's
// four linears add their traffic to every micro-batch's passes, and their weights' images as
// this CPU's products make them (LinearGemm::fp8_images: once a step, and at every product of a
// role that reads W as it lies), at fp8_gbps (absent: the element-wise rate); bf16's products, the same shapes, add
// none, and the activations' element-wise bytes are the same. A split backward (zb1p, over 2
// stages) defers the weight gradients, which quantise dy again.
TEST(PlanStepTime, Fp8LinearsAddTheirQuantisationToThePasses) {
  const ModelConfig model = small_gpt2();
  const int64_t d = model.d_model, h = model.ffn_hidden;
  const std::vector<std::pair<int64_t, int64_t>> linears = {{d, 3 * d}, {d, d}, {d, h}, {h, d}};
  Cluster cluster = flat_cluster(2, 1);
  cluster.gemm[Precision::bf16] = GemmTable({{64, 64, 64, 200}}, "flat");
  for (kernels::Fp8Recipe recipe : {kernels::Fp8Recipe::delayed, kernels::Fp8Recipe::mxfp8})
    for (bool split : {false, true}) {
      SCOPED_TRACE(std::to_string(int(recipe)) + (split ? ", zb1p" : ""));
      StepOptions step;
      step.seq_len = 128;
      step.micro_batch_size = 4;
      step.grad_accum_steps = 2;
      step.fp8.recipe = recipe;
      ParallelConfig parallel;
      if (split) {
        parallel.pp = 2;
        parallel.pp_schedule = "zb1p";
      }
      struct Planned {
        double elementwise = 0, fp8 = 0;
        StepPrediction at_elementwise, at_fp8_rate;
      };
      auto planned = [&](Precision dtype) {
        step.dtype = dtype;
        const Layout layout = plan_layout(model, parallel, step, parallel.pp);
        std::vector<StepWork> work;
        Planned p;
        for (int r = 0; r < parallel.pp; ++r) {
          work.push_back(step_work(model, parallel, step, layout, r));
          for (const auto& w : work.back().work) p.elementwise += w->elementwise_bytes, p.fp8 += w->fp8_bytes;
        }
        p.at_elementwise = predict_step(work, layout, cluster, model, step);
        Cluster rated = cluster;
        rated.fp8_gbps = 2;
        p.at_fp8_rate = predict_step(work, layout, rated, model, step);
        return p;
      };
      const Planned bf16 = planned(Precision::bf16), fp8 = planned(Precision::fp8);
      EXPECT_DOUBLE_EQ(bf16.fp8, 0);
      EXPECT_DOUBLE_EQ(fp8.elementwise, bf16.elementwise);
      double expected = 0;
      for (auto [in, out] : linears) {
        kernels::Fp8LinearUse use;
        use.bias = true;
        use.dy_kept = !split;
        LinearGemm g(int(in), int(out), Precision::fp8);
        Fp8Settings settings;
        settings.recipe = recipe;
        g.set_fp8(settings);
        use.images = g.fp8_images(4 * 128);
        const kernels::Fp8Traffic t = kernels::fp8_traffic(recipe, 4 * 128, in, out, use);
        EXPECT_GT(t.forward, 0);
        EXPECT_GT(t.backward_input, 0);
        EXPECT_GT(t.backward_weight, 0);
        EXPECT_GT(t.weight_images, 0);
        expected += model.n_layers *
                    (step.grad_accum_steps * (t.forward + t.backward_input + t.backward_weight) +
                     t.weight_images);
      }
      EXPECT_NEAR(fp8.fp8, expected, 1e-6 * expected);
      double at_elementwise = 0, at_fp8_rate = 0;
      for (size_t r = 0; r < fp8.at_elementwise.ranks.size(); ++r) {
        at_elementwise += fp8.at_elementwise.ranks[r].elementwise - bf16.at_elementwise.ranks[r].elementwise;
        at_fp8_rate += fp8.at_fp8_rate.ranks[r].elementwise - bf16.at_fp8_rate.ranks[r].elementwise;
        EXPECT_DOUBLE_EQ(fp8.at_elementwise.ranks[r].gemm, bf16.at_elementwise.ranks[r].gemm);
      }
      EXPECT_NEAR(at_elementwise, expected / 10e9, 1e-12);
      EXPECT_NEAR(at_fp8_rate, expected / 2e9, 1e-12);
    }
}

}  // namespace
}  // namespace cleave
