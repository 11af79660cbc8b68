// Checkpoint folders: roundtrip, corruption and incompleteness detection, atomic replacement,
// and how latest_checkpoint chooses among complete, stale and partial folders.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/checkpoint/folder.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cleave::TensorView;

namespace {

class CheckpointFolderTest : public ::testing::Test {
 protected:
  cleave::test_util::TestDir tmp_{"cleave-ckpt"};
  const fs::path run_ = tmp_.path();
  std::string step_dir(int step) const {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d", step);
    return (run_ / name).string();
  }
  std::set<std::string> entries(const fs::path& dir) const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
    return out;
  }

};

// A small model state whose values depend on `seed`.
struct State {
  std::vector<float> wte, ln;
  std::vector<int32_t> counters;
  explicit State(float seed) : wte(4 * 8), ln(8), counters{static_cast<int32_t>(seed), 5} {
    for (size_t i = 0; i < wte.size(); ++i) wte[i] = seed + 0.01f * static_cast<float>(i);
    for (size_t i = 0; i < ln.size(); ++i) ln[i] = seed - static_cast<float>(i);
  }
  std::vector<TensorView> views() const {
    return {{"wte", "F32", {4, 8}, wte.data(), wte.size() * 4},
            {"ln_f.weight", "F32", {8}, ln.data(), ln.size() * 4},
            {"counters", "I32", {2}, counters.data(), counters.size() * 4}};
  }
};

void expect_state(const cleave::LoadedCheckpoint& ck, const State& s) {
  ASSERT_EQ(ck.files.size(), 1u);
  const cleave::SafetensorsFile& f = ck.files[0];
  std::vector<float> wte(32), ln(8);
  std::vector<int32_t> counters(2);
  f.read_f32("wte", {4, 8}, wte.data());
  f.read_f32("ln_f.weight", {8}, ln.data());
  f.read("counters", "I32", {2}, counters.data());
  EXPECT_EQ(wte, s.wte);
  EXPECT_EQ(ln, s.ln);
  EXPECT_EQ(counters, s.counters);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cleave::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a cleave::Error";
  return "";
}

void flip_byte(const std::string& path, long from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x01;
  f.seekp(-from_end, std::ios::end);
  f.write(&c, 1);
}

nlohmann::json checksums_of(const std::string& file) {
  return cleave::SafetensorsFile(file).compute_checksums(cleave::kChecksumChunkBytes).to_json();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

TEST_F(CheckpointFolderTest, Roundtrip) {
  State s(1.5f);
  const std::string dir = step_dir(100);
  nlohmann::json meta = {{"step", 100}, {"tokens_seen", 819200}, {"config", {{"d_model", 8}}}};
  cleave::write_checkpoint_folder(dir, meta, s.views());

  EXPECT_EQ(entries(dir), (std::set<std::string>{"meta.json", "model-rank00000.safetensors"}));
  EXPECT_EQ(entries(run_), (std::set<std::string>{"step_00000100"}));

  cleave::LoadedCheckpoint ck = cleave::read_checkpoint_folder(dir);
  EXPECT_EQ(ck.meta["step"], 100);
  EXPECT_EQ(ck.meta["tokens_seen"], 819200);
  EXPECT_EQ(ck.meta["config"]["d_model"], 8);
  EXPECT_EQ(ck.meta["format"], "cleave-checkpoint");
  EXPECT_EQ(ck.meta["version"], 4);
  const std::string file = dir + "/model-rank00000.safetensors";
  EXPECT_EQ(ck.meta["files"]["model-rank00000.safetensors"], checksums_of(file));
  EXPECT_EQ(ck.files[0].path(), file);
  expect_state(ck, s);

  // A trailing slash names the same folder.
  expect_state(cleave::read_checkpoint_folder(dir + "/"), s);
}

TEST_F(CheckpointFolderTest, CreatesMissingRunDir) {
  State s(2.0f);
  const std::string dir = (run_ / "nested" / "run" / "step_00000001").string();
  cleave::write_checkpoint_folder(dir, {{"step", 1}}, s.views());
  expect_state(cleave::read_checkpoint_folder(dir), s);
}

TEST_F(CheckpointFolderTest, FlippedByteGivesChecksumError) {
  State s(3.0f);
  const std::string dir = step_dir(7);
  cleave::write_checkpoint_folder(dir, {{"step", 7}}, s.views());
  const std::string file = dir + "/model-rank00000.safetensors";
  // The last tensor's bytes: opening reads only the header, so the damage is found (and named
  // with the tensor and its bytes) when that tensor is read, and the others still read.
  flip_byte(file, 5);
  const cleave::LoadedCheckpoint ck = cleave::read_checkpoint_folder(dir);
  std::vector<int32_t> counters(2);
  std::string msg = error_of([&] { ck.files[0].read("counters", "I32", {2}, counters.data()); });
  EXPECT_NE(msg.find("checksum mismatch in " + file + ": tensor 'counters' bytes [0, 8): expected "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the checkpoint is corrupted"), std::string::npos) << msg;
  std::vector<float> ln(8);
  ck.files[0].read_f32("ln_f.weight", {8}, ln.data());
  EXPECT_EQ(ln, s.ln);

  // A flipped byte in the header is reported as a checksum mismatch on opening, not a parse error.
  flip_byte(file, 5);  // restore
  EXPECT_NO_THROW(cleave::read_checkpoint_folder(dir));
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(9);
  f.put('#');
  f.close();
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find("checksum mismatch in " + file + ": its header"), std::string::npos) << msg;

  // A file cut off (or grown) is named on opening by its size.
  std::vector<char> bytes(fs::file_size(file));
  std::ifstream(file, std::ios::binary).read(bytes.data(), long(bytes.size()));
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), long(bytes.size() - 3));
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find(file + " is " + std::to_string(bytes.size() - 3) + " bytes where the checkpoint "
                     "recorded " + std::to_string(bytes.size()) + ": cut off mid-write"),
            std::string::npos)
      << msg;
}

TEST_F(CheckpointFolderTest, VersionThreeStillLoads) {
  // Format 3 recorded one checksum per file, checked by reading the file whole on opening.
  State s(3.5f);
  const std::string dir = step_dir(9);
  cleave::write_checkpoint_folder(dir, {{"step", 9}}, s.views());
  const std::string file = dir + "/model-rank00000.safetensors";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir + "/meta.json"));
  m["version"] = 3;
  m["files"]["model-rank00000.safetensors"] = cleave::file_checksum(file);
  write_text(dir + "/meta.json", m.dump());
  const cleave::LoadedCheckpoint ck = cleave::read_checkpoint_folder(dir);
  expect_state(ck, s);
  EXPECT_GE(ck.bytes_read(), fs::file_size(file));  // it read the whole file

  const std::string good = cleave::file_checksum(file);
  flip_byte(file, 5);
  const std::string msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find("checksum mismatch in " + file + ": expected " + good + ", found " +
                     cleave::file_checksum(file) + "; the checkpoint is corrupted"),
            std::string::npos)
      << msg;
}

TEST_F(CheckpointFolderTest, MissingPiecesAreNamed) {
  State s(4.0f);
  const std::string dir = step_dir(8);

  std::string msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  cleave::write_checkpoint_folder(dir, {{"step", 8}}, s.views());
  const std::string meta_path = dir + "/meta.json";
  std::string meta_text;
  {
    std::ifstream in(meta_path);
    meta_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  fs::remove(meta_path);
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find(meta_path), std::string::npos) << msg;
  EXPECT_NE(msg.find("no meta.json"), std::string::npos) << msg;

  write_text(meta_path, "{ not json");
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find(meta_path), std::string::npos) << msg;

  nlohmann::json m = nlohmann::json::parse(meta_text);
  m["format"] = "something-else";
  write_text(meta_path, m.dump());
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find("format"), std::string::npos) << msg;
  EXPECT_NE(msg.find(meta_path), std::string::npos) << msg;

  m = nlohmann::json::parse(meta_text);
  m["version"] = 5;
  write_text(meta_path, m.dump());
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find("unsupported checkpoint version 5; this build reads versions 1 to 4"),
            std::string::npos)
      << msg;

  m = nlohmann::json::parse(meta_text);
  m["files"]["model-rank00001.safetensors"] = m["files"]["model-rank00000.safetensors"];
  write_text(meta_path, m.dump());
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find(dir + "/model-rank00001.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;

  m = nlohmann::json::parse(meta_text);
  m["files"]["../escape.safetensors"] = m["files"]["model-rank00000.safetensors"];
  write_text(meta_path, m.dump());
  msg = error_of([&] { cleave::read_checkpoint_folder(dir); });
  EXPECT_NE(msg.find("invalid file name"), std::string::npos) << msg;

  write_text(meta_path, meta_text);
  expect_state(cleave::read_checkpoint_folder(dir), s);
}

TEST_F(CheckpointFolderTest, OverwriteKeepsOnlyNewContent) {
  State a(5.0f), b(6.0f);
  const std::string dir = step_dir(300);
  cleave::write_checkpoint_folder(dir, {{"step", 300}, {"which", "a"}}, a.views());
  write_text(dir + "/leftover.txt", "from the old folder");  // must not survive the overwrite
  cleave::write_checkpoint_folder(dir, {{"step", 300}, {"which", "b"}}, b.views());

  cleave::LoadedCheckpoint ck = cleave::read_checkpoint_folder(dir);
  EXPECT_EQ(ck.meta["which"], "b");
  expect_state(ck, b);
  EXPECT_EQ(entries(dir), (std::set<std::string>{"meta.json", "model-rank00000.safetensors"}));
  EXPECT_EQ(entries(run_), (std::set<std::string>{"step_00000300"}));  // no .tmp-/.old- left
}

TEST_F(CheckpointFolderTest, StaleTmpFolderIsIgnored) {
  State good(7.0f);
  cleave::write_checkpoint_folder(step_dir(100), {{"step", 100}}, good.views());

  // A crash while writing step 200 by another process left a partial folder, even with a
  // meta.json inside it, and a partial safetensors file.
  const std::string stale = step_dir(200) + ".tmp-999999";
  fs::create_directories(stale);
  write_text(stale + "/model-rank00000.safetensors", "partial");
  write_text(stale + "/meta.json", "{\"format\": \"cleave-checkpoint\"");
  // And a crash between the two renames of a non-exchanging file system left a ".old-" one.
  fs::create_directories(step_dir(250) + ".old-999998");
  write_text(step_dir(250) + ".old-999998/meta.json", "{}");

  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), step_dir(100));
  expect_state(cleave::read_checkpoint_folder(step_dir(100)), good);

  // A stale tmp folder with our own pid (a crashed earlier process that had the same pid) is
  // replaced when that step is written again.
  const std::string own = step_dir(200) + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(own);
  write_text(own + "/junk", "x");
  State next(8.0f);
  cleave::write_checkpoint_folder(step_dir(200), {{"step", 200}}, next.views());
  EXPECT_FALSE(fs::exists(own));
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), step_dir(200));
  expect_state(cleave::read_checkpoint_folder(step_dir(200)), next);
  expect_state(cleave::read_checkpoint_folder(step_dir(100)), good);
  EXPECT_TRUE(fs::exists(stale));  // another process's folder is not ours to delete
}

TEST_F(CheckpointFolderTest, LatestCheckpointPicksNewestComplete) {
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), "");
  EXPECT_EQ(cleave::latest_checkpoint((run_ / "does-not-exist").string()), "");

  State s(9.0f);
  cleave::write_checkpoint_folder(step_dir(100), {{"step", 100}}, s.views());
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), step_dir(100));
  cleave::write_checkpoint_folder(step_dir(200), {{"step", 200}}, s.views());
  cleave::write_checkpoint_folder(step_dir(99), {{"step", 99}}, s.views());
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), step_dir(200));

  // By number, not by name: step_1000 (unpadded) is newer than step_00000200.
  cleave::write_checkpoint_folder((run_ / "step_1000").string(), {{"step", 1000}}, s.views());
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), (run_ / "step_1000").string());
  fs::remove_all(run_ / "step_1000");

  // Incomplete or unrelated entries are ignored.
  fs::create_directories(step_dir(300));  // no meta.json
  write_text(step_dir(300) + "/model-rank00000.safetensors", "partial");
  write_text(step_dir(400), "a file, not a folder");
  fs::create_directories(run_ / "step_5000x");
  write_text((run_ / "step_5000x" / "meta.json").string(), "{}");
  fs::create_directories(run_ / "step_");
  write_text((run_ / "step_" / "meta.json").string(), "{}");
  fs::create_directories(step_dir(600) + ".tmp-12345");
  write_text(step_dir(600) + ".tmp-12345/meta.json", "{}");
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), step_dir(200));
  expect_state(cleave::read_checkpoint_folder(cleave::latest_checkpoint(run_.string())), s);
}

TEST_F(CheckpointFolderTest, FailedWriteLeavesNoTmpAndKeepsPrevious) {
  State good(10.0f);
  const std::string dir = step_dir(500);
  cleave::write_checkpoint_folder(dir, {{"step", 500}}, good.views());
  std::vector<float> w(3);
  // Inconsistent tensor (3 floats claimed as shape [4]): the write fails part way.
  std::string msg = error_of([&] {
    cleave::write_checkpoint_folder(dir, {{"step", 500}}, {{"w", "F32", {4}, w.data(), 12}});
  });
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_EQ(entries(run_), (std::set<std::string>{"step_00000500"}));
  expect_state(cleave::read_checkpoint_folder(dir), good);
}

TEST_F(CheckpointFolderTest, SeveralWritersOneFinisher) {
  // Writers put their files into the shared temporary folder; the finisher checksums them all.
  const std::string dir = step_dir(400);
  const State a(1.0f), b(2.0f);
  cleave::begin_checkpoint_folder(dir, "job7");
  const std::string tmp = cleave::checkpoint_temp_folder(dir, "job7");
  EXPECT_EQ(tmp, dir + ".tmp-job7");
  cleave::write_safetensors(tmp + "/model-rank00000.safetensors", a.views(), {});
  cleave::write_safetensors(tmp + "/model-rank00001.safetensors", b.views(), {});
  EXPECT_EQ(cleave::latest_checkpoint(run_.string()), "");  // nothing installed yet
  cleave::finish_checkpoint_folder(
      dir, "job7", {{"step", 400}},
      {{"model-rank00000.safetensors", std::nullopt}, {"model-rank00001.safetensors", std::nullopt}});
  EXPECT_FALSE(fs::exists(tmp));
  const cleave::LoadedCheckpoint ck = cleave::read_checkpoint_folder(dir);
  ASSERT_EQ(ck.files.size(), 2u);
  std::vector<float> ln(8);
  ck.files[1].read_f32("ln_f.weight", {8}, ln.data());
  EXPECT_EQ(ln, b.ln);
  EXPECT_EQ(ck.meta["files"]["model-rank00001.safetensors"],
            checksums_of(dir + "/model-rank00001.safetensors"));
}

TEST_F(CheckpointFolderTest, FinishNamesAFileNoWriterLeft) {
  // A writer on a host whose folder is not shared: the finisher names the missing file, and the
  // previous checkpoint of the same step stays in place.
  const std::string dir = step_dir(500);
  const State good(3.0f);
  cleave::write_checkpoint_folder(dir, {{"step", 500}}, good.views());
  cleave::begin_checkpoint_folder(dir, "job8");
  const std::string tmp = cleave::checkpoint_temp_folder(dir, "job8");
  cleave::write_safetensors(tmp + "/model-rank00000.safetensors", State(4.0f).views(), {});
  const std::string msg = error_of([&] {
    cleave::finish_checkpoint_folder(
        dir, "job8", {{"step", 500}},
        {{"model-rank00000.safetensors", std::nullopt},
         {"model-rank00001.safetensors", std::nullopt}});
  });
  EXPECT_NE(msg.find(tmp + "/model-rank00001.safetensors is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.out_dir must be"), std::string::npos) << msg;
  cleave::abandon_checkpoint_folder(dir, "job8");
  EXPECT_FALSE(fs::exists(tmp));
  expect_state(cleave::read_checkpoint_folder(dir), good);
}
