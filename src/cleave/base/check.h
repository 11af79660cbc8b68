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

// An error every rank of a job raises alike, at the same point of its run: a check on a value all
// ranks hold the same (an all-reduced loss), or an error agreed on with agree_on_errors
// (cleave/comm/errors.h). Rank 0 alone reports it and every rank ends normally, through
// MPI_Finalize, where any other error aborts the job. Raised on some ranks only, it leaves the
// others waiting in their next collective until its timeout.
struct EveryRankError : Error {
  using Error::Error;
};

}  // namespace cleave

#define CLEAVE_FAIL(msg)                                                        \
  do {                                                                          \
    std::ostringstream cleave_fail_os_;                                         \
    cleave_fail_os_ << msg << " [" << __FILE__ << ":" << __LINE__ << "]";       \
    throw ::cleave::Error(cleave_fail_os_.str());                               \
  } while (0)

// The message says what is wrong and names the thing at fault; the file and line point a developer
// to the check (its C++ expression would tell a user nothing).
#define CLEAVE_CHECK(cond, msg)                                                 \
  do {                                                                          \
    if (!(cond)) CLEAVE_FAIL(msg);                                              \
  } while (0)
