// Checks inside the engine: a failed check throws cleave::Error naming the file and line, with a
// message built from stream operands, e.g. CLEAVE_CHECK(n % 2 == 0, "n=" << n << " must be even").
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace cleave {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace cleave

#define CLEAVE_FAIL(msg)                                                        \
  do {                                                                          \
    std::ostringstream cleave_fail_os_;                                         \
    cleave_fail_os_ << msg << " [" << __FILE__ << ":" << __LINE__ << "]";       \
    throw ::cleave::Error(cleave_fail_os_.str());                               \
  } while (0)

#define CLEAVE_CHECK(cond, msg)                                                 \
  do {                                                                          \
    if (!(cond)) CLEAVE_FAIL("check failed: " #cond ": " << msg);               \
  } while (0)
