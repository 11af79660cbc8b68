#include "cleave/model/layers.h"

#include "cleave/kernels/norm.h"

namespace cleave {

namespace {

// A column-parallel bias holds the weight's rows; any other bias is whole.
Placement bias_placement(const Placement& weight) {
  if (weight.shard_dim != 0) return {};
  return shard_rows({weight.global_shape[0]}, weight.segments);
}

}  // namespace

Linear::Linear(ParamStore& store, const std::string& name, int in, int out, bool bias,
               float init_std, Precision precision, Placement placement, int group)
    : w_(store.add(name + ".weight", {out, in}, Init::normal, init_std, placement, group)),
      bias_after_sum_(placement.shard_dim == 1), gemm_(in, out, precision) {
  if (bias)
    b_ = store.add(name + ".bias", {out}, Init::zeros, 0.0f, bias_placement(placement), group);
}

void Linear::bind(ParamStore& store) {
  weight_ = store.value(w_);
  dweight_ = store.grad(w_);
  if (b_ >= 0) bias_ = store.value(b_), dbias_ = store.grad(b_);
  store.keep_packed(w_, &gemm_);
}

void Linear::forward(float* y, const float* x, int64_t N, OperandCopy* keep_x) {
  gemm_.forward(y, x, N, bias_after_sum_ ? nullptr : bias_, keep_x);
}

void Linear::forward_from_copy(float* y, const OperandCopy& x, int64_t N) {
  gemm_.forward_from_copy(y, x, N, bias_after_sum_ ? nullptr : bias_);
}

void Linear::add_bias(float* y, int64_t N) const {
  if (!bias_ || !bias_after_sum_) return;
  const int64_t out = gemm_.out_features();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < out; ++j) y[i * out + j] += bias_[j];
}

void Linear::backward_input(float* dx, const float* dy, int64_t N, bool accumulate,
                            OperandCopy* keep_dy) {
  gemm_.backward_input(dx, dy, N, accumulate, keep_dy);
}

void Linear::backward_input_from_copy(float* dx, const OperandCopy& dy, int64_t N,
                                      bool accumulate) {
  gemm_.backward_input_from_copy(dx, dy, N, accumulate);
}

void Linear::backward_weight(const float* dy, const float* x, int64_t N,
                             const OperandCopy* dy_copy, const OperandCopy* x_copy) {
  gemm_.backward_weight(dweight_, dbias_, dy, x, N, dy_copy, x_copy);
}

Norm::Norm(ParamStore& store, const std::string& name, int dim, bool layernorm, float eps,
           const std::string& pending)
    : dim_(dim), layernorm_(layernorm), eps_(eps),
      w_(store.add(name + ".weight", {dim}, Init::ones, 0.0f, pending_sum(pending))) {
  if (layernorm) b_ = store.add(name + ".bias", {dim}, Init::zeros, 0.0f, pending_sum(pending));
}

void Norm::bind(ParamStore& store) {
  weight_ = store.value(w_);
  dweight_ = store.grad(w_);
  if (b_ >= 0) bias_ = store.value(b_), dbias_ = store.grad(b_);
}

void Norm::forward(float* y, const float* x, int64_t N, NormStats& st) {
  if (st.rstd.size() < N) {
    st.mean.resize(N);
    st.rstd.resize(N);
  }
  if (layernorm_)
    kernels::layernorm_forward(y, st.mean.data(), st.rstd.data(), x, weight_, bias_, N, dim_, eps_);
  else
    kernels::rmsnorm_forward(y, st.rstd.data(), x, weight_, N, dim_, eps_);
}

void Norm::backward_input(float* dx, const float* dy, const float* x, int64_t N,
                          const NormStats& st) {
  if (layernorm_)
    kernels::layernorm_backward_input(dx, dy, x, weight_, st.mean.data(), st.rstd.data(), N, dim_);
  else
    kernels::rmsnorm_backward_input(dx, dy, x, weight_, st.rstd.data(), N, dim_);
}

void Norm::backward_weight(const float* dy, const float* x, int64_t N, const NormStats& st) {
  if (layernorm_)
    kernels::layernorm_backward_weight(dweight_, dbias_, dy, x, st.mean.data(), st.rstd.data(), N,
                                       dim_);
  else
    kernels::rmsnorm_backward_weight(dweight_, dy, x, st.rstd.data(), N, dim_);
}

}  // namespace cleave
