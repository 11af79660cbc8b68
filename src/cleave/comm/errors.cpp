#include "cleave/comm/errors.h"

#include <unistd.h>

#include <cstdio>

#include "cleave/base/check.h"
#include "cleave/comm/communicator.h"

namespace cleave {

namespace {

// "0-1, 3, 5-7"
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(ranks[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return s;
}

void print_lines(const std::string& text, const std::string& prefix) {
  std::fflush(stdout);
  size_t begin = 0;
  do {
    const size_t end = text.find('\n', begin);
    const std::string line = text.substr(begin, end == std::string::npos ? end : end - begin);
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str());
    begin = end == std::string::npos ? end : end + 1;
  } while (begin != std::string::npos);
  std::fflush(stderr);
}

}  // namespace

std::string describe_rank_errors(const std::vector<std::string>& messages) {
  std::vector<std::string> distinct;
  std::vector<std::vector<int>> raised_by;
  for (int r = 0; r < int(messages.size()); ++r) {
    if (messages[size_t(r)].empty()) continue;
    size_t i = 0;
    while (i < distinct.size() && distinct[i] != messages[size_t(r)]) ++i;
    if (i == distinct.size()) {
      distinct.push_back(messages[size_t(r)]);
      raised_by.emplace_back();
    }
    raised_by[i].push_back(r);
  }
  std::string text;
  for (size_t i = 0; i < distinct.size(); ++i) {
    if (i > 0) text += '\n';
    if (raised_by[i].size() != messages.size()) {
      text += raised_by[i].size() == 1 ? "rank " : "ranks ";
      text += rank_ranges(raised_by[i]);
      text += ": ";
    }
    text += distinct[i];
  }
  return text;
}

void agree_on_errors(const std::function<void()>& local, MPI_Comm comm) {
  std::string error;
  try {
    local();
  } catch (const std::exception& e) {
    error = *e.what() ? e.what() : "an error without a message";
  }
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int length = int(error.size());
  std::vector<int> lengths(size_t(size), 0);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  std::vector<int> offsets(size_t(size), 0);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[size_t(r)] = total;
    total += lengths[size_t(r)];
  }
  if (total == 0) return;
  std::string all(size_t(total), '\0');
  MPI_Allgatherv(error.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                 MPI_CHAR, comm);
  std::vector<std::string> messages;
  for (int r = 0; r < size; ++r)
    messages.push_back(all.substr(size_t(offsets[size_t(r)]), size_t(lengths[size_t(r)])));
  throw EveryRankError(describe_rank_errors(messages));
}

int report_error(const std::exception& e) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (dynamic_cast<const EveryRankError*>(&e)) {
    if (rank == 0) print_lines(e.what(), "cleave: error: ");
    return 1;
  }
  print_lines(e.what(), world > 1 ? "cleave: error: rank " + std::to_string(rank) + ": "
                                  : std::string("cleave: error: "));
  if (world == 1) return 1;
  if (Communicator* c = Communicator::instance()) c->mark_failed();
  // Other ranks may be waiting in a collective for this one: end the job, do not hang.
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);  // MPI_Abort does not return; if it ever did, do not hang
}

}  // namespace cleave
