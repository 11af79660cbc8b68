// The input is a training config: TOML text, then optionally a NUL byte and NUL-separated
// `--set key=value` overrides. parse_config must refuse it (naming the origin) or return a config
// that to_toml writes and parse_config reads back to the same text.
#include <string>
#include <vector>

#include "cleave/train/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  std::vector<std::string> overrides;
  for (size_t at = nul; at != std::string::npos && at < input.size();) {
    const size_t next = input.find('\0', at + 1);
    overrides.push_back(input.substr(at + 1, next == std::string::npos ? next : next - at - 1));
    at = next;
  }
  const std::string origin = "fuzz.toml";
  Config c;
  if (!fuzz::accepted([&] { c = parse_config(text, origin, overrides); }, "")) return 0;
  const std::string written = to_toml(c);
  std::string again;
  try {
    again = to_toml(parse_config(written, "written.toml"));
  } catch (const std::exception& e) {
    fuzz::finding("the config to_toml wrote is refused: " + std::string(e.what()) + "\n" + written);
  }
  if (again != written)
    fuzz::finding("to_toml(parse_config(to_toml(c))) differs from to_toml(c):\n" + written +
                  "\n---\n" + again);
  return 0;
}
