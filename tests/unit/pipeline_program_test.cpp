// Lowering schedules to step programs (pipeline/program.h): every generated schedule over a grid,
// on a model of one unit per stage plus embeddings and head, gives a program whose instructions
// all name a slot that exists, that computes every (stage, micro-batch) once, reduces every
// unit's gradients once after its last write, and gathers before use under ZeRO-3.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "cleave/base/check.h"
#include "cleave/pipeline/program.h"

namespace cleave {
namespace {

// Rank r's units: for each of its chunks (stages in increasing order), the embeddings before
// stage 0's block and the head after the last stage's.
UnitLayout layout_of(const StageMap& stages, int rank, bool tied) {
  UnitLayout l;
  const int last = int(stages.rank_of_stage.size()) - 1;
  int embedding = -1;
  for (int s = 0; s <= last; ++s) {
    if (stages.rank_of_stage[size_t(s)] != rank) continue;
    std::vector<int> units;
    auto add = [&](bool weight_part) {
      const int u = int(l.uses.size());
      l.uses.push_back({u});
      l.has_weight_part.push_back(weight_part);
      units.push_back(u);
      return u;
    };
    if (s == 0) embedding = add(false);
    add(true);
    if (s == last) {
      const int head = add(false);
      if (tied && embedding >= 0) l.uses[size_t(head)].push_back(embedding);
      else if (tied) l.tied_units.push_back(head);
    }
    l.chunk_units.push_back(units);
  }
  if (tied && embedding >= 0 && l.tied_units.empty() && stages.rank_of_stage[size_t(last)] != rank)
    l.tied_units.push_back(embedding);
  return l;
}

TEST(PipelineProgram, EveryGeneratedScheduleLowers) {
  for (const std::string& name : schedule_names())
    for (int pp : {1, 2, 3, 4})
      for (int m : {1, 2, 3, 4, 8}) {
        const int v = name == "interleaved" || name == "zbv" ? 2 : 1;
        Schedule s;
        try {
          s = generate_schedule(name, pp, m, v);
        } catch (const Error&) {
          continue;  // m too small for this schedule: its own test covers the message
        }
        const ScheduleCheck c = check_schedule(s);
        for (bool zero3 : {false, true})
          for (int r = 0; r < pp; ++r) {
            const UnitLayout l = layout_of(c.stages, r, true);
            const Program p = lower_schedule(s, c.stages, r, l, {zero3, true, 1, {}});
            SCOPED_TRACE(name + " pp " + std::to_string(pp) + " m " + std::to_string(m) +
                         " rank " + std::to_string(r));
            std::map<std::tuple<int, int, int>, int> computed;  // (op, unit, mb)
            std::map<int, int> reduced;
            std::set<int> resident;
            for (const Instruction& i : p.instructions) {
              if (i.chunk >= 0) {
                ASSERT_GE(i.slot, 0) << to_string(i);
                ASSERT_LT(i.slot, p.slots[size_t(i.chunk)]) << to_string(i);
              }
              if (i.op == Op::gather) resident.insert(i.unit);
              if (i.op == Op::release) resident.erase(i.unit);
              if (is_compute(i.op)) {
                ++computed[{int(i.op == Op::forward), i.unit, i.mb}];
                if (zero3) {
                  for (int u : l.uses[size_t(i.unit)]) EXPECT_TRUE(resident.count(u)) << to_string(i);
                }
              }
              if (i.op == Op::reduce_grads) ++reduced[i.unit];
            }
            for (int u = 0; u < int(l.uses.size()); ++u) EXPECT_EQ(reduced[u], 1) << "unit " << u;
            for (int u = 0; u < int(l.uses.size()); ++u)
              for (int mb = 0; mb < m; ++mb) EXPECT_EQ((computed[{1, u, mb}]), 1);
            if (zero3) {
              EXPECT_TRUE(resident.empty()) << "units left gathered after the step";
            }
            // The step's end closes the program, after every gradient reduction.
            const std::vector<Instruction> end = step_end_instructions(1);
            ASSERT_GE(p.instructions.size(), end.size());
            for (size_t k = 0; k < end.size(); ++k) {
              const Instruction& i = p.instructions[p.instructions.size() - end.size() + k];
              EXPECT_EQ(to_string(i), to_string(end[k]));
            }
            for (size_t k = 0; k + end.size() < p.instructions.size(); ++k)
              EXPECT_FALSE(is_step_end(p.instructions[k].op)) << to_string(p.instructions[k]);
          }
      }
}

// MoE's routing statistics and FP8's scale update are the step's last instructions when asked
// for, after every group's update, and absent otherwise.
TEST(PipelineProgram, StepEndHoldsMoeAndFp8Work) {
  const Schedule s = generate_schedule("1f1b", 2, 4, 1);
  const ScheduleCheck c = check_schedule(s);
  const UnitLayout l = layout_of(c.stages, 0, true);
  auto ops = [&](bool moe, bool fp8) {
    LoweringOptions options{false, true, 2, {}};
    options.moe_stats = moe;
    options.fp8_scales = fp8;
    std::vector<std::string> out;
    for (const Instruction& i : lower_schedule(s, c.stages, 0, l, options).instructions)
      if (is_step_end(i.op)) out.push_back(to_string(i));
    return out;
  };
  const std::vector<std::string> plain = {"finish_grads",   "sum_loss",
                                          "grad_norm",      "clip",
                                          "update group 0", "gather_params group 0",
                                          "update group 1", "gather_params group 1"};
  EXPECT_EQ(ops(false, false), plain);
  std::vector<std::string> both = plain;
  both.push_back("moe_stats");
  both.push_back("fp8_scales");
  EXPECT_EQ(ops(true, true), both);
  both.erase(both.end() - 2);
  EXPECT_EQ(ops(false, true), both);
}

}  // namespace
}  // namespace cleave
