#include "cleave/checkpoint/training_state.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>

#include "cleave/base/check.h"

namespace cleave {

namespace {

constexpr const char* kKinds[] = {"param", "adam_m", "adam_v"};
constexpr const char* kFp8File = "fp8-state.safetensors";

// A box of the global tensor (offset and extent per dimension, as 2-D: a vector is one row) and
// the range [begin, end) of its row-major elements that one file holds under `key`.
struct SavedPiece {
  const SafetensorsFile* file;
  std::string key;
  int64_t offset[2], shape[2];
  int64_t begin, end;
};

// As 2-D: [n] is one row of n.
void as_2d(const std::vector<int64_t>& v, int64_t out[2], int64_t fill) {
  out[0] = v.size() == 2 ? v[0] : fill;
  out[1] = v.empty() ? 1 : v.back();
}

// Where the checkpoint keeps the elements of tensor `name` (of the model's global `shape`).
// Version 2 pieces are element ranges of the whole tensor (no offset, shape or key); version 1
// kept each tensor whole in one file.
std::vector<SavedPiece> saved_pieces(const LoadedCheckpoint& ck, const std::string& dir,
                                     const std::string& name, const std::vector<int64_t>& shape) {
  if (!ck.meta.contains("tensors") || !ck.meta["tensors"].contains(name))
    throw Error("checkpoint " + dir + " has no tensor " + name);
  const nlohmann::json& t = ck.meta["tensors"][name];
  std::vector<int64_t> saved_shape;
  std::vector<nlohmann::json> listed;
  try {
    saved_shape = t.at("shape").get<std::vector<int64_t>>();
    if (t.contains("pieces")) {
      for (const nlohmann::json& p : t.at("pieces")) listed.push_back(p);
    } else {
      int64_t numel = 1;
      for (int64_t d : t.at("shape").get<std::vector<int64_t>>()) numel *= d;
      listed.push_back({{"file", t.at("file")}, {"begin", 0}, {"end", numel}});
    }
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL("checkpoint " << dir << "/meta.json: tensor " << name << ": " << e.what());
  }
  if (saved_shape != shape)
    throw Error("checkpoint " + dir + ": tensor " + name + " has shape " +
                shape_text(saved_shape) + ", the model's is " + shape_text(shape));
  std::map<std::string, const SafetensorsFile*> files;  // by path: one lookup per piece
  for (const SafetensorsFile& f : ck.files) files[f.path()] = &f;
  auto file_of = [&](const std::string& file) {
    const auto it = files.find(dir + "/" + file);
    if (it == files.end())
      CLEAVE_FAIL("checkpoint " << dir << ": tensor " << name << " is in " << file
                                << ", which meta.json does not list");
    return it->second;
  };
  std::vector<SavedPiece> out;
  std::vector<std::vector<int64_t>> stored;  // per piece
  // A piece's integers: nlohmann's get<int64_t> would convert a float (1e116: no defined result).
  auto integer = [&](const nlohmann::json& v, const char* key) {
    CLEAVE_CHECK(v.is_number_integer(), "checkpoint " << dir << "/meta.json: tensor " << name
                                                      << ": a piece's " << key << " holds "
                                                      << v.dump() << ", not an integer");
    return v.get<int64_t>();
  };
  auto integers = [&](const nlohmann::json& p, const char* key, std::vector<int64_t> absent) {
    if (!p.contains(key)) return absent;
    const nlohmann::json& v = p.at(key);
    CLEAVE_CHECK(v.is_array(), "checkpoint " << dir << "/meta.json: tensor " << name
                                             << ": a piece's " << key << " is not a list");
    std::vector<int64_t> out;
    for (const nlohmann::json& e : v) out.push_back(integer(e, key));
    return out;
  };
  for (const nlohmann::json& p : listed) {
    try {
      SavedPiece s{file_of(p.at("file").get<std::string>()), p.value("key", name), {0, 0}, {0, 0},
                   0, 0};
      const std::vector<int64_t> box = integers(p, "box", shape);
      as_2d(integers(p, "offset", std::vector<int64_t>(shape.size(), 0)), s.offset, 0);
      as_2d(box, s.shape, 1);
      int64_t global[2];
      as_2d(shape, global, 1);
      s.begin = integer(p.at("begin"), "begin");
      s.end = integer(p.at("end"), "end");
      CLEAVE_CHECK(box.size() == shape.size() && s.offset[0] >= 0 && s.offset[1] >= 0 &&
                       s.offset[0] + s.shape[0] <= global[0] &&
                       s.offset[1] + s.shape[1] <= global[1] && 0 <= s.begin && s.begin < s.end &&
                       s.end <= s.shape[0] * s.shape[1],
                   "checkpoint " << dir << "/meta.json: tensor " << name << ": a piece in "
                                 << p.at("file").get<std::string>()
                                 << " lies outside the tensor or its box");
      // What the file's header must say of it: the box's shape when the piece is the whole box,
      // else flat (checked once the pieces are known to tile the tensor).
      const bool whole = s.begin == 0 && s.end == s.shape[0] * s.shape[1];
      stored.push_back(whole ? box : std::vector<int64_t>{s.end - s.begin});
      out.push_back(std::move(s));
    } catch (const nlohmann::json::exception& e) {
      CLEAVE_FAIL("checkpoint " << dir << "/meta.json: tensor " << name << ": " << e.what());
    }
  }
  // The boxes must not overlap and must fill the tensor; within each box the element ranges
  // must tile it.
  std::vector<const SavedPiece*> sorted;
  for (const SavedPiece& p : out) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return std::tie(a->offset[0], a->offset[1], a->begin) < std::tie(b->offset[0], b->offset[1], b->begin);
  });
  int64_t volume = 0, want = 1;
  for (int64_t d : shape) want *= d;
  std::vector<const SavedPiece*> boxes;  // one piece of each distinct box
  for (size_t i = 0; i < sorted.size();) {
    const SavedPiece& first = *sorted[i];
    boxes.push_back(&first);
    int64_t at = 0;
    for (; i < sorted.size() && sorted[i]->offset[0] == first.offset[0] &&
           sorted[i]->offset[1] == first.offset[1];
         ++i) {
      const SavedPiece& p = *sorted[i];
      CLEAVE_CHECK(p.shape[0] == first.shape[0] && p.shape[1] == first.shape[1] && p.begin == at,
                   "checkpoint " << dir << ": the pieces of tensor " << name
                                 << " do not tile its elements (gap or overlap at element " << at
                                 << (first.shape[0] * first.shape[1] == want
                                         ? std::string()
                                         : " of its box at [" + std::to_string(first.offset[0]) +
                                               ", " + std::to_string(first.offset[1]) + "]")
                                 << ")");
      at = p.end;
    }
    CLEAVE_CHECK(at == first.shape[0] * first.shape[1],
                 "checkpoint " << dir << ": the pieces of tensor " << name << " end at element "
                               << at << " of a box of " << first.shape[0] * first.shape[1]);
    volume += at;
  }
  // Boxes pairwise (a tensor has a few: its tp shards), not pieces (ZeRO's ranges, thousands).
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      const SavedPiece &a = *boxes[i], &b = *boxes[j];
      CLEAVE_CHECK(a.offset[0] + a.shape[0] <= b.offset[0] ||
                       b.offset[0] + b.shape[0] <= a.offset[0] ||
                       a.offset[1] + a.shape[1] <= b.offset[1] ||
                       b.offset[1] + b.shape[1] <= a.offset[1],
                   "checkpoint " << dir << ": the pieces of tensor " << name << " overlap");
    }
  CLEAVE_CHECK(volume == want, "checkpoint " << dir << ": the pieces of tensor " << name << " hold "
                                             << volume << " of its " << want << " elements");
  // Each file's own header must agree with meta.json: a transposed shape of the same size would
  // otherwise be read as it lies.
  for (size_t i = 0; i < out.size(); ++i) {
    const SavedPiece& s = out[i];
    const auto held = s.file->tensors().find(s.key);
    if (held == s.file->tensors().end())
      throw Error("checkpoint " + dir + ": " + s.file->path() + " has no tensor " + s.key +
                  " (meta.json lists it for " + name + ")");
    if (held->second.dtype != "F32" || held->second.shape != stored[i])
      throw Error("checkpoint " + dir + ": " + s.file->path() + " holds " + s.key + " as " +
                  held->second.dtype + " " + shape_text(held->second.shape) +
                  ", meta.json as F32 " + shape_text(stored[i]));
  }
  return out;
}

// Every piece of the global tensors this rank's `ranges` hold, as meta.json lists them for
// file `file`, by kind: the one place that names the keys a state file stores its pieces under.
struct LocalPiece {
  TensorPiece piece;  // the part of the ranges the box lies in
  GlobalBox box;
  std::string key_suffix;  // "" or "@<n>" when the tensor has several boxes in one file
};
std::vector<LocalPiece> local_pieces(const ParamStore& params, const StateSlices& state) {
  std::vector<LocalPiece> out;
  for (const TensorPiece& piece : tensor_pieces(params, state.ranges)) {
    const ParamTensor& t = params.tensor(piece.tensor);
    const std::vector<GlobalBox> boxes = global_boxes(t.placement, t.shape, piece.begin, piece.end);
    // append, not operator+: GCC 12 inlines the latter here into a false -Wrestrict warning.
    for (size_t k = 0; k < boxes.size(); ++k)
      if (state.copy.owns(t.placement, boxes[k]))
        out.push_back({piece, boxes[k], k == 0 ? "" : std::string("@").append(std::to_string(k))});
  }
  return out;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

std::string state_file_name(int index) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-rank%05d.safetensors", index);
  return buf;
}

FileChecksums write_state_file(const std::string& tmp, int index, const ParamStore& params,
                             const StateSlices& state) {
  std::vector<TensorView> views;
  const RangeBuffer buffers[] = {state.values, state.m, state.v};
  for (const LocalPiece& lp : local_pieces(params, state)) {
    const ParamTensor& t = params.tensor(lp.piece.tensor);
    const GlobalBox& b = lp.box;
    const int64_t count = b.box_end - b.box_begin;
    int64_t box_numel = 1;
    for (int64_t d : b.shape) box_numel *= d;
    const std::vector<int64_t> shape = count == box_numel ? b.shape : std::vector<int64_t>{count};
    for (int k = 0; k < 3; ++k)
      views.push_back({std::string(kKinds[k]) + "/" + t.name + lp.key_suffix, "F32", shape,
                       lp.piece.in(buffers[k]) + (b.local_begin - lp.piece.begin),
                       uint64_t(count) * 4});
  }
  return write_safetensors(tmp + "/" + state_file_name(index), views,
                           {{"format", "cleave-checkpoint"}, {"file", std::to_string(index)}});
}

nlohmann::json state_file_entries(int index, const ParamStore& params, const StateSlices& state) {
  nlohmann::json tensors = nlohmann::json::object();
  const std::string file = state_file_name(index);
  for (const LocalPiece& lp : local_pieces(params, state)) {
    const ParamTensor& t = params.tensor(lp.piece.tensor);
    for (const char* kind : kKinds) {
      const std::string name = std::string(kind) + "/" + t.name;
      nlohmann::json& entry = tensors[name];
      entry["shape"] = t.global_shape();
      entry["dtype"] = "F32";
      entry["pieces"].push_back({{"file", file},
                                 {"key", name + lp.key_suffix},
                                 {"offset", lp.box.offset},
                                 {"box", lp.box.shape},
                                 {"begin", lp.box.box_begin},
                                 {"end", lp.box.box_end}});
    }
  }
  return tensors;
}

void finish_training_checkpoint(const std::string& dir, const std::string& tag,
                                const std::string& config, uint64_t seed, int64_t step,
                                const std::vector<nlohmann::json>& entries_of_file,
                                const std::map<int, FileChecksums>& written,
                                int64_t optimizer_steps, int world_size,
                                const LossScalerState* loss_scaler,
                                const nlohmann::json& moe_bias, const Fp8ScalingState* fp8) {
  nlohmann::json tensors = nlohmann::json::object();
  std::map<std::string, std::optional<FileChecksums>> files;  // nullopt: to be read back
  for (size_t i = 0; i < entries_of_file.size(); ++i) {
    const auto known = written.find(int(i));
    files[state_file_name(int(i))] =
        known != written.end() ? std::optional<FileChecksums>(known->second) : std::nullopt;
    for (const auto& [name, entry] : entries_of_file[i].items()) {
      nlohmann::json& merged = tensors[name];
      merged["shape"] = entry["shape"];
      merged["dtype"] = entry["dtype"];
      for (const nlohmann::json& piece : entry["pieces"]) merged["pieces"].push_back(piece);
    }
  }
  nlohmann::json meta = {
      {"step", step},
      {"config", config},
      {"data", {{"seed", seed}, {"next_step", step}}},
      {"optimizer", {{"name", "adamw"}, {"steps_taken", optimizer_steps}}},
      {"mesh", {{"world_size", world_size}, {"files", files.size()}}},
      {"tensors", tensors}};
  if (loss_scaler)
    meta["loss_scaler"] = {{"scale", loss_scaler->scale},
                           {"good_steps", loss_scaler->good_steps},
                           {"hysteresis_left", loss_scaler->hysteresis_left}};
  if (!moe_bias.is_null()) meta["moe_bias"] = moe_bias;
  if (fp8) {
    const int64_t n = int64_t(fp8->names.size());
    CLEAVE_CHECK(fp8->scales.size() == size_t(3 * n) &&
                     fp8->history.size() == size_t(fp8->steps() * 3 * n),
                 "checkpoint " << dir << ": the FP8 state has not 3 values per linear");
    const std::vector<TensorView> views = {
        {"scales", "F32", {n, 3}, fp8->scales.data(), uint64_t(fp8->scales.size()) * 4},
        {"amax_history", "F32", {fp8->steps(), n, 3}, fp8->history.data(),
         uint64_t(fp8->history.size()) * 4}};
    files[kFp8File] = write_safetensors(
        checkpoint_temp_folder(dir, tag) + "/" + kFp8File, views,
        {{"format", "cleave-checkpoint"}, {"names", nlohmann::json(fp8->names).dump()}});
    meta["fp8"] = {{"file", kFp8File},
                   {"recipe", fp8->delayed ? "delayed" : "current"},
                   {"linears", n},
                   {"history_steps", fp8->steps()}};
  }
  finish_checkpoint_folder(dir, tag, meta, files);
}

int64_t checkpoint_optimizer_steps(const LoadedCheckpoint& ck, const std::string& dir) {
  CLEAVE_CHECK(ck.meta.contains("optimizer") && ck.meta["optimizer"].contains("steps_taken") &&
                   ck.meta["optimizer"]["steps_taken"].is_number_integer(),
               "checkpoint " << dir << "/meta.json has no integer optimizer.steps_taken");
  return ck.meta["optimizer"]["steps_taken"].get<int64_t>();
}

void check_saved_shapes(const LoadedCheckpoint& ck, const std::string& dir,
                        const ParamStore& params, const std::string& kind) {
  for (const ParamTensor& t : params.tensors())
    saved_pieces(ck, dir, kind + "/" + t.name, t.global_shape());
}

void check_saved_pieces(const LoadedCheckpoint& ck, const std::string& dir) {
  if (!ck.meta.contains("tensors")) return;
  CLEAVE_CHECK(ck.meta["tensors"].is_object(), "checkpoint " << dir << "/meta.json: \"tensors\" "
                                                                     "is not an object");
  for (const auto& [name, t] : ck.meta["tensors"].items()) {
    CLEAVE_CHECK(t.is_object() && t.contains("shape") && t["shape"].is_array(),
                 "checkpoint " << dir << "/meta.json: tensor " << name << " has no shape");
    std::vector<int64_t> shape;
    for (const nlohmann::json& d : t["shape"]) {
      CLEAVE_CHECK(d.is_number_unsigned(), "checkpoint " << dir << "/meta.json: tensor " << name
                                                         << " has an invalid shape");
      shape.push_back(d.get<int64_t>());
    }
    CLEAVE_CHECK(shape.size() <= 2, "checkpoint " << dir << "/meta.json: tensor " << name
                                                  << " has " << shape.size() << " dimensions");
    saved_pieces(ck, dir, name, shape);
  }
}

void read_state(const LoadedCheckpoint& ck, const std::string& dir, const ParamStore& params,
                const std::string& kind, const std::vector<FlatRange>& ranges, RangeBuffer out) {
  // Each box this rank holds, row by row (a row of a box is contiguous in the global tensor and
  // in every saved box), from whichever saved pieces overlap it.
  const std::vector<TensorPiece> pieces = tensor_pieces(params, ranges);
  for (const TensorPiece& piece : pieces) {
    const ParamTensor& t = params.tensor(piece.tensor);
    const std::string name = kind + "/" + t.name;
    const std::vector<SavedPiece> saved = saved_pieces(ck, dir, name, t.global_shape());
    float* dst = piece.in(out);
    for (const GlobalBox& b : global_boxes(t.placement, t.shape, piece.begin, piece.end)) {
      int64_t off[2], shape[2];
      as_2d(b.offset, off, 0);
      as_2d(b.shape, shape, 1);
      for (int64_t e = b.box_begin; e < b.box_end;) {
        const int64_t r = e / shape[1], c0 = e % shape[1];
        const int64_t c1 = std::min(shape[1], c0 + (b.box_end - e));
        const int64_t gr = off[0] + r;
        float* row_dst = dst + (b.local_begin - piece.begin) + (e - b.box_begin);
        for (const SavedPiece& s : saved) {
          if (gr < s.offset[0] || gr >= s.offset[0] + s.shape[0]) continue;
          const int64_t lo = std::max(off[1] + c0, s.offset[1]);
          const int64_t hi = std::min(off[1] + c1, s.offset[1] + s.shape[1]);
          if (lo >= hi) continue;
          const int64_t first = (gr - s.offset[0]) * s.shape[1] + (lo - s.offset[1]);
          const int64_t a = std::max(first, s.begin), z = std::min(first + (hi - lo), s.end);
          if (a < z)
            s.file->read_f32_elements(s.key, s.end - s.begin, a - s.begin, z - a,
                                      row_dst + (lo - off[1] - c0) + (a - first));
        }
        e += c1 - c0;
      }
    }
  }
}

std::optional<Fp8ScalingState> checkpoint_fp8_state(const LoadedCheckpoint& ck,
                                                    const std::string& dir) {
  if (!ck.meta.contains("fp8") || ck.meta["fp8"].empty()) return std::nullopt;
  const nlohmann::json& j = ck.meta["fp8"];
  Fp8ScalingState out;
  if (!j.contains("file")) {  // format 3: {linear: {"scales": [3], "amax_history": [[3]...]}}
    try {
      for (const auto& [name, t] : j.items()) {
        out.names.push_back(name);
        for (const nlohmann::json& v : t.at("scales")) out.scales.push_back(v.get<float>());
        out.delayed = t.contains("amax_history");
      }
      const size_t steps = out.delayed ? j.begin()->at("amax_history").size() : 0;
      out.history.assign(steps * 3 * out.names.size(), 0.0f);
      for (size_t s = 0; s < out.names.size() && out.delayed; ++s) {
        const nlohmann::json& rows = j[out.names[s]].at("amax_history");
        CLEAVE_CHECK(rows.size() == steps, "checkpoint " << dir << "/meta.json: fp8 history of "
                                                         << out.names[s] << " has "
                                                         << rows.size() << " steps, not " << steps);
        for (size_t i = 0; i < steps; ++i)
          for (size_t k = 0; k < 3; ++k)
            out.history[(i * out.names.size() + s) * 3 + k] = rows[i].at(k).get<float>();
      }
    } catch (const nlohmann::json::exception& e) {
      CLEAVE_FAIL("checkpoint " << dir << "/meta.json: fp8: " << e.what());
    }
    return out;
  }
  const SafetensorsFile* file = nullptr;
  for (const SafetensorsFile& f : ck.files)
    if (f.path() == dir + "/" + kFp8File) file = &f;
  CLEAVE_CHECK(file != nullptr, "checkpoint " << dir << "/meta.json names the FP8 state's file "
                                              << kFp8File << " but does not list it in files");
  try {
    out.names = nlohmann::json::parse(file->metadata().at("names")).get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    CLEAVE_FAIL(file->path() << ": no list of FP8 linears in its metadata: " << e.what());
  }
  const int64_t n = int64_t(out.names.size());
  out.delayed = j.value("recipe", std::string()) == "delayed";
  const auto history = file->tensors().find("amax_history");
  CLEAVE_CHECK(history != file->tensors().end() && history->second.shape.size() == 3,
               file->path() << ": no amax_history [steps, linears, 3]");
  const int64_t steps = history->second.shape[0];
  out.scales.resize(size_t(3 * n));
  out.history.resize(size_t(steps * 3 * n));
  file->read_f32("scales", {n, 3}, out.scales.data());
  file->read_f32("amax_history", {steps, n, 3}, out.history.data());
  return out;
}

void read_moe_biases(const LoadedCheckpoint& ck, const std::string& dir,
                     const std::vector<std::pair<int, std::vector<float>*>>& biases) {
  for (const auto& [layer, bias] : biases) {
    const std::string key = std::to_string(layer);
    CLEAVE_CHECK(ck.meta.contains("moe_bias") && ck.meta["moe_bias"].contains(key),
                 "checkpoint " << dir << "/meta.json has no moe_bias of layer " << layer
                               << " (model.moe_router = \"sigmoid_bias\" keeps one per MoE layer)");
    const nlohmann::json& saved = ck.meta["moe_bias"][key];
    CLEAVE_CHECK(saved.is_array() && saved.size() == bias->size(),
                 "checkpoint " << dir << "/meta.json: moe_bias of layer " << layer << " holds "
                               << (saved.is_array() ? saved.size() : 0) << " numbers for "
                               << bias->size() << " experts");
    for (size_t e = 0; e < bias->size(); ++e) (*bias)[e] = saved[e].get<float>();
  }
}

std::optional<LossScalerState> checkpoint_loss_scaler(const LoadedCheckpoint& ck,
                                                      const std::string& dir) {
  if (!ck.meta.contains("loss_scaler")) return std::nullopt;
  const nlohmann::json& s = ck.meta["loss_scaler"];
  CLEAVE_CHECK(s.is_object() && s.contains("scale") && s["scale"].is_number() &&
                   s.contains("good_steps") && s["good_steps"].is_number_integer() &&
                   s.contains("hysteresis_left") && s["hysteresis_left"].is_number_integer(),
               "checkpoint " << dir << "/meta.json: loss_scaler needs a number scale and integer "
                                "good_steps and hysteresis_left");
  return LossScalerState{s["scale"].get<double>(), s["good_steps"].get<int64_t>(),
                         s["hysteresis_left"].get<int>()};
}

}  // namespace cleave
