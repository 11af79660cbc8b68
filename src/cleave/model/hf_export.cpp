#include "cleave/model/hf_export.h"

#include "cleave/base/check.h"

namespace cleave {

namespace {

std::string dims(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const float* hf_source(const ParamStore& store, const HfEntry& e, const float* flat) {
  const int i = store.find(e.param);
  CLEAVE_CHECK(i >= 0, "no parameter " << e.param << " (Hugging Face's " << e.hf << ")");
  const ParamTensor& t = store.tensor(i);
  CLEAVE_CHECK(t.shape == e.param_shape, "parameter " << e.param << " has shape " << dims(t.shape)
                                                      << ", the Hugging Face table "
                                                      << dims(e.param_shape));
  return flat + t.offset;
}

std::vector<HfTensor> hf_tensors(const ParamStore& store, const ModelConfig& cfg, const float* flat,
                                 const std::map<int, std::vector<float>>& router_bias) {
  std::vector<HfTensor> out;
  visit_hf_layout(cfg, [&](const HfEntry& e) {
    if (e.layout == HfLayout::router_bias) {
      const auto it = router_bias.find(e.layer);
      if (it == router_bias.end()) return true;
      CLEAVE_CHECK(int64_t(it->second.size()) == e.hf_numel(),
                   "layer " << e.layer << " has " << it->second.size() << " router biases for "
                            << e.hf_numel() << " experts");
      out.push_back({e.hf, e.hf_shape(), it->second});
      return true;
    }
    HfTensor h{e.hf, e.hf_shape(), std::vector<float>(size_t(e.hf_numel()))};
    e.to_hf(hf_source(store, e, flat), h.data.data());
    out.push_back(std::move(h));
    return true;
  });
  return out;
}

}  // namespace cleave
