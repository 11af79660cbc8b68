// HfFolder's writing of the checkpoint (hf_import.h); its reading of the folder is in
// hf_folder.cpp.
#include "cleave/checkpoint/hf_import.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cleave/base/buffer.h"
#include "cleave/base/file.h"
#include "cleave/checkpoint/folder.h"
#include "cleave/checkpoint/training_state.h"
#include "cleave/kernels/convert.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

void write_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = w < 0 ? std::strerror(errno) : "no progress";
      ::close(fd);
      throw Error("cannot write " + path + ": " + why);
    }
    done += size_t(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string why = synced ? "" : std::strerror(errno);
  if (::close(fd) != 0 || !synced) throw Error("cannot write " + path + ": " + why);
}

}  // namespace

void HfFolder::read_f32(const Source& s, float* out) const {
  const SafetensorsFile& file = files_[size_t(s.file)];
  const TensorInfo& info = file.tensors().at(s.key);
  if (info.dtype == "F32") {
    file.read(s.key, "F32", info.shape, out);
    return;
  }
  std::vector<uint16_t> half(size_t(s.entry.hf_numel()));
  file.read(s.key, info.dtype, info.shape, half.data());
  if (info.dtype == "BF16") kernels::bf16_to_f32(out, half.data(), int64_t(half.size()));
  else kernels::f16_to_f32(out, half.data(), int64_t(half.size()));
}

int64_t HfFolder::write_checkpoint(const std::string& out, const std::string& config,
                                   uint64_t seed) const {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec)))
    throw Error(out + " exists; import writes a new checkpoint folder: remove it or choose "
                "another OUT_CHECKPOINT");
  // The parameters as the table names them, each once (its rows may come from several tensors),
  // in one unit: a checkpoint's pieces are named and placed by tensor, not by the layout of the
  // flat buffer, so any layout reads them.
  ParamStore params;
  for (const Source& s : sources_)
    if (!s.entry.param.empty() && params.find(s.entry.param) < 0)
      params.add(s.entry.param, s.entry.param_shape, Init::zeros);
  params.allocate(0, 1, ParamValues::unset);
  std::vector<int64_t> filled(params.tensors().size(), 0);
  nlohmann::json moe_bias = nullptr;
  std::vector<float> hf;  // a tensor that is not rows of its parameter as they are
  for (const Source& s : sources_) {
    const HfEntry& e = s.entry;
    if (e.layout == HfLayout::router_bias) {
      hf.resize(size_t(e.hf_numel()));
      read_f32(s, hf.data());
      moe_bias[std::to_string(e.layer)] = hf;
      continue;
    }
    const int i = params.find(e.param);
    if (e.layout == HfLayout::transposed) {
      hf.resize(size_t(e.hf_numel()));
      read_f32(s, hf.data());
      e.from_hf(hf.data(), params.value(i));
    } else {  // straight into its rows
      read_f32(s, params.value(i) + (e.layout == HfLayout::rows ? e.row0 * e.param_shape[1] : 0));
    }
    filled[size_t(i)] += e.hf_numel();
  }
  for (size_t i = 0; i < filled.size(); ++i)
    CLEAVE_CHECK(filled[i] == params.tensor(int(i)).numel,
                 "the Hugging Face table fills " << filled[i] << " of the "
                                                 << params.tensor(int(i)).numel << " elements of "
                                                 << params.tensor(int(i)).name);
  const std::string tag = std::to_string(::getpid());
  begin_checkpoint_folder(out, tag);
  try {
    const std::string tmp = checkpoint_temp_folder(out, tag);
    Buffer<float> zeros(params.total());  // AdamW's moments: never written, so never resident
    const StateSlices state{{{0, params.total()}},
                            {params.values().data(), false},
                            {zeros.data(), false},
                            {zeros.data(), false},
                            TpCopy{}};
    const FileChecksums sums = write_state_file(tmp, 0, params, state);
    for (const std::string& path : tokenizer_files_)
      write_synced(tmp + "/" + fs::path(path).filename().string(),
                   read_bounded_file(path, "tokenizer", kMaxHfTokenizerBytes));
    finish_training_checkpoint(out, tag, config, seed, 0, {state_file_entries(0, params, state)},
                               {{0, sums}}, 0, 1, nullptr, moe_bias);
  } catch (...) {
    abandon_checkpoint_folder(out, tag);
    throw;
  }
  return params.count();
}

}  // namespace cleave
