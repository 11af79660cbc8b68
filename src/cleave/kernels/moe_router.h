// A mixture-of-experts router's choice and its backward, per token over the E router logits
// (docs/moe.md). Three routers:
//   topk_softmax (Mixtral): the k largest logits, their softmax as the gates;
//   softmax_topk (DeepSeek-V2): the softmax of every logit, its k largest as the gates;
//   sigmoid_bias (DeepSeek-V3): sigmoid scores; the k largest of score + bias (the bias steers
//     the choice only), the chosen scores normalised to sum 1 as the gates.
// Each token's choices are in descending order of what they were picked by, ties to the lower
// expert. `probs` are the router's probabilities the balancing loss averages: the softmax of
// every logit, or the sigmoid scores normalised to sum 1.
#pragma once
#include <cstdint>

namespace cleave {

enum class MoeRouter { topk_softmax, softmax_topk, sigmoid_bias };

}  // namespace cleave

namespace cleave::kernels {

// logits [N, E]; bias [E] (sigmoid_bias; may be null otherwise); choice, gate [N, k]; probs [N, E].
void route_forward(MoeRouter router, const float* logits, const float* bias, int64_t N, int E,
                   int k, int32_t* choice, float* gate, float* probs);
// d_logits [N, E] (=) from the gates' gradient d_gate [N, k] and the probabilities' d_probs
// [N, E] (null: none).
void route_backward(MoeRouter router, const float* logits, const int32_t* choice,
                    const float* gate, const float* d_gate, const float* d_probs, int64_t N,
                    int E, int k, float* d_logits);
// The router z-loss (ST-MoE): z[i] = logsumexp(logits[i])^2; with scale != 0, d_logits +=
// scale * d z[i] / d logits[i]. Returns the sum of z over the N tokens.
double router_z_loss(const float* logits, int64_t N, int E, float scale, float* d_logits);

}  // namespace cleave::kernels
