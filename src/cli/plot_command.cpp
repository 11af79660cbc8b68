// `cleave plot RUN_DIR... [--out FILE.svg|.png|.pdf]`: loss, validation loss, tokens/s and MFU
// against step from each run's metrics.jsonl, drawn by matplotlib (Debian's python3-matplotlib)
// through scripts/plot_runs.py, which is compiled into cleave and fed to python3 on its stdin.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/plot_script.h"

namespace fs = std::filesystem;

namespace cleave::cli {

int plot(int argc, char** argv) {
  const Args a = Args::parse("plot", argc, argv, {"--out"});
  if (a.positional.empty()) throw Error("cleave plot: expected one or more RUN_DIR");
  for (const std::string& run : a.positional) {
    std::error_code ec;
    if (!fs::is_regular_file(fs::path(run) / "metrics.jsonl", ec))
      throw Error("cleave plot: " + run + " has no metrics.jsonl (not a training run's out_dir?)");
  }
  const std::string out = a.get("--out", "plot.svg");
  const std::string ext = fs::path(out).extension().string();
  if (ext != ".svg" && ext != ".png" && ext != ".pdf")
    throw Error("cleave plot: --out " + out + " must end in .svg, .png or .pdf");

  std::vector<std::string> args = {"python3", "-", out};
  args.insert(args.end(), a.positional.begin(), a.positional.end());
  std::vector<char*> argv_c;
  for (std::string& s : args) argv_c.push_back(s.data());
  argv_c.push_back(nullptr);
  int in[2];
  if (::pipe(in) != 0) throw Error(std::string("cleave plot: pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("cleave plot: fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    ::close(in[0]);
    ::close(in[1]);
    // Debian's interpreter, whose python3-matplotlib setup.sh installs, before any other on PATH.
    ::execv("/usr/bin/python3", argv_c.data());
    ::execvp("python3", argv_c.data());
    _exit(127);
  }
  ::close(in[0]);
  // A python3 that exits early must not kill cleave with SIGPIPE: the exit status says why.
  void (*previous)(int) = std::signal(SIGPIPE, SIG_IGN);
  const char* p = kPlotScript;
  size_t left = std::strlen(kPlotScript);
  while (left > 0) {
    const ssize_t w = ::write(in[1], p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    p += w;
    left -= size_t(w);
  }
  ::close(in[1]);
  std::signal(SIGPIPE, previous);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw Error("cleave plot: cannot run python3 (setup.sh installs it with python3-matplotlib)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("cleave plot: the plotting script failed (above; it needs python3-matplotlib, "
                "which setup.sh installs)");
  return 0;
}

}  // namespace cleave::cli
