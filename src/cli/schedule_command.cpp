// `cleave schedule --pp P --microbatches M --schedule S [--virtual V]` or `cleave schedule --load
// FILE`, either with [--csv OUT] [--trace OUT.json]: builds or loads a pipeline schedule, checks
// it, and prints its simulated timeline, the step's end that follows it, the activations each rank
// holds and the bubble (docs/pipeline_parallel.md). Runs on one rank, no MPI.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cleave/pipeline/program.h"
#include "cleave/pipeline/schedule.h"
#include "cli/args.h"

namespace cleave::cli {

namespace {

const char* kUsage =
    " (usage: cleave schedule --pp P --microbatches M --schedule NAME [--virtual V] or --load "
    "FILE, then [--csv OUT] [--trace OUT.json])";

Schedule build(const Args& a) {
  if (a.has("--load")) {
    for (const char* o : {"--pp", "--microbatches", "--schedule", "--virtual"})
      if (a.has(o))
        throw Error(std::string("cleave schedule: --load reads the schedule from its file; ") + o +
                    " does not apply" + kUsage);
    return load_schedule_csv(a.get("--load", ""));
  }
  for (const char* o : {"--pp", "--microbatches", "--schedule"})
    if (!a.has(o)) throw Error(std::string("cleave schedule: ") + o + " is required" + kUsage);
  const std::string name = a.get("--schedule", "");
  // The schedules with several chunks per rank take 2 unless told.
  const int chunks = name == "interleaved" || name == "zbv" ? 2 : 1;
  const int v = int(a.integer("--virtual", chunks, INT32_MIN, INT32_MAX));
  // generate_schedule names what it refuses of the numbers themselves.
  return generate_schedule(name, int(a.integer("--pp", 0, INT32_MIN, INT32_MAX)),
                           int(a.integer("--microbatches", 0, INT32_MIN, INT32_MAX)), v);
}

}  // namespace

int schedule(int argc, char** argv) {
  const Args a = Args::parse("schedule", argc, argv,
                             {"--pp", "--microbatches", "--schedule", "--virtual", "--load",
                              "--csv", "--trace"});
  if (!a.positional.empty())
    throw Error("cleave schedule: unexpected argument '" + a.positional[0] + "'" + kUsage);
  const Schedule s = build(a);
  ScheduleCheck c;
  try {
    c = check_schedule(s);
  } catch (const Error& e) {
    std::fprintf(stderr, "cleave schedule: %s\n", e.what());
    return 1;
  }
  // Costs per rank's share of the model: one micro-batch's F, I and W through all of a rank's
  // layers take 1 each, so a stage of a rank with v chunks takes 1/v and makespans compare across
  // schedules.
  const int v = c.stages.chunks_per_rank;
  const double unit = 1.0 / v;
  c = check_schedule(s, ActionCosts{unit, unit, unit});

  std::printf("schedule %s: pp %d, %d stages (%d per rank), %d micro-batches\n", s.name.c_str(),
              s.pp, s.n_stages, v, s.microbatches);
  std::printf("time unit: one micro-batch's F, I or W through a rank's layers (B = I + W = 2)"
              "%s\n\n",
              v > 1 ? "; one stage takes 1/chunks of that" : "");
  std::fputs(timeline_text(s, c).c_str(), stdout);
  // Every rank ends a training step with the same instructions once its last backward is done.
  std::string end = "then on every rank, the step's end:";
  for (const Instruction& i : step_end_instructions(1, true, true))
    end += (end.back() == ':' ? " " : ", ") + to_string(i);
  std::printf("%s\n  (update and gather_params once per parameter group; moe_stats with MoE layers, "
              "fp8_scales under FP8's delayed or current scaling)\n",
              end.c_str());

  std::printf("\nmicro-batches in flight (most activations held at once), per rank%s:\n",
              v > 1 ? " and chunk" : "");
  double busy = 0;
  for (int r = 0; r < s.pp; ++r) {
    std::string line = "  rank " + std::to_string(r) + ":";
    for (int n : c.max_in_flight[r]) line.append(1, ' ').append(std::to_string(n));
    std::printf("%s\n", line.c_str());
    for (size_t i = 0; i < s.ranks[r].size(); ++i)
      if (c.end[r][i] >= 0) busy += c.end[r][i] - c.start[r][i];
  }
  const double bubble = c.makespan > 0 ? 1 - busy / (s.pp * c.makespan) : 0;
  std::printf("makespan %.2f units, bubble %.1f%% (idle share of pp x makespan)\n", c.makespan,
              100 * bubble);

  if (a.has("--csv")) {
    save_schedule_csv(s, a.get("--csv", ""));
    std::printf("wrote %s\n", a.get("--csv", "").c_str());
  }
  if (a.has("--trace")) {
    write_chrome_trace(a.get("--trace", ""), simulated_trace(s, c));
    std::printf("wrote %s (1 unit = 1 ms; open in ui.perfetto.dev)\n",
                a.get("--trace", "").c_str());
  }
  return 0;
}

}  // namespace cleave::cli
