// The input is a pipeline schedule CSV, taken as `cleave schedule --load` takes it: loaded,
// checked by simulation (refusals name the file when loading; the check names the rank and action
// instead), and its timeline printed. A folder, a FIFO or a device is refused by name.
#include <string>

#include "cleave/pipeline/schedule.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  fuzz::refuses_once(fuzz::special_files(), [](const std::string& p) { load_schedule_csv(p); });
  const std::string path = fuzz::scratch() + "/input.csv";
  fuzz::write_bytes(path, {reinterpret_cast<const char*>(data), size});
  Schedule s;
  if (!fuzz::accepted([&] { s = load_schedule_csv(path); }, path)) return 0;
  fuzz::accepted(
      [&] {
        const ScheduleCheck c = check_schedule(s);
        const double unit = 1.0 / c.stages.chunks_per_rank;
        const ScheduleCheck timed = check_schedule(s, ActionCosts{unit, unit, unit});
        timeline_text(s, timed);
      },
      "");
  return 0;
}
