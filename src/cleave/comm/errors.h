// How an error ends a job of several ranks: reported once, and a communication report only for a
// communication fault.
//  - An error every rank raises alike (cleave::EveryRankError, e.g. from agree_on_errors): rank 0
//    prints it and every rank ends normally, through MPI_Finalize.
//  - An error of one rank: that rank prints it, marks its status "failed with an error" and calls
//    MPI_Abort; the other ranks, stopped with SIGTERM, see the mark and print nothing.
#pragma once
#include <mpi.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace cleave {

// Runs `local`, which must not communicate, on every rank of `comm`, then agrees: if it threw on
// any rank, every rank throws EveryRankError holding describe_rank_errors of all the messages.
// Every rank of comm must call it at the same point of its run (with no collective before it, as
// while reading the command line and the config, every rank reaches it).
void agree_on_errors(const std::function<void()>& local, MPI_Comm comm = MPI_COMM_WORLD);

// The error message of every rank ("": none) as one text: each distinct message once, on a line of
// its own in the order of the first rank that raised it, after the ranks that raised it
// ("rank 2: ", "ranks 0-1, 3: ") unless every rank did.
std::string describe_rank_errors(const std::vector<std::string>& messages);

// For the error that ended this rank's program: prints it as above ("cleave: error: " before each
// line; the rank's number too for an error of one rank of several) and returns the exit code, 1.
// An error of one rank of several does not return: it marks this rank failed and calls MPI_Abort.
int report_error(const std::exception& e);

}  // namespace cleave
