// `cleave checkpoint info DIR` prints what a checkpoint holds; `cleave checkpoint verify DIR`
// reads all of it and checks every checksum (exit 1 and the fault named when one fails).
#include <cstdio>
#include <iostream>
#include <string>

#include "cleave/checkpoint/inspect.h"
#include "cli/args.h"

namespace cleave::cli {

int checkpoint(int argc, char** argv) {
  const Args a = Args::parse("checkpoint", argc, argv, {});
  if (a.positional.size() != 2 || (a.positional[0] != "info" && a.positional[0] != "verify"))
    throw Error("cleave checkpoint: expected `info DIR` or `verify DIR`");
  const std::string& dir = a.positional[1];
  if (a.positional[0] == "info")
    std::cout << describe_checkpoint(read_checkpoint_folder(dir), dir);
  else
    std::cout << verify_checkpoint(dir) << "\n";
  return 0;
}

}  // namespace cleave::cli
