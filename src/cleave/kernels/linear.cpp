// LinearGemm: the three products of a linear layer as cached oneDNN matmul primitives.
//
// Layout (PyTorch): W [out, in] row-major. Each product is a matmul C[M,Nc] = A[M,K] B[K,Nc]:
//   forward         y[N,out]   = x[N,in]     * W^T[in,out]   B = W viewed with strides {1, in}
//   backward_input  dx[N,in]   = dy[N,out]   * W[out,in]     B = W, plain
//   backward_weight dW[out,in] = dy^T[out,N] * x[N,in]       A = dy viewed with strides {1, out}
// Transposes are memory-descriptor strides, never copies. "+=" is the sum post-op (scale 1), so
// the destination is read and accumulated in place without temporaries.
//
// Prepacking: the forward and backward_input primitives are created with format_tag::any for
// the weights; their preferred (blocked) layout is queried and W is packed into it once after
// each set_weight (lazily, at the next product that needs one). Every stale layout is packed in
// that one pass over W (kernels/weight_pack.h); a layout the packer does not know goes through
// oneDNN's reorder. A plain preferred layout is not copied: the plan reads W in place instead.
// In bf16 mode packing also converts to bf16. The packed buffers are keyed by (role, memory
// descriptor), so token counts whose primitives want the same layout share one packed copy.
//
// bf16 mode: x is converted to bf16 in forward and dy in backward_input, into the caller's
// OperandCopy when it keeps one for backward_weight, else into a per-thread scratch buffer.
// oneDNN accumulates in fp32; dst is fp32.
//
// Emulated bf16 (native_bf16_products() false: an AVX2-only CPU): the plans are fp32, the weight is
// rounded to bf16 once per version as fp16 mode rounds it, and every bf16 operand (a conversion,
// a kept copy, an FP8 image) is widened to fp32 into per-thread scratch just before its product.
//
// fp16 mode: fp32 products of operands rounded to fp16. The weight is rounded once per version
// into `rounded` and packed (or used) from there; x and dy are rounded into per-thread scratch
// for each product, forward's and backward_weight's alike, so nothing is kept between products.
//
// fp8 mode (kernels/linear_fp8.h): bf16 products of FP8 images; the weight's image is made once
// per version (and scale) and packed from there; a per-tensor recipe's result is multiplied by
// its operands' factors in an epilogue (into a temporary where the product accumulates). oneDNN
// 2.6's runtime output scales would fuse that, but they move bf16 products off the brgemm
// kernels and scale the bias too.
//
// Determinism: oneDNN's CPU matmul uses a static partition of the work for a given thread count,
// so a product is bitwise reproducible run to run. The bias gradient is a column sum where each
// column is summed over rows in a fixed order by one thread, so it does not depend on the thread
// count at all.
#include "cleave/kernels/linear.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"
#include "cleave/base/pseudo_random.h"
#include "cleave/base/spare_buffers.h"
#include "cleave/kernels/column_sums.h"
#include "cleave/kernels/convert.h"
#include "cleave/kernels/linear_fp8.h"
#include "cleave/kernels/weight_pack.h"

namespace cleave {

namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

DnnlContext& dnnl_context() {
  static DnnlContext ctx;
  return ctx;
}

// 64-byte aligned growable raw buffer (contents are not preserved on growth).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(ptr_); }
  void* reserve(size_t bytes) {
    if (bytes > cap_) {
      std::free(ptr_);
      size_t rounded = size_t(aligned_bytes(int64_t(bytes), 1));
      ptr_ = std::aligned_alloc(64, rounded);
      CLEAVE_CHECK(ptr_ != nullptr, "out of memory allocating " << rounded << " bytes");
      cap_ = rounded;
    }
    return ptr_;
  }
  void* data() const { return ptr_; }
  int64_t capacity() const { return int64_t(cap_); }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

enum class Role { forward, backward_input };

struct Plan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

struct PlansForN {
  std::optional<Plan> fwd, fwd_bias, bin, bin_acc, bwd_w, bwd_w_set;
};

// The storage of packed copies released with their ZeRO-3 unit (release_packed), for the next
// unit's: packing into freshly mapped pages faulted them in on every gather, which on a Zen 5 VM
// put a third of a ZeRO-3 step (d_model 512, 2 ranks) in the kernel. As many exist as units hold
// copies at once.
struct PackedSpares {
  std::mutex mutex;
  SpareBuffers<char> spares;
};
PackedSpares& packed_spares() {
  static PackedSpares s;
  return s;
}

struct Packed {
  Role role;
  memory::desc md;
  std::optional<kernels::BlockedLayout> layout;  // nullopt: oneDNN's reorder packs it
  // Ours rather than oneDNN's allocation, from the packed spares (below) when one fits.
  Buffer<char> storage;
  memory mem;
  uint64_t version = 0;  // weight version packed into mem; 0 = never packed
};

// oneDNN's ISAs are cumulative bit sets: a later one with AMX holds avx512_core_amx's bits.
bool has_isa(dnnl::cpu_isa i) {
  return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & unsigned(i)) == unsigned(i);
}

}  // namespace

bool native_bf16_products() {
  static const bool native = [] {
    const char* forced = std::getenv("CLEAVE_EMULATE_BF16");
    if (forced && std::string(forced) == "1") return false;
    try {
      const memory::desc a({1, 16}, dt::bf16, tag::ab), b({16, 16}, dt::bf16, tag::ab);
      const memory::desc c({1, 16}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), dnnl_context().engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

Precision product_dtype(Precision p) {
  if (p == Precision::fp16) return Precision::fp32;
  if (p == Precision::fp8) return Precision::bf16;
  return p;
}

Precision product_precision(Precision p) {
  const Precision d = product_dtype(p);
  return d == Precision::bf16 && !native_bf16_products() ? Precision::fp32 : d;
}

bool row_invariant_products(Precision p) {
  static const bool tiles_forced = [] {
    const char* forced = std::getenv("CLEAVE_ROW_TILES");
    return forced && std::string(forced) == "1";
  }();
  if (tiles_forced) return false;
  // Below AVX-512 (AVX2 only: Zen 3) even fp32's kernels change with the row count.
  if (!has_isa(dnnl::cpu_isa::avx512_core)) return false;
  return product_precision(p) != Precision::bf16 || !has_isa(dnnl::cpu_isa::avx512_core_amx);
}

struct LinearGemm::Impl {
  int in = 0, out = 0;
  Precision precision = Precision::fp32;
  bool emulated = false;  // bf16 products as fp32 products of bf16 values
  dt cdt = dt::f32;       // compute (operand) data type of the plans

  const float* weight = nullptr;
  // fp16 mode and emulated bf16: the weight rounded to fp16 or bf16, at `rounded_version`
  Buffer<float> rounded;
  uint64_t rounded_version = 0;
  std::optional<kernels::Fp8Operands> fp8;  // fp8 mode
  uint64_t own_version = 0;                 // bumped by set_weight; 0 = no weight yet
  const uint64_t* version = &own_version;   // the owner's counter, when it keeps one
  uint64_t weight_version() const { return *version; }

  std::map<int64_t, PlansForN> plans;  // by N; one entry, kVariable, with variable rows
  bool variable_rows = false;
  bool row_tiles = false;  // forward products in whole tiles of kInvariantRowTile rows
  static constexpr int64_t kVariable = -1;
  std::vector<Packed> packed;
  std::vector<kernels::PackTarget> row_targets;  // between begin_row_packing and all_rows_packed

  Impl(int in_features, int out_features, Precision p)
      : in(in_features), out(out_features), precision(p),
        emulated((p == Precision::bf16 || p == Precision::fp8) && !native_bf16_products()),
        cdt((p == Precision::bf16 || p == Precision::fp8) && !emulated ? dt::bf16 : dt::f32) {
    if (p == Precision::fp8) fp8.emplace(in, out);
  }

  // What the products read as W: the weight itself, (fp16 mode, emulated bf16) its rounding to
  // fp16 or bf16, or (fp8 mode) its FP8 image for the role's product.
  const float* source(Role role) {
    if (fp8) return fp8->weight_image(weight, role == Role::forward);
    if (precision != Precision::fp16 && !emulated) return weight;
    if (rounded_version != weight_version()) {
      if (rounded.size() != int64_t(in) * out) rounded.resize(int64_t(in) * out);
      (emulated ? kernels::round_to_bf16 : kernels::round_to_fp16)(rounded.data(), weight,
                                                                   int64_t(in) * out);
      rounded_version = weight_version();
    }
    return rounded.data();
  }

  Plan make_plan(const memory::desc& src, const memory::desc& wei, const memory::desc* bias,
                 const memory::desc& dst, bool accumulate) {
    auto& ctx = dnnl_context();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.f);
      attr.set_post_ops(po);
    }
    std::optional<dnnl::matmul::desc> d;
    if (bias)
      d.emplace(src, wei, *bias, dst);
    else
      d.emplace(src, wei, dst);
    Plan plan;
    plan.pd = dnnl::matmul::primitive_desc(*d, attr, ctx.engine);
    plan.prim = dnnl::matmul(plan.pd);
    return plan;
  }

  // A product's plan with W as its B operand (W^T when transposed): the weights' format is
  // `any`, so oneDNN names the layout it prefers and W is packed into it, unless that layout is
  // plain: a plain layout reads no faster than W as it lies (the product takes either transpose
  // through strides), so the plan reads W in place. On an AVX2-only CPU, whose matmul wants W^T
  // in rows, that saves a transposing copy of every weight per update.
  Plan product_plan(const memory::desc& src, bool transposed, const memory::desc* bias,
                    const memory::desc& dst, bool accumulate) {
    Plan plan = make_plan(src, weights(transposed), bias, dst, accumulate);
    if (reads_in_place(plan.pd.weights_desc(), transposed) &&
        plan.pd.weights_desc() != user_weights(transposed))
      plan = make_plan(src, user_weights(transposed), bias, dst, accumulate);
    return plan;
  }
  // W as it lies, in the products' type.
  memory::desc user_weights(bool transposed) const {
    return kernels::user_weight_desc(out, in, transposed, cdt);
  }
  // Whether a product whose plan wants `want` reads what source() gives (W, its rounding or its
  // FP8 image, fp32 and as W lies) without a copy: packed_weights' test.
  bool reads_source(const memory::desc& want, bool transposed) const {
    return want == kernels::user_weight_desc(out, in, transposed);
  }
  // Whether a plan that prefers `want` reads W in place: it reads source() as it is, or `want` is
  // plain, the products' type is fp32 and W (or its rounded copy, kept per version) is what the
  // product reads (product_plan then takes W as it lies). FP8's image is made per use in a shared
  // buffer, so it stays packed once per version.
  bool reads_in_place(const memory::desc& want, bool transposed) const {
    return reads_source(want, transposed) || (cdt == dt::f32 && !fp8 && kernels::is_plain(want));
  }
  memory::desc preferred_weights(int64_t N, bool transposed) const;

  // The plans' key and row count for N rows: N, or with variable rows one plan whose rows are
  // given at each execution, and the weights in their own layout.
  int64_t key(int64_t N) const { return variable_rows ? kVariable : N; }
  memory::dim rows(int64_t N) const { return variable_rows ? DNNL_RUNTIME_DIM_VAL : N; }
  memory::desc weights(bool transposed) const {
    if (!variable_rows) return memory::desc(transposed ? memory::dims{in, out} : memory::dims{out, in}, cdt, tag::any);
    return transposed ? memory::desc({in, out}, cdt, memory::dims{1, in})
                      : memory::desc({out, in}, cdt, memory::dims{in, 1});
  }
  // An operand's descriptor for this call: the plan's, or with variable rows the same with N.
  memory::desc at(const memory::desc& planned, memory::dims dims, memory::dims strides) const {
    if (!variable_rows) return planned;
    return memory::desc(dims, planned.data_type(), strides);
  }

  // forward: src x[N,in], weights W^T[in,out] (product_plan's), dst y[N,out], bias [1,out].
  Plan& forward_plan(int64_t N, bool with_bias) {
    auto& slot = with_bias ? plans[key(N)].fwd_bias : plans[key(N)].fwd;
    if (!slot) {
      N = rows(N);
      memory::desc src({N, in}, cdt, tag::ab);
      memory::desc dst({N, out}, dt::f32, tag::ab);
      memory::desc bias({1, out}, dt::f32, tag::ab);
      slot = product_plan(src, true, with_bias ? &bias : nullptr, dst, false);
    }
    return *slot;
  }

  // backward_input: src dy[N,out], weights W[out,in] (product_plan's), dst dx[N,in].
  Plan& backward_input_plan(int64_t N, bool accumulate) {
    auto& slot = accumulate ? plans[key(N)].bin_acc : plans[key(N)].bin;
    if (!slot) {
      N = rows(N);
      memory::desc src({N, out}, cdt, tag::ab);
      memory::desc dst({N, in}, dt::f32, tag::ab);
      slot = product_plan(src, false, nullptr, dst, accumulate);
    }
    return *slot;
  }

  // backward_weight: src dy^T[out,N] (strides {1,out}), weights x[N,in], dst dW[out,in] (+=,
  // or = for an fp8 product whose result is scaled before it is added).
  Plan& backward_weight_plan(int64_t N, bool accumulate = true) {
    auto& slot = accumulate ? plans[key(N)].bwd_w : plans[key(N)].bwd_w_set;
    if (!slot) {
      N = rows(N);
      memory::desc src({out, N}, cdt, memory::dims{1, out});
      memory::desc wei({N, in}, cdt, tag::ab);
      memory::desc dst({out, in}, dt::f32, tag::ab);
      slot = make_plan(src, wei, nullptr, dst, accumulate);
    }
    return *slot;
  }

  // The weights in the layout `plan` wants, repacked if set_weight was called since.
  memory packed_weights(Role role, const Plan& plan) {
    CLEAVE_CHECK(weight != nullptr, "LinearGemm: set_weight was never called");
    auto& ctx = dnnl_context();
    memory::desc want = plan.pd.weights_desc();
    if (reads_source(want, role == Role::forward))
      return memory(want, ctx.engine, const_cast<float*>(source(role)));
    Packed* entry = nullptr;
    for (auto& p : packed)
      if (p.role == role && p.md == want) entry = &p;
    if (!entry) {
      Buffer<char> storage;
      {
        PackedSpares& s = packed_spares();
        std::lock_guard<std::mutex> lock(s.mutex);
        s.spares.fill(storage, int64_t(want.get_size()));
      }
      memory mem(want, ctx.engine, storage.data());
      packed.push_back(Packed{role, want, kernels::blocked_layout(want), std::move(storage),
                              std::move(mem), 0});
      entry = &packed.back();
    }
    if (entry->version != weight_version()) repack(role);
    return entry->mem;
  }

  // What the packer needs to write copy p (which has a layout it knows).
  static kernels::PackTarget target_of(Packed& p, bool streaming) {
    return {&*p.layout, p.role == Role::forward, p.storage.data(), streaming};
  }

  // Brings every packed copy up to the current weight version; the one for `now` stays in cache.
  // Copies whose roles read the same source are packed in one pass over it.
  void repack(Role now) {
    auto& ctx = dnnl_context();
    const bool per_role = fp8 && fp8->weight_images_differ();
    std::vector<kernels::PackTarget> targets[2];
    for (Packed& p : packed) {
      if (p.version == weight_version()) continue;
      p.version = weight_version();
      if (p.layout) {
        targets[per_role && p.role == Role::backward_input].push_back(target_of(p, p.role != now));
        continue;
      }
      memory src(kernels::user_weight_desc(out, in, p.role == Role::forward), ctx.engine,
                 const_cast<float*>(source(p.role)));
      dnnl::reorder(src, p.mem).execute(ctx.stream, src, p.mem);
      ctx.stream.wait();
    }
    for (int k = 0; k < 2; ++k)
      if (!targets[k].empty())
        kernels::pack_weight(source(k ? Role::backward_input : Role::forward), out, in, targets[k]);
  }

  // oneDNN's scratchpad, one per thread for every product: a product needs it only while it runs,
  // and one per layer would hold a few [N, d] floats per layer for nothing (bench/tp_memory.sh).
  static AlignedBuffer& scratch() {
    static thread_local AlignedBuffer buffer;
    return buffer;
  }

  memory scratchpad(const Plan& plan) {
    memory::desc md = plan.pd.scratchpad_desc();
    void* p = scratch().reserve(std::max<size_t>(md.get_size(), 64));
    return memory(md, dnnl_context().engine, p);
  }

  void execute(const Plan& plan, const memory& src, const memory& wei, const memory* bias,
               const memory& dst) {
    auto& ctx = dnnl_context();
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                         {DNNL_ARG_WEIGHTS, wei},
                                         {DNNL_ARG_DST, dst},
                                         {DNNL_ARG_SCRATCHPAD, scratchpad(plan)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, *bias);
    plan.prim.execute(ctx.stream, args);
    ctx.stream.wait();
  }

  // Conversions nobody keeps, per thread and shared by every product: an operand and the other
  // operand of the same product.
  static AlignedBuffer& scratch_operand(int which) {
    static thread_local AlignedBuffer buffers[2];
    return buffers[which];
  }

  // Emulated bf16: the bf16 values of operand `which` widened to fp32, per thread.
  static AlignedBuffer& widened(int which) {
    static thread_local AlignedBuffer buffers[2];
    return buffers[which];
  }
  // What a product reads for bf16 operand values b: b itself, or emulated, their fp32 widening.
  void* bf16_operand(const bf16* b, int64_t count, int which) {
    if (!emulated) return const_cast<bf16*>(b);
    float* w = static_cast<float*>(widened(which).reserve(size_t(count) * sizeof(float)));
    kernels::bf16_to_f32(w, b, count);
    return w;
  }

  // Operand memory: the fp32 array itself, its fp16 rounding into scratch operand `which`, or its
  // bf16 conversion into `keep` (when the caller keeps it) or into that scratch.
  void* operand(const float* a, int64_t count, OperandCopy* keep, int which) {
    if (precision == Precision::fp16) {
      float* r = static_cast<float*>(scratch_operand(which).reserve(size_t(count) * sizeof(float)));
      kernels::round_to_fp16(r, a, count);
      return r;
    }
    if (precision != Precision::bf16) return const_cast<float*>(a);
    bf16* b = keep ? keep->refill(count)
                   : static_cast<bf16*>(
                         scratch_operand(which).reserve(size_t(count) * sizeof(bf16)));
    kernels::f32_to_bf16(b, a, count);
    return bf16_operand(b, count, which);
  }

  // fp8 mode: an image into scratch operand `which`.
  bf16* fp8_image_buffer(int64_t count, int which) {
    return static_cast<bf16*>(scratch_operand(which).reserve(size_t(count) * sizeof(bf16)));
  }
  // A temporary fp32 result that is scaled before it is added to the destination.
  static AlignedBuffer& scaled_result_buffer() {
    static thread_local AlignedBuffer buffer;
    return buffer;
  }
  static float* fp8_result(int64_t count) {
    return static_cast<float*>(scaled_result_buffer().reserve(size_t(count) * sizeof(float)));
  }

  // y = x W^T (+ bias), x's operand memory from operand() once the weights are packed (so that
  // the copy just packed is still in cache).
  template <class Operand>
  void forward_product(float* y, int64_t N, const float* bias, Operand operand) {
    if (row_tiles) return forward_tiles(y, N, bias, operand());
    auto& ctx = dnnl_context();
    Plan& plan = forward_plan(N, bias != nullptr);
    memory wei = packed_weights(Role::forward, plan);
    memory src(at(plan.pd.src_desc(), {N, in}, {in, 1}), ctx.engine, operand());
    memory dst(at(plan.pd.dst_desc(), {N, out}, {out, 1}), ctx.engine, y);
    if (bias) {
      memory b(plan.pd.bias_desc(), ctx.engine, const_cast<float*>(bias));
      execute(plan, src, wei, &b, dst);
    } else {
      execute(plan, src, wei, nullptr, dst);
    }
  }

  // forward_product with each row getting the bits of its tile of kInvariantRowTile rows (the
  // operand x: N rows of `in` values of the products' type), whatever N is. The tiles run as one
  // product of N rows padded to whole tiles where this CPU's primitive for that many rows gives
  // every tile the bits of the tile's own product (tiles_agree: on AMX it reads the weights once
  // instead of once a tile), else tile by tile.
  void forward_tiles(float* y, int64_t N, const float* bias, const void* x) {
    constexpr int64_t R = kInvariantRowTile;
    const int64_t padded = (N + R - 1) / R * R;
    if (padded == R || tiles_agree(padded, bias != nullptr))
      return padded_product(y, N, padded, bias, x);
    const size_t row_bytes = size_t(in) * memory::data_type_size(cdt);
    for (int64_t r = 0; r < N; r += R)
      padded_product(y + r * out, std::min(R, N - r), R, bias,
                     static_cast<const char*>(x) + size_t(r) * row_bytes);
  }

  // y[n, out] from the `count`-row primitive (count >= n), x's n rows copied into a tile padded
  // with zero rows where n < count, and the result's rows copied out.
  void padded_product(float* y, int64_t n, int64_t count, const float* bias, const void* x) {
    if (n == count) return product_rows(y, n, bias, x);
    const size_t row_bytes = size_t(in) * memory::data_type_size(cdt);
    char* rows = static_cast<char*>(tile_buffer(0).reserve(size_t(count) * row_bytes));
    std::memcpy(rows, x, size_t(n) * row_bytes);
    std::memset(rows + size_t(n) * row_bytes, 0, size_t(count - n) * row_bytes);
    float* out_rows = static_cast<float*>(tile_buffer(1).reserve(size_t(count * out) * sizeof(float)));
    product_rows(out_rows, count, bias, rows);
    std::memcpy(y, out_rows, size_t(n * out) * sizeof(float));
  }

  // y[N, out] = x W^T (+ bias) by the N-row primitive, x of the products' type.
  void product_rows(float* y, int64_t N, const float* bias, const void* x) {
    auto& ctx = dnnl_context();
    Plan& plan = forward_plan(N, bias != nullptr);
    memory wei = packed_weights(Role::forward, plan);
    std::optional<memory> b;
    if (bias) b.emplace(plan.pd.bias_desc(), ctx.engine, const_cast<float*>(bias));
    memory src(at(plan.pd.src_desc(), {N, in}, {in, 1}), ctx.engine, const_cast<void*>(x));
    memory dst(at(plan.pd.dst_desc(), {N, out}, {out, 1}), ctx.engine, y);
    execute(plan, src, wei, b ? &*b : nullptr, dst);
  }

  // Whether the `rows`-row primitive gives each of its tiles the bits the tile's own product
  // gives it. A primitive's blocking and summation order follow from its shapes and the thread
  // count alone, so one probe per shape, dtype, row count and thread count answers for every
  // input; the answer is kept for the process. The probe has weights, operand and bias of its own
  // (pseudo-random: a different order of summation shows in the low bits), never this linear's,
  // whose values (zeros, say) could agree in any order.
  bool tiles_agree(int64_t rows, bool with_bias) {
    constexpr int64_t R = kInvariantRowTile;
    static std::mutex mutex;
    static std::map<std::tuple<int, int, dt, int64_t, bool, int, bool>, bool> known;
    const auto key =
        std::make_tuple(in, out, cdt, rows, with_bias, omp_get_max_threads(), variable_rows);
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (auto it = known.find(key); it != known.end()) return it->second;
    }
    auto values = [](int64_t n, uint32_t seed) {
      std::vector<float> v(static_cast<size_t>(n));
      fill_pseudo_random(v, seed, 1.0f);
      return v;
    };
    const std::vector<float> w = values(int64_t(in) * out, 1), bias = values(out, 2),
                             x = values(rows * in, 3);
    Impl probe(in, out, precision);
    probe.variable_rows = variable_rows;
    probe.weight = w.data();
    ++probe.own_version;
    std::vector<bf16> x16(cdt == dt::bf16 ? x.size() : 0);
    for (size_t i = 0; i < x16.size(); ++i) x16[i] = to_bf16(x[i]);
    const char* operand = x16.empty() ? reinterpret_cast<const char*>(x.data())
                                      : reinterpret_cast<const char*>(x16.data());
    const size_t row_bytes = size_t(in) * memory::data_type_size(cdt);
    const float* b = with_bias ? bias.data() : nullptr;
    std::vector<float> whole(size_t(rows * out)), tiled(size_t(rows * out));
    probe.product_rows(whole.data(), rows, b, operand);
    for (int64_t r = 0; r < rows; r += R)
      probe.product_rows(tiled.data() + r * out, R, b, operand + size_t(r) * row_bytes);
    const bool agree = std::memcmp(whole.data(), tiled.data(), whole.size() * sizeof(float)) == 0;
    std::lock_guard<std::mutex> lock(mutex);
    known[key] = agree;
    return agree;
  }
  // The padded tile's operand (0) and result (1), per thread.
  static AlignedBuffer& tile_buffer(int which) {
    static thread_local AlignedBuffer buffers[2];
    return buffers[which];
  }

  // dx (=, or += when accumulate) dy W, dy's operand memory from operand() as in forward_product.
  template <class Operand>
  void backward_input_product(float* dx, int64_t N, bool accumulate, Operand operand) {
    auto& ctx = dnnl_context();
    Plan& plan = backward_input_plan(N, accumulate);
    memory wei = packed_weights(Role::backward_input, plan);
    memory src(at(plan.pd.src_desc(), {N, out}, {out, 1}), ctx.engine, operand());
    memory dst(at(plan.pd.dst_desc(), {N, in}, {in, 1}), ctx.engine, dx);
    execute(plan, src, wei, nullptr, dst);
  }

  // A product's operand given as its bf16 copy: bf16 mode only, and N rows of `width`.
  void check_copy(const OperandCopy& copy, int64_t N, int64_t width, const char* what) const {
    CLEAVE_CHECK(precision == Precision::bf16, "LinearGemm::" << what << ": a "
                                                   << precision_name(precision)
                                                   << " product has no bf16 operand copy");
    CLEAVE_CHECK(N > 0 && copy.count == N * width, "LinearGemm::" << what << ": the copy holds "
                                                       << copy.count << " elements, not " << N
                                                       << " x " << width);
  }

  // backward_weight's operand: the caller's copy, or a conversion into scratch.
  void* kept_operand(const float* a, int64_t count, const OperandCopy* copy, int which,
                     const char* what) {
    if (precision != Precision::bf16 || !copy) return operand(a, count, nullptr, which);
    CLEAVE_CHECK(copy->count == count, "LinearGemm::backward_weight: the kept bf16 copy of "
                                           << what << " holds " << copy->count << " elements, not "
                                           << count);
    return bf16_operand(copy->data.data(), count, which);
  }
};

LinearGemm::LinearGemm(int in_features, int out_features, Precision precision)
    : impl_(std::make_unique<Impl>(in_features, out_features, precision)) {
  CLEAVE_CHECK(in_features > 0 && out_features > 0,
               "LinearGemm: bad shape in=" << in_features << " out=" << out_features);
}
LinearGemm::~LinearGemm() = default;
LinearGemm::LinearGemm(LinearGemm&&) noexcept = default;
LinearGemm& LinearGemm::operator=(LinearGemm&&) noexcept = default;

void LinearGemm::set_row_invariant(bool on) {
  CLEAVE_CHECK(!on || !impl_->fp8, "LinearGemm: fp8 products have no row-invariant mode");
  // A runtime row count's primitive (variable rows) gives a row of a whole tile its bits at any
  // count of whole tiles with AVX-512 (measured on the Xeon), not on AVX2, which tiles it too.
  impl_->row_tiles = on && !row_invariant_products(impl_->precision) &&
                     (!impl_->variable_rows || !has_isa(dnnl::cpu_isa::avx512_core));
}

void LinearGemm::set_variable_rows() {
  CLEAVE_CHECK(impl_->plans.empty(), "LinearGemm::set_variable_rows after a product");
  impl_->variable_rows = true;
}

void LinearGemm::release_packed() {
  PackedSpares& s = packed_spares();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (Packed& p : impl_->packed) s.spares.give(p.storage);
  }
  impl_->packed.clear();
  impl_->rounded = Buffer<float>();
  impl_->rounded_version = 0;
}

int64_t LinearGemm::begin_row_packing() {
  auto& m = *impl_;
  m.row_targets.clear();
  // The bands are packed from W as it is written; fp16 and fp8 pack from W's rounding or image,
  // made later.
  if (m.precision == Precision::fp16 || m.precision == Precision::fp8 || m.emulated) return 0;
  for (Packed& p : m.packed)
    if (p.layout) m.row_targets.push_back(Impl::target_of(p, true));
  if (m.row_targets.empty()) return 0;
  return kernels::pack_band_rows(m.out, m.in, m.row_targets);
}

void LinearGemm::pack_rows(int64_t row0, int64_t row1) {
  auto& m = *impl_;
  kernels::pack_weight_rows(m.weight, m.out, m.in, m.row_targets, row0, row1);
}

void LinearGemm::all_rows_packed() {
  auto& m = *impl_;
  for (Packed& p : m.packed)
    if (p.layout) p.version = m.weight_version();
  m.row_targets.clear();
}

void LinearGemm::set_fp8(const Fp8Settings& settings) {
  CLEAVE_CHECK(impl_->fp8, "LinearGemm::set_fp8 on a " << precision_name(impl_->precision)
                                                       << " product");
  impl_->fp8->settings = settings;
  impl_->packed.clear();
}

Fp8Triple LinearGemm::take_fp8_amax() {
  if (!impl_->fp8) return {0.0f, 0.0f, 0.0f};
  return std::exchange(impl_->fp8->amax, Fp8Triple{0.0f, 0.0f, 0.0f});
}

void LinearGemm::set_fp8_scales(const Fp8Triple& scales) {
  CLEAVE_CHECK(impl_->fp8, "LinearGemm::set_fp8_scales on a "
                               << precision_name(impl_->precision) << " product");
  if (scales[fp8_w] != impl_->fp8->scale[fp8_w])
    for (Packed& p : impl_->packed) p.version = 0;  // repacked from a new image
  impl_->fp8->scale = scales;
}

void LinearGemm::set_fp8_gathered_weight(float scale, float shard_amax) {
  CLEAVE_CHECK(impl_->fp8 && impl_->fp8->per_tensor(),
               "LinearGemm::set_fp8_gathered_weight needs a per-tensor FP8 recipe");
  impl_->fp8->gathered = {scale, shard_amax};
}

Fp8Triple LinearGemm::fp8_scales() const {
  return impl_->fp8 ? impl_->fp8->scale : Fp8Triple{1.0f, 1.0f, 1.0f};
}

int LinearGemm::in_features() const { return impl_->in; }
Precision LinearGemm::precision() const { return impl_->precision; }
int LinearGemm::out_features() const { return impl_->out; }

void LinearGemm::set_weight(const float* weight, const uint64_t* version) {
  CLEAVE_CHECK(weight != nullptr, "LinearGemm::set_weight: null weight");
  impl_->weight = weight;
  ++impl_->own_version;
  impl_->version = version ? version : &impl_->own_version;
}

void LinearGemm::forward(float* y, const float* x, int64_t N, const float* bias,
                         OperandCopy* keep_x) {
  auto& m = *impl_;
  CLEAVE_CHECK(N > 0, "LinearGemm::forward: N=" << N);
  auto& ctx = dnnl_context();
  if (m.fp8) {
    Plan& plan = m.forward_plan(N, false);
    memory wei = m.packed_weights(Role::forward, plan);
    bf16* xs = m.fp8_image_buffer(N * m.in, 0);
    const float factor =
        m.fp8->inner_along_cols(xs, x, N, m.in, fp8_x, keep_x) * m.fp8->weight_factor();
    memory src(m.at(plan.pd.src_desc(), {N, m.in}, {m.in, 1}), ctx.engine,
               m.bf16_operand(xs, N * m.in, 0));
    memory dst(m.at(plan.pd.dst_desc(), {N, m.out}, {m.out, 1}), ctx.engine, y);
    m.execute(plan, src, wei, nullptr, dst);
    if (factor != 1.0f || bias) kernels::fp8_epilogue(y, N, m.out, factor, bias);
    return;
  }
  m.forward_product(y, N, bias, [&] { return m.operand(x, N * m.in, keep_x, 0); });
}

void LinearGemm::forward_from_copy(float* y, const OperandCopy& x, int64_t N, const float* bias) {
  auto& m = *impl_;
  m.check_copy(x, N, m.in, "forward_from_copy");
  m.forward_product(y, N, bias, [&] { return m.bf16_operand(x.data.data(), x.count, 0); });
}

void LinearGemm::backward_input(float* dx, const float* dy, int64_t N, bool accumulate,
                                OperandCopy* keep_dy) {
  auto& m = *impl_;
  CLEAVE_CHECK(N > 0, "LinearGemm::backward_input: N=" << N);
  auto& ctx = dnnl_context();
  if (m.fp8) {
    // A scaled result (per-tensor scales) that accumulates is made in a temporary first.
    const bool direct = !m.fp8->per_tensor() || !accumulate;
    Plan& plan = m.backward_input_plan(N, accumulate && direct);
    memory wei = m.packed_weights(Role::backward_input, plan);  // may set weight_factor()
    bf16* dys = m.fp8_image_buffer(N * m.out, 0);
    const float factor =
        m.fp8->inner_along_cols(dys, dy, N, m.out, fp8_dy, keep_dy) * m.fp8->weight_factor();
    float* result = direct ? dx : Impl::fp8_result(N * m.in);
    memory src(m.at(plan.pd.src_desc(), {N, m.out}, {m.out, 1}), ctx.engine,
               m.bf16_operand(dys, N * m.out, 0));
    memory dst(m.at(plan.pd.dst_desc(), {N, m.in}, {m.in, 1}), ctx.engine, result);
    m.execute(plan, src, wei, nullptr, dst);
    if (!direct)
      kernels::fp8_add_scaled(dx, result, N * m.in, factor);
    else if (factor != 1.0f)
      kernels::fp8_epilogue(dx, N, m.in, factor, nullptr);
    return;
  }
  m.backward_input_product(dx, N, accumulate,
                           [&] { return m.operand(dy, N * m.out, keep_dy, 0); });
}

void LinearGemm::backward_input_from_copy(float* dx, const OperandCopy& dy, int64_t N,
                                          bool accumulate) {
  auto& m = *impl_;
  m.check_copy(dy, N, m.out, "backward_input_from_copy");
  m.backward_input_product(dx, N, accumulate,
                           [&] { return m.bf16_operand(dy.data.data(), dy.count, 0); });
}

void LinearGemm::copy_operand(const float* a, int64_t count, OperandCopy& keep) {
  if (impl_->precision == Precision::bf16) impl_->operand(a, count, &keep, 0);
  if (impl_->fp8) impl_->fp8->keep(a, count / impl_->in, impl_->in, fp8_x, keep);
}

// The layout the products on N rows prefer for W: forward's (transposed) or backward_input's.
memory::desc LinearGemm::Impl::preferred_weights(int64_t N, bool transposed) const {
  const memory::dim r = rows(N);
  const int64_t k = transposed ? in : out, n = transposed ? out : in;
  // A plan's choice depends on the shapes and types alone; the planner asks for the same ones
  // across thousands of layouts, and making a plan costs far more than looking one up.
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t, dt, bool, bool>, memory::desc> chosen;
  const std::tuple key{int64_t(r), k, n, cdt, transposed, variable_rows};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = chosen.find(key);
  if (it == chosen.end()) {
    const memory::desc src({r, k}, cdt, tag::ab), dst({r, n}, dt::f32, tag::ab);
    it = chosen
             .emplace(key, dnnl::matmul::primitive_desc(
                               dnnl::matmul::desc(src, weights(transposed), dst),
                               dnnl_context().engine)
                               .weights_desc())
             .first;
  }
  return it->second;
}

LinearGemm::WeightCopies LinearGemm::weight_copy_bytes(int64_t N) const {
  const Impl& m = *impl_;
  WeightCopies copies;
  // FP8's products read W's image (a per-thread buffer, thread_scratch_bytes), never its rounding.
  if (!m.fp8 && (m.precision == Precision::fp16 || m.emulated))
    copies.rounded = int64_t(m.in) * m.out * 4;
  // The layouts packed_weights asks its plans for, and whether each is W as it lies (no copy).
  auto packed = [&](bool transposed) {
    const memory::desc want = m.preferred_weights(N, transposed);
    return m.reads_in_place(want, transposed) ? 0 : int64_t(want.get_size());
  };
  copies.forward = packed(true);
  copies.backward = packed(false);
  return copies;
}

LinearGemm::Fp8Images LinearGemm::fp8_images(int64_t N) const {
  const Impl& m = *impl_;
  CLEAVE_CHECK(m.fp8, "LinearGemm::fp8_images on a " << precision_name(m.precision) << " linear");
  Fp8Images images;
  // As packed_weights and repack make them: a role that reads W as it lies reads the image made
  // for each of its products; the copies of the other roles are packed from one image per version
  // where the packer knows their layout (one per role for mxfp8, whose images differ), from one
  // each where a reorder makes them.
  bool packer[2] = {false, false};
  for (const bool forward : {true, false}) {
    const memory::desc want = m.preferred_weights(N, forward);
    if (m.reads_source(want, forward)) {
      (forward ? images.per_forward : images.per_backward_input) = true;
    } else if (kernels::blocked_layout(want)) {
      packer[!forward && m.fp8->weight_images_differ()] = true;
    } else {
      ++images.per_version;
    }
  }
  images.per_version += int(packer[0]) + int(packer[1]);
  return images;
}

LinearGemm::ThreadScratch LinearGemm::thread_scratch_bytes(int64_t N) const {
  const Impl& m = *impl_;
  ThreadScratch s;
  const int64_t x = N * m.in, dy = N * m.out, w = int64_t(m.in) * m.out;
  // Operand 0 is x (forward) or dy (backward_input, backward_weight); operand 1 backward_weight's x.
  if (m.precision == Precision::fp16) {
    s.bytes[operand0] = aligned_bytes(std::max(x, dy), sizeof(float));
    s.bytes[operand1] = aligned_bytes(x, sizeof(float));
  }
  if (m.precision == Precision::bf16 || m.fp8) {
    s.bytes[operand0] = aligned_bytes(std::max(x, dy), sizeof(bf16));
    s.bytes[operand1] = aligned_bytes(x, sizeof(bf16));
  }
  if (m.emulated) {
    s.bytes[widened0] = aligned_bytes(std::max(x, dy), sizeof(float));
    s.bytes[widened1] = aligned_bytes(x, sizeof(float));
  }
  if (m.fp8) {
    // Per-tensor scales: backward_input's accumulated dx and backward_weight's dW are made apart
    // and added scaled.
    if (m.fp8->per_tensor()) s.bytes[scaled_result] = aligned_bytes(std::max(x, w), sizeof(float));
    m.fp8->thread_scratch(s, N);
  }
  return s;
}

LinearGemm::ThreadScratch LinearGemm::thread_scratch_held() {
  ThreadScratch s;
  s.bytes[operand0] = Impl::scratch_operand(0).capacity();
  s.bytes[operand1] = Impl::scratch_operand(1).capacity();
  s.bytes[widened0] = Impl::widened(0).capacity();
  s.bytes[widened1] = Impl::widened(1).capacity();
  s.bytes[scaled_result] = Impl::scaled_result_buffer().capacity();
  kernels::Fp8Operands::thread_scratch_held(s);
  return s;
}

int64_t LinearGemm::kept_copy_bytes(int64_t rows) const {
  if (impl_->fp8) return impl_->fp8->kept_bytes(rows, impl_->in);
  return impl_->precision == Precision::bf16 ? rows * impl_->in * int64_t(sizeof(bf16)) : 0;
}

void LinearGemm::backward_weight(float* dweight, float* dbias, const float* dy, const float* x,
                                 int64_t N, const OperandCopy* dy_copy,
                                 const OperandCopy* x_copy) {
  auto& m = *impl_;
  CLEAVE_CHECK(N > 0, "LinearGemm::backward_weight: N=" << N);
  auto& ctx = dnnl_context();
  float factor = 1.0f;
  void *dys, *xs;
  if (m.fp8) {
    bf16* dyi = m.fp8_image_buffer(N * m.out, 0);
    bf16* xi = m.fp8_image_buffer(N * m.in, 1);
    factor = m.fp8->inner_along_rows(dyi, dy, N, m.out, fp8_dy, dy_copy) *
             m.fp8->inner_along_rows(xi, x, N, m.in, fp8_x, x_copy);
    dys = m.bf16_operand(dyi, N * m.out, 0), xs = m.bf16_operand(xi, N * m.in, 1);
  } else {
    dys = m.kept_operand(dy, N * m.out, dy_copy, 0, "dy");
    xs = m.kept_operand(x, N * m.in, x_copy, 1, "x");
  }
  // A scaled result is made in a temporary and added after.
  Plan& plan = m.backward_weight_plan(N, factor == 1.0f);
  float* result = factor == 1.0f ? dweight : Impl::fp8_result(int64_t(m.out) * m.in);
  memory src(m.at(plan.pd.src_desc(), {m.out, N}, {1, m.out}), ctx.engine, dys);
  memory wei(m.at(plan.pd.weights_desc(), {N, m.in}, {m.in, 1}), ctx.engine, xs);
  memory dst(plan.pd.dst_desc(), ctx.engine, result);
  m.execute(plan, src, wei, nullptr, dst);
  if (factor != 1.0f) kernels::fp8_add_scaled(dweight, result, int64_t(m.out) * m.in, factor);

  if (dbias && !(dy_copy && dy_copy->bias_summed)) {
    const int cols = m.out;
    kernels::add_column_sums(dbias, N, cols,
                             [=](int64_t n, int c0, int, float*) { return dy + n * cols + c0; });
  }
}

}  // namespace cleave
