// write_file_atomic: readers see the old contents or the new, and a writer that fails part way
// leaves the old file and no temporary beside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "test_util.h"

namespace fs = std::filesystem;

TEST(WriteFileAtomic, AWriterThatThrowsLeavesTheOldFileAndNoTemporary) {
  cleave::test_util::TestDir dir("cleave-file");
  const std::string path = (dir.path() / "out.bin").string();
  cleave::write_file_atomic(path, "old", "test file");
  const std::string e = cleave::test_util::error_of([&] {
    cleave::write_file_atomic(path, "test file", [](std::ostream& out) {
      out << "half of the new";
      CLEAVE_FAIL("cannot encode the rest");
    });
  });
  EXPECT_NE(e.find("cannot encode the rest"), std::string::npos) << e;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}
