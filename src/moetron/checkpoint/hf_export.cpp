#include "moetron/checkpoint/hf_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/checkpoint/hf_tokenizer.h"
#include "moetron/checkpoint/output_paths.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/arena.h"
#include "moetron/core/checked_math.h"
#include "moetron/core/error.h"
#include "moetron/core/strings.h"
#include "moetron/core/user_error.h"
#include "moetron/model/hf_names.h"
#include "moetron/model/params.h"

namespace moetron {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Index files of the largest published checkpoints are a few MB.
constexpr uint64_t kMaxIndexJsonBytes = 64ull << 20;

std::string read_text(const fs::path& path) {
    UniqueFd fd = open_for_reading(path.string());
    const uint64_t size = file_size_bytes(fd.get(), path.string());
    MT_CHECK(size <= kMaxIndexJsonBytes, "[hf] '{}' is {} bytes: too large for an index",
             path.string(), size);
    std::string text(size, '\0');
    MT_CHECK(read_at(fd.get(), text.data(), size, 0, path.string()) == size,
             "[hf] '{}' shrank while it was read", path.string());
    return text;
}

std::vector<int64_t> dims_of(const Shape& s) {
    return {s.dims.begin(), s.dims.begin() + s.ndim};
}

// The weight files of an HF directory: the index's weight_map values, else model.safetensors.
std::vector<std::string> hf_weight_files(const fs::path& dir) {
    const fs::path index_path = dir / kHfWeightsIndexFile;
    std::error_code ec;
    if (!fs::exists(index_path, ec)) {
        MT_CHECK(fs::exists(dir / kHfWeightsFile, ec), "[hf] '{}' has neither {} nor {}",
                 dir.string(), kHfWeightsFile, kHfWeightsIndexFile);
        return {kHfWeightsFile};
    }
    json index;
    try {
        index = json::parse(read_text(index_path));
    } catch (const json::exception& e) {
        MT_THROW("[hf] '{}' is not valid JSON: {}", index_path.string(), e.what());
    }
    MT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             "[hf] '{}' has no \"weight_map\" object", index_path.string());
    std::set<std::string> files;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
        MT_CHECK(file.is_string(), "[hf] '{}': weight_map entry {} is not a file name",
                 index_path.string(), printable(tensor));
        const std::string name = file.get<std::string>();
        MT_CHECK(
            !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
            "[hf] '{}': weight_map entry {} names {}, not a file of the directory",
            index_path.string(), printable(tensor), printable(name));
        files.insert(name);
    }
    return {files.begin(), files.end()};
}

}  // namespace

json hf_config_json(const ModelConfig& config, DType dtype) {
    json j = model_config_to_json(config);
    j.erase("name");
    j["architectures"] = json::array({"DeepseekV3ForCausalLM"});
    j["model_type"] = "deepseek_v3";
    j["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
    j["hidden_act"] = "silu";
    j["num_key_value_heads"] = config.num_attention_heads;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["use_cache"] = true;
    return j;
}

void prepare_hf_export_dir(const fs::path& out_dir) {
    // Writing model.safetensors into a checkpoint directory would replace the checkpoint's own
    // (or break its index): the checkpoint exported from, or any other.
    std::error_code ec;
    MT_USER_CHECK(!fs::exists(out_dir / kCheckpointIndexName, ec),
                  "--out '{}' is a moetron checkpoint directory: the export would overwrite its "
                  "files. Export into a directory of its own",
                  out_dir.string());
    prepare_output_dir({"--out", out_dir});
}

HfExportStats export_hf(const fs::path& checkpoint, const fs::path& out_dir, DType dtype) {
    const fs::path dir = resolve_checkpoint_dir(checkpoint);
    prepare_hf_export_dir(out_dir);
    const json state = read_verified_checkpoint_state(dir);
    const ModelConfig config =
        model_config_from_json(state.at("model_config"), (dir / kCheckpointStateFile).string());
    const ParamTable table(model_param_specs(config));
    std::vector<float> params(static_cast<size_t>(table.total_numel()));
    read_checkpoint_tensors(dir, table.entries(), params.data(), nullptr, nullptr);
    HfExportOptions options;
    options.dtype = dtype;
    return export_hf_params(config, params.data(), out_dir, options);
}

HfExportStats export_hf_params(const ModelConfig& config, const float* params,
                               const fs::path& out_dir, const HfExportOptions& options) {
    prepare_hf_export_dir(out_dir);
    const DType dtype = options.dtype;
    MT_CHECK(dtype == DType::f32 || dtype == DType::bf16,
             "[hf] export dtype must be f32 or bf16, got {}", dtype_name(dtype));
    const ParamTable table(model_param_specs(config));
    // Without MTP: the main model's tensors only (their names do not depend on MTP), and a
    // config.json that says there is none.
    ModelConfig exported = config;
    if (!options.include_mtp) exported.num_nextn_predict_layers = 0;
    const HfNameMap names(exported, HfExpertLayout::per_expert);
    int64_t total = 0;
    for (const HfTensor& t : names.tensors()) total += t.numel();
    std::vector<bf16> converted(dtype == DType::bf16 ? static_cast<size_t>(total) : 0);
    SafetensorsWriter writer;
    writer.set_metadata("format", "pt");  // transformers requires it
    json weight_map = json::object();
    int64_t at = 0;
    for (const HfTensor& t : names.tensors()) {
        // Each HF tensor is one contiguous block of its moetron tensor (model/hf_names.h).
        const float* src = params + table.entry(t.param_name).offset + t.param_offset;
        if (dtype == DType::bf16) {
            bf16* dst = converted.data() + at;
            convert_f32_to_bf16(dst, src, static_cast<size_t>(t.numel()));
            writer.add(t.hf_name, DType::bf16, dims_of(t.hf_shape), dst);
        } else {
            writer.add(t.hf_name, DType::f32, dims_of(t.hf_shape), src);
        }
        at += t.numel();
        weight_map[t.hf_name] = kHfWeightsFile;
    }
    // Each file replaces the previous export's atomically: a failure (a full disk) leaves that
    // file whole, old or new.
    FileDigest digest;
    write_file_atomically(out_dir / kHfWeightsFile,
                          [&](const std::string& staging) { digest = writer.write(staging); });
    const uint64_t data_bytes = static_cast<uint64_t>(total) * (dtype == DType::bf16 ? 2u : 4u);
    replace_file_durably(
        out_dir / kHfWeightsIndexFile,
        json{{"metadata", {{"total_size", data_bytes}}}, {"weight_map", weight_map}}.dump(2) + "\n",
        this_process_writer());
    replace_file_durably(out_dir / "config.json", hf_config_json(exported, dtype).dump(2) + "\n",
                         this_process_writer());
    if (options.byte_tokenizer) write_hf_byte_tokenizer(out_dir, config.max_position_embeddings);
    return {static_cast<int64_t>(names.tensors().size()), digest.num_bytes};
}

fs::path import_hf(const fs::path& hf_dir, const fs::path& out_root) {
    // An import starts a run of its own: its root must be new (or empty), checked before any
    // tensor is read.
    SaveRootRequest request;
    request.run_id = new_run_id();
    request.flag = "--out";
    claim_save_root(out_root, request);
    const ModelConfig config = load_model_config(hf_dir.string());
    const ParamTable table(model_param_specs(config));
    // The headers first, and nothing allocated before they agree with config.json: a config that
    // asks for a huge model must not allocate it before a single tensor is read.
    std::vector<SafetensorsFile> files;
    int64_t elements_present = 0;
    for (const std::string& file_name : hf_weight_files(hf_dir)) {
        files.push_back(SafetensorsFile::open((hf_dir / file_name).string()));
        for (const SafetensorsEntry& e : files.back().tensors()) {
            int64_t numel = 1;
            for (int64_t d : e.dims) numel = checked_mul(numel, d, "[hf] tensor element count");
            elements_present = checked_add(elements_present, numel, "[hf] tensor element count");
        }
    }
    MT_USER_CHECK(
        table.total_numel() <= elements_present,
        "[hf] '{}': config.json describes a model of {} parameters ({}), but its safetensors "
        "files hold only {} elements: the config does not belong to these weights",
        hf_dir.string(), table.total_numel(), describe_model_config(config), elements_present);
    check_fits_in_host_memory(static_cast<size_t>(table.total_numel()) * sizeof(float),
                              "[hf] the model of '" + hf_dir.string() + "'");
    std::vector<float> params(static_cast<size_t>(table.total_numel()));
    const HfNameMap per_expert(config, HfExpertLayout::per_expert);
    const HfNameMap fused(config, HfExpertLayout::fused);
    std::map<std::string, int64_t> covered;  // moetron tensor -> elements read into it
    std::set<std::string> seen;
    std::vector<bf16> staging;
    for (const SafetensorsFile& file : files) {
        for (const SafetensorsEntry& e : file.tensors()) {
            const HfTensor* t = per_expert.find(e.name);
            if (t == nullptr) t = fused.find(e.name);
            MT_CHECK(t != nullptr,
                     "[hf] '{}': tensor {} is not a DeepSeek-V3 tensor of this config ({})",
                     file.path(), printable(e.name), describe_model_config(config));
            MT_CHECK(seen.insert(e.name).second, "[hf] '{}': tensor {} appears twice", file.path(),
                     printable(e.name));
            if (t->alias) continue;  // a copy of the embedding or head (MTP), read elsewhere
            const std::vector<int64_t> dims = dims_of(t->hf_shape);
            MT_CHECK(e.dims == dims, "[hf] '{}': tensor {} has shape {}, this config needs {}",
                     file.path(), printable(e.name), dims_string(e.dims), dims_string(dims));
            float* dst = params.data() + table.entry(t->param_name).offset + t->param_offset;
            const auto n = static_cast<size_t>(t->numel());
            if (e.dtype == DType::f32) {
                file.read_bytes(e, dst, n * sizeof(float));
            } else if (e.dtype == DType::bf16) {
                staging.resize(n);
                file.read_bytes(e, staging.data(), n * sizeof(bf16));
                convert_bf16_to_f32(dst, staging.data(), n);
            } else {
                MT_THROW("[hf] '{}': tensor {} is {}; import reads F32 and BF16", file.path(),
                         printable(e.name), dtype_name(e.dtype));
            }
            covered[t->param_name] += t->numel();
        }
    }
    for (const ParamEntry& p : table.entries()) {
        const int64_t got = covered.count(p.name) ? covered.at(p.name) : 0;
        if (got == p.numel) continue;
        // Name an HF tensor of that parameter that did not come, for the error.
        std::string missing;
        for (const HfTensor& t : per_expert.tensors())
            if (t.param_name == p.name && !t.alias && !seen.count(t.hf_name)) {
                missing = t.hf_name;
                break;
            }
        MT_THROW("[hf] '{}': parameter '{}' received {} of its {} elements{}{}", hf_dir.string(),
                 p.name, got, p.numel, missing.empty() ? "" : "; missing tensor ",
                 missing.empty() ? std::string(" (per-expert and fused names mixed?)")
                                 : "'" + missing + "'");
    }
    const TrainConfig train;  // the run that resumes sets its own
    TrainingStateView st;
    st.model_config = &config;
    st.train_config = &train;
    st.entries = &table.entries();
    st.params = params.data();
    st.data_source = "imported from " + hf_dir.string();
    st.run_id = request.run_id;
    return save_training_state(out_root, st, 0);
}

}  // namespace moetron
