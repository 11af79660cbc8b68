// The data-parallel family over one parameter group's region of the flat gradient and parameter
// buffers (docs/architecture.md, Placements and Parameter groups): one DataParallel per group,
// each over the mesh axes the trainer maps the group to.
// Ranks of dp_replicate hold replicas; ranks of dp_shard shard what zero_stage says:
//   0  DDP: gradients all-reduced in buckets, each started as soon as backward has finished the
//      gradients it holds, overlapping the rest of backward; every rank updates everything.
//   1  ZeRO-1: the same all-reduce; each rank updates only its shard (its optimizer state is
//      only that shard; it updates the values in place); the updated shards are all-gathered
//      in place after the step.
//   2  ZeRO-2: each unit's gradients are reduce-scattered over dp_shard as soon as backward has
//      finished the unit (its shard then all-reduced over dp_replicate, also during backward), so
//      a rank receives only its shard; the unit's full gradients are released once reduced, so
//      at most a few units' are resident.
//      With gradient accumulation the earlier micro-batches accumulate into the full buffer (as
//      FSDP's no_sync does): fewer collectives, the full gradient resident until the last one.
//   3  ZeRO-3 / FSDP: as ZeRO-2, and the parameters too exist only as shards: each unit is
//      all-gathered just before its forward and again before its backward (the next one
//      prefetched), and released after use.
//      With dp_replicate > 1 this is HSDP. With an offload folder the fp32 shards live in a
//      memory-mapped file there (ZeRO-Infinity's parameter offload): a unit's slice is read in
//      as its gather starts and dropped from resident memory once gathered; the update streams
//      through them (AdamW::stream_values).
// A shard is the rank's 1/dp_shard slice of every unit (embeddings, each block, the head).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/base/mapped_floats.h"
#include "cleave/comm/group.h"
#include "cleave/model/params.h"
#include "cleave/optim/adamw.h"
#include "cleave/parallel/comm_meter.h"
#include "cleave/parallel/fp8_allgather.h"
#include "cleave/pipeline/program.h"

namespace cleave {

struct DataParallelGroups {
  Group* dp = nullptr;         // every data-parallel rank (dp_replicate x dp_shard)
  Group* shard = nullptr;      // this rank's dp_shard group
  Group* replicate = nullptr;  // this rank's dp_replicate group
};

// Its CommMeter (the dp row of the step's traffic) counts every collective of the family: bucket
// all-reduces, reduce-scatters, the replicas' all-reduces and parameter gathers, as rings.
class DataParallel : public CommMeter {
 public:
  // unit_bounds: the group's ParamStore::unit_bounds(g), each a multiple of 16 x dp_shard.
  // Under ZeRO-3 the store's values are not materialised: the shards are initialised from seed.
  // Gathering and releasing a unit's values is a write the store is told of (a release also
  // frees the unit's packed weights: ZeRO-3 keeps none between uses).
  DataParallel(ParamStore& store, DataParallelGroups groups, int zero_stage, double bucket_mb,
               std::vector<int64_t> unit_bounds, uint64_t seed,
               const std::string& offload_dir = "");

  // The flat ranges this rank updates; its shard buffers hold them one after the other.
  const std::vector<FlatRange>& ranges() const { return ranges_; }

  // The instructions of a step program (pipeline/program.h) this layout answers. ZeRO-3 gathers a
  // unit's parameters (waiting), starts gathering them ahead, and releases them; below ZeRO-3
  // they are always resident and these do nothing. reduce_gradients: the unit's gradients are
  // final for this step: DDP and ZeRO-1 start every bucket whose units are all final, ZeRO-2 and
  // 3 reduce-scatter the unit (and all-reduce its shard over dp_replicate).
  void gather(int unit);
  void prefetch(int unit);
  void release(int unit);
  void reduce_gradients(int unit);

  void zero_gradients();
  // After backward of the last micro-batch: where the optimizer finds the values of this rank's
  // ranges and their synchronised gradients (the store's flat buffers or the shard buffers).
  struct OptimizerInputs {
    RangeBuffer values, grads;
  };
  OptimizerInputs finish_gradients();
  // Sum of squares of the whole synchronised gradient (the same on every rank).
  double grad_sum_of_squares();
  // After the optimizer updated the ranges: ZeRO-1/2 all-gather the new values; ZeRO-3 gathers
  // each unit when it is next used.
  void after_optimizer_step();

  // The values of ranges(): the store's flat buffer, or ZeRO-3's packed shard.
  RangeBuffer values();
  // ZeRO-3 with an offload folder: the file its shard lives in (else null); drop_offloaded takes
  // all of it out of resident memory (after a checkpoint read or wrote it whole).
  const MappedFloats* offloaded_values() const;
  void drop_offloaded();

  // Checkpoints hold one file per distinct shard: DDP's whole state is one (written by rank 0),
  // ZeRO's one per dp_shard rank (written by the first replica). checkpoint_file() is the file
  // this rank writes, or -1; ranges_of(i) are the flat ranges of file i.
  int checkpoint_files() const;
  int checkpoint_file() const;
  std::vector<FlatRange> ranges_of(int shard_rank) const;

  // ZeRO-3: the bytes this rank's slices sent into parameter gathers since the last call.
  int64_t take_gather_bytes() { return std::exchange(gather_bytes_, 0); }
  // ZeRO-3 with FP8 products: gather their weights as FP8 bytes (parallel/fp8_allgather.h), with
  // current scaling's scales (current) or the products' delayed ones.
  void gather_fp8(bool current, int margin);

 private:
  struct Bucket {
    int64_t begin, end;  // flat range; buckets are cut from the top down (backward order)
    Work work;
    bool launched = false;
  };
  int n_units() const { return int(bounds_.size()) - 1; }
  int64_t slice(int unit) const;  // length of this rank's part of a unit
  void launch_ready_buckets();
  void unit_gradients_done(int unit);
  void gather_all_parameters();  // ZeRO-1/2 after the step: every rank's updated slices
  const float* shard_source(int unit);  // this rank's values of a unit, which all-gather sends

  ParamStore& store_;
  DataParallelGroups g_;
  int zero_stage_;
  std::vector<int64_t> bounds_;
  std::vector<FlatRange> ranges_;
  std::vector<int64_t> position_;  // where each unit's slice starts in the shard buffers
  Buffer<float> shard_values_;  // ZeRO-3 (below it the shard lives in the store's buffer)
  MappedFloats shard_file_;     // ZeRO-3 offloaded: the shard in a file instead
  float* shard_ = nullptr;      // ZeRO-3: whichever of the two holds the shard
  Buffer<float> shard_grads_;   // ZeRO-2 and 3
  std::vector<Bucket> buckets_;
  std::vector<Work> grad_work_, replicate_work_, gather_work_;  // per unit
  std::vector<int> grads_pending_;             // ZeRO-2/3: units whose reduce-scatter is in flight
  std::vector<bool> resident_;                 // ZeRO-3: the unit's parameters are gathered
  std::vector<bool> gathering_;                // ZeRO-3: the unit's gather is in flight
  std::unique_ptr<Fp8Allgather> fp8_;          // parallel.fp8_allgather
  int64_t gather_bytes_ = 0;
  std::vector<bool> final_;                    // DDP, ZeRO-1: the unit's gradients are final
};

// The floats of each of DDP's and ZeRO-1's gradient all-reduce buckets (parallel.bucket_mb, MiB):
// whole multiples of 16 floats, at least 16.
int64_t bucket_floats(double bucket_mb);

// Which of `program`'s instructions start a ZeRO-3 gather of a unit's parameters (one flag per
// instruction): a gather or prefetch of a unit neither resident nor in flight, release making the
// unit absent again (DataParallel's rules, for predictions from the program).
std::vector<bool> zero3_gather_starts(const Program& program, int n_units);
// The most that ZeRO-3's gathered units hold at once as `program` runs. values: the largest sum of
// per_unit[u] (a unit's floats) over the units gathered or being prefetched at one time. copies:
// what the units' weight copies (copies[u], bytes; none when empty) add, in bytes, to the values'
// bytes at the peak of both together. A unit's forward or recompute makes its rounding and forward
// copies, its backward its rounding and backward copies, and its release frees them all.
// packed: per instruction, the bytes of copies it makes (packs), which a unit still gathered since
// its last pass already has.
struct Zero3Peak {
  int64_t values = 0;  // floats
  int64_t copies = 0;  // bytes
  std::vector<int64_t> packed;
};
Zero3Peak zero3_peak(const Program& program, const std::vector<int64_t>& per_unit,
                     const std::vector<LinearGemm::WeightCopies>& copies = {});

}  // namespace cleave
