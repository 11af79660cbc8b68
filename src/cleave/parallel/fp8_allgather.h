// ZeRO-3's gather of a unit with its FP8 linears' weights as FP8 bytes (parallel.fp8_allgather;
// docs/precision.md#fp8): each rank quantises the weights in its slice with the whole weight's
// per-tensor scale and sends one byte per value where the fp32 gather sends four; the other
// tensors of the unit (norms, biases, embeddings) travel in fp32 beside them. The gathered unit
// holds the dequantised weights; their products are told the gather's scale and the master
// shard's amax (LinearGemm::set_fp8_gathered_weight) and quantise them again to the same codes:
// bitwise the products and scales of a gather in fp32.
//
// The scale: delayed's, the one the product will use (LinearGemm::fp8_scales); current's, from
// the weight's amax completed over the shard group, one small all-gather per unit.
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/comm/group.h"
#include "cleave/model/params.h"

namespace cleave {

class Fp8Allgather {
 public:
  // bounds: the unit bounds of DataParallel; the FP8 weights are the store's tensors whose packing
  // product is fp8 (ParamStore::packed_by).
  Fp8Allgather(ParamStore& store, Group& shard, std::vector<int64_t> bounds, bool current,
               int margin);
  // Whether unit u holds FP8 weights; a unit without (the embeddings) is gathered in fp32, in
  // place, by the caller.
  bool covers(int unit) const { return !pieces_[size_t(unit)].empty(); }
  // Starts gathering unit u from this rank's slice `mine` into the store's values; returns the
  // seconds waited for current's amax (0 for delayed).
  double start(int unit, const float* mine);
  // Waits for unit u's gather and places every rank's slice; returns the seconds waited.
  double finish(int unit);
  // Bytes this rank's slice of unit u sends (what an fp32 gather sends: 4 x slice).
  int64_t bytes(int unit) const;

 private:
  struct Piece {  // an FP8 weight's part of a unit: [begin, end) of the flat buffer
    int64_t begin, end;
    int tensor;
  };
  struct InFlight {
    int unit = -1;
    Buffer<uint8_t> codes, all_codes;
    Buffer<float> others, all_others;
    std::vector<float> scales, shard_amax;  // per piece of the unit
    Work codes_work, others_work;
  };
  int64_t slice(int unit) const {
    return (bounds_[size_t(unit) + 1] - bounds_[size_t(unit)]) / ranks_;
  }
  // Calls fp8(piece, begin, end) and other(begin, end) for the runs of rank r's slice of unit u.
  template <typename Fp8, typename Other>
  void walk(int unit, int r, Fp8 fp8, Other other) const;

  ParamStore& store_;
  Group& shard_;
  std::vector<int64_t> bounds_;
  bool current_;
  int margin_, ranks_;
  std::vector<std::vector<Piece>> pieces_;  // per unit
  std::vector<int64_t> max_others_;         // per unit: the most fp32 values any slice sends
  std::vector<InFlight> flights_;
};

}  // namespace cleave
