// The optimizer's options: AdamW's hyper-parameters, which tensors decay, clipping, and the
// learning-rate schedule (train/config.h reads them from the [optim] table).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

enum class LrDecay { cosine, linear, constant };

struct OptimConfig {
  double lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 100;
  LrDecay decay = LrDecay::cosine;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  // Which parameters decay: tensors with at least two dimensions (matrices and embeddings), minus
  // any whose name contains one of no_decay. Norm weights and biases never decay.
  std::vector<std::string> no_decay;
  double grad_clip = 1.0;  // 0 turns clipping off
  // "file": AdamW's moments live in a memory-mapped file in offload_dir, streamed through memory
  // in spans during the update, instead of in this process's memory.
  std::string offload = "none";
  std::string offload_dir;
};

}  // namespace cleave
