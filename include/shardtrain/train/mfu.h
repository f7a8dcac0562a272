// Model FLOPs utilisation: the FLOPs a step must do over the device's dense peak.
//
//   FLOPs per token = 6 P + 6 L C T     (L layers, C width, T context: matmuls + causal attention)
//
// P is the family's count (model/family.h): gpt2 every parameter (llm.c's convention), llama the parameters of
// matrix products (the Hugging Face / torchtitan peers' convention). With LoRA the frozen weights need no weight
// gradient: 4 P + 6 A + 6 L C T, with A the adapters' parameters.
//   MFU = tokens/s per device * FLOPs per token / peak
//
// Peaks are the dense bf16 tensor rates (fp32 accumulate) from the vendors' datasheets, keyed by the
// CUDA device name. A device not in the table has no MFU: "unknown", never a made-up percentage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shardtrain/core/config.h"

namespace st {

double flops_per_token(const ModelConfig& cfg);

// Dense bf16 peak in FLOP/s for a device name as CUDA reports it ("NVIDIA H200", "NVIDIA GeForce RTX
// 4090"), or nullopt if unknown (including "cpu").
std::optional<double> dense_bf16_peak(const std::string& device_name);

// tokens_per_s over all `devices`, at flops_per_token(cfg) (computed once by the caller: it builds the unit list);
// nullopt when the peak is unknown.
std::optional<double> mfu(double flops_per_token, double tokens_per_s, int devices, const std::string& device_name);

}  // namespace st
