// The tokenizer a checkpoint comes with, for the commands that read one (generate, export).
#pragma once
#include <string>

#include "cleave/checkpoint/load_model.h"
#include "cleave/data/tokenizer.h"

namespace cleave::cli {

// The one its folder carries (an imported model's), else the one in its run's data folder; ""
// when neither has one.
inline std::string carried_tokenizer(const std::string& checkpoint_dir, const std::string& data_dir) {
  for (const std::string& dir : {checkpoint_dir, data_dir}) {
    const std::string found = find_tokenizer(dir);
    if (!found.empty()) return found;
  }
  return "";
}
inline std::string carried_tokenizer(const LoadedModel& loaded) {
  return carried_tokenizer(loaded.dir, loaded.data_dir);
}

}  // namespace cleave::cli
