// Hugging Face DeepSeek-V3 directories from and to moetron checkpoints.
//
// Export writes OUT/config.json (DeepSeek-V3's config.json keys, architectures
// ["DeepseekV3ForCausalLM"], model_type "deepseek_v3"), OUT/model.safetensors (HF names from
// model/hf_names.h: per-expert names, MTP modules as model.layers.{num_hidden_layers + d}, with
// the aliases DeepSeek-V3's own checkpoint carries) and OUT/model.safetensors.index.json (its
// weight_map), and on request, for a byte-level model (token ids are raw bytes), OUT/tokenizer.json
// and OUT/tokenizer_config.json (hf_tokenizer.h), so that AutoTokenizer works on text.
// Without MTP (HfExportOptions::include_mtp false) the MTP modules are left out and config.json
// says num_nextn_predict_layers 0: transformers does not run MTP and would report their weights as
// unexpected. Import reads such a directory (one file or an index with a weight_map; per-expert
// or fused expert names; F32 or BF16) into a moetron checkpoint at step 0 with a fresh optimizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>

#include "moetron/core/dtype.h"
#include "moetron/model/config.h"

namespace moetron {

inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfWeightsIndexFile = "model.safetensors.index.json";

// config.json for a model stored in dtype (f32 or bf16).
nlohmann::json hf_config_json(const ModelConfig& config, DType dtype);

struct HfExportStats {
    int64_t num_tensors = 0;
    uint64_t num_bytes = 0;  // of model.safetensors
};

// Before an export reads anything: creates out_dir if needed and checks that it takes files; a
// UserError when out_dir is a moetron checkpoint directory (the export would overwrite its files).
void prepare_hf_export_dir(const std::filesystem::path& out_dir);

// checkpoint: a checkpoint directory or root (its `latest`). dtype: f32 or bf16. Prepares out_dir
// (prepare_hf_export_dir) and replaces the three files there, each atomically (atomic_file.h).

struct HfExportOptions {
    DType dtype = DType::bf16;  // f32 or bf16
    bool include_mtp = true;
    bool byte_tokenizer = false;  // write tokenizer.json for byte-level token ids
};

// params: the model's parameters, laid out by ParamTable(model_param_specs(config)). Prepares
// out_dir (prepare_hf_export_dir) and replaces the files there, each atomically (atomic_file.h).
HfExportStats export_hf_params(const ModelConfig& config, const float* params,
                               const std::filesystem::path& out_dir,
                               const HfExportOptions& options);

HfExportStats export_hf(const std::filesystem::path& checkpoint,
                        const std::filesystem::path& out_dir, DType dtype);

// Writes out_root/step-00000000 (and `latest`) as a new run (checkpoint_root.h: a root holding
// checkpoints is refused before any tensor is read); returns that directory. Errors name the
// file and tensor: an unknown tensor, a wrong shape or dtype, a tensor given twice, a parameter
// missing.
std::filesystem::path import_hf(const std::filesystem::path& hf_dir,
                                const std::filesystem::path& out_root);

}  // namespace moetron
