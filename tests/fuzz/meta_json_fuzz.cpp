// The input is a checkpoint's meta.json, in a folder that also holds two valid safetensors files
// (model-rank00000.safetensors and model-rank00001.safetensors, whose checksums the seeds name),
// a folder, a FIFO and a link to /dev/zero under safetensors names. read_checkpoint_folder must
// refuse the checkpoint (naming the folder) or open what meta.json lists without hanging; then the
// trainer's reading of its config and step (train/checkpoint_config.h) against a tiny GPT-2's
// config refuses it (naming the folder) or returns a step in [0, 2^53].
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "cleave/checkpoint/folder.h"
#include "cleave/train/checkpoint_config.h"
#include "fuzz_util.h"

namespace {

// A safetensors file of one F32 tensor "w" of shape [2]: the 8-byte header length, the header
// padded with spaces to 8-byte alignment, the data.
std::string one_tensor_file(float a, float b) {
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(&a), 4);
  bytes.append(reinterpret_cast<const char*>(&b), 4);
  return bytes;
}

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    using cleave::fuzz::finding;
    const std::string d = cleave::fuzz::scratch() + "/step_00000001";
    if (::mkdir(d.c_str(), 0755) != 0) finding("cannot create " + d);
    cleave::fuzz::write_bytes(d + "/model-rank00000.safetensors", one_tensor_file(1.0f, 2.0f));
    cleave::fuzz::write_bytes(d + "/model-rank00001.safetensors", one_tensor_file(3.0f, 4.0f));
    cleave::fuzz::special_safetensors(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  const std::string& dir = checkpoint_dir();
  fuzz::write_bytes(dir + "/meta.json", {reinterpret_cast<const char*>(data), size});
  LoadedCheckpoint ck;
  if (!fuzz::accepted([&] { ck = read_checkpoint_folder(dir); }, dir)) return 0;
  static const Config cfg = parse_config(
      "[model]\nfamily = \"gpt2\"\nvocab_size = 256\nd_model = 64\nn_layers = 2\nn_heads = 4\n"
      "max_seq_len = 64\n[train]\nseq_len = 32\n",
      "tiny.toml");
  fuzz::accepted(
      [&] {
        const int64_t step = checkpoint_step(ck, dir, cfg);
        if (step < 0 || step > (int64_t(1) << 53))
          fuzz::finding("checkpoint step " + std::to_string(step) + " accepted");
        resume_changes(ck, dir, cfg);
      },
      dir);
  return 0;
}
