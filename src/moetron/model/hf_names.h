// The mapping between Hugging Face DeepSeek-V3 tensor names and moetron's parameters, for
// importing checkpoints and reference dumps and for export.
//
// Every HF tensor is one contiguous block of elements inside one moetron tensor, because every
// fusion moetron makes is a concatenation of rows:
//   mlp.gate_up (2F, D)              = [gate_proj.weight; up_proj.weight]
//   mlp.experts.gate_up (E, 2F, D)   = per expert [gate_proj; up_proj], experts stacked
//   mlp.experts.down (E, D, F)       = experts' down_proj stacked
// so a mapping is (HF name, HF shape, moetron name, element offset) and a copy is one memcpy.
//
// MTP module d sits at model.layers.{num_hidden_layers + d} as in DeepSeek-V3's checkpoint
// (enorm, hnorm, eh_proj, shared_head.norm and a regular decoder layer). That checkpoint also
// stores copies of the shared embedding and output head there (embed_tokens, shared_head.head);
// they appear as aliases: written on export, not needed on import.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moetron/core/tensor.h"
#include "moetron/model/config.h"

namespace moetron {

// How the routed experts are named.
enum class HfExpertLayout : uint8_t {
    // model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight: DeepSeek-V3's published
    // checkpoint and transformers < 5.
    per_expert,
    // model.layers.N.mlp.experts.gate_up_proj (E, 2F, D) and .down_proj (E, D, F): transformers
    // >= 5 (its gate_up_proj rows are [gate; up], moetron's layout).
    fused,
};

struct HfTensor {
    std::string hf_name;       // e.g. "model.layers.3.mlp.experts.5.gate_proj.weight"
    Shape hf_shape;            // e.g. (F, D)
    std::string param_name;    // e.g. "layers.3.mlp.experts.gate_up"
    int64_t param_offset = 0;  // element where this tensor's block starts in the moetron tensor
    bool alias = false;        // a second HF name for data another entry already maps
    int64_t numel() const { return hf_shape.numel(); }
};

class HfNameMap {
  public:
    explicit HfNameMap(const ModelConfig& config,
                       HfExpertLayout experts = HfExpertLayout::per_expert);

    const std::vector<HfTensor>& tensors() const { return tensors_; }
    const HfTensor* find(std::string_view hf_name) const;  // null for a name moetron lacks
    const HfTensor& at(std::string_view hf_name) const;    // throws naming the tensor

  private:
    std::vector<HfTensor> tensors_;
    std::unordered_map<std::string, size_t> index_;
};

// Copies between an HF tensor's data (hf.numel() floats) and the moetron parameter it lives in
// (param: the start of that moetron tensor, e.g. Model::param(name).f32()).
void copy_hf_to_param(float* param, const HfTensor& hf, const float* hf_data);
void copy_param_to_hf(float* hf_data, const HfTensor& hf, const float* param);

}  // namespace moetron
