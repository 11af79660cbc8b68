#include "cli/export_gguf.h"

#include <cstdio>
#include <filesystem>

#include "cleave/base/file.h"
#include "cleave/data/gguf_tokenizer.h"
#include "cleave/model/gguf_model.h"

namespace fs = std::filesystem;

namespace cleave::cli {

void export_gguf(const LoadedModel& loaded, const std::string& out, const std::string& tokenizer,
                 const std::string& dtype) {
  gguf::TensorType matrices = gguf::TensorType::f32;
  if (dtype == "f16") matrices = gguf::TensorType::f16;
  else if (dtype == "bf16") matrices = gguf::TensorType::bf16;
  else if (dtype != "f32")
    throw Error("cleave export: --dtype must be f32, f16 or bf16, not '" + dtype + "'");
  if (tokenizer.empty())
    throw Error("cleave export: no tokenizer for the GGUF file, which llama.cpp needs: neither "
                "the checkpoint " + loaded.dir + " nor the data folder " + loaded.data_dir +
                " holds a tokenizer.model or tokenizer.json; give one with --tokenizer");
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(out, ec);
  if (fs::is_symlink(status))
    throw Error("cleave export: " + out + " is a symbolic link (to " +
                fs::read_symlink(out, ec).string() + "); export writes no file through a link: "
                "remove it or choose another OUT.gguf");
  if (fs::is_directory(status))
    throw Error("cleave export: " + out + " is a folder; --format gguf writes one file");
  Transformer& model = *loaded.model;
  const ModelConfig& c = model.config();
  const std::vector<gguf::TensorInfo> tensors = gguf_tensor_infos(gguf_tensor_plan(c), matrices);
  const std::unique_ptr<Tokenizer> tok = open_tokenizer(tokenizer);
  gguf::Metadata meta;
  const fs::path dir = fs::absolute(loaded.dir).lexically_normal();
  meta.add_string("general.name", dir.parent_path().filename().string() + "/" +
                                      dir.filename().string());
  add_gguf_tokenizer(meta, *tok, c.vocab_size);

  // The file's size, near enough, to refuse before writing a file the disk cannot hold.
  uintmax_t bytes = meta.bytes().size();
  for (const gguf::TensorInfo& t : tensors) bytes += t.nbytes() + gguf::kAlignment + t.name.size();
  const fs::path parent = fs::absolute(out).parent_path();
  fs::create_directories(parent);
  const fs::space_info space = fs::space(parent, ec);
  if (!ec && space.available < bytes)
    throw Error("cleave export: " + out + " needs about " + std::to_string(bytes >> 20) +
                " MiB, and " + parent.string() + " has " + std::to_string(space.available >> 20) +
                " MiB free");
  write_file_atomic(out, "GGUF file", [&](std::ostream& o) {
    write_gguf_model(o, meta, c, model.params(), model.params().values().data(), matrices);
  });
  std::printf("exported %zu tensors (%s matrices) and the %s tokenizer %s to %s (%.1f MiB)\n",
              tensors.size(), dtype.c_str(), tok->kind(), tok->path().c_str(), out.c_str(),
              double(fs::file_size(out)) / double(1 << 20));
}

}  // namespace cleave::cli
