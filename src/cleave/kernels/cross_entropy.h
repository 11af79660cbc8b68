// Fused softmax cross-entropy over the vocabulary. One pass per row: losses[i] = logsumexp(row) -
// row[target]; when grad_scale != 0 the row is overwritten with grad_scale * (softmax - onehot),
// the gradient of grad_scale * loss_i, so the [N, V] logits buffer becomes dlogits in place.
#pragma once
#include <cstdint>

namespace cleave::kernels {

void cross_entropy_forward_backward(float* logits, float* losses, const int32_t* targets, int64_t N,
                                    int V, float grad_scale);

}  // namespace cleave::kernels

namespace cleave::kernels {

// Vocabulary-parallel cross-entropy (Megatron's): a tp rank holds columns [vocab_begin,
// vocab_begin + V) of the logits, rows `stride` floats apart (columns V.. stride are padding).
// 1. stats[3 i ..] = {max, sum exp(x - max), x[target] (0 when another rank holds the target)}
//    of row i over the rank's columns ({-inf, 0, 0} when V is 0).
// 2. From every rank's stats (all_stats[r * 3 N ..], e.g. all-gathered): losses[i] = log S + M -
//    x[target] with M the max of the maxes and S the rescaled sum; when grad_scale != 0 the row
//    becomes grad_scale * (softmax - onehot) in place and the padding columns 0.
void vocab_shard_stats(const float* logits, float* stats, const int32_t* targets, int64_t N, int V,
                       int64_t stride, int64_t vocab_begin);
void vocab_shard_loss(float* logits, float* losses, const float* all_stats, int ranks,
                      const int32_t* targets, int64_t N, int V, int64_t stride,
                      int64_t vocab_begin, float grad_scale);

}  // namespace cleave::kernels
