// Fused softmax cross-entropy over the vocabulary. One pass per row: losses[i] = logsumexp(row) -
// row[target]; when grad_scale != 0 the row is overwritten with grad_scale * (softmax - onehot),
// the gradient of grad_scale * loss_i, so the [N, V] logits buffer becomes dlogits in place.
#pragma once
#include <cstdint>

namespace cleave::kernels {

void cross_entropy_forward_backward(float* logits, float* losses, const int32_t* targets, int64_t N,
                                    int V, float grad_scale);

}  // namespace cleave::kernels
