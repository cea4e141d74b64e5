#include "moetron/checkpoint/trained_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace fs = std::filesystem;

namespace {

// The first bytes of the weights files `moetron train --save-final` wrote before it wrote
// checkpoints.
constexpr std::array<char, 8> kOldWeightsMagic = {'M', 'T', 'W', 'E', 'I', 'G', 'H', 'T'};

bool starts_with_old_weights_magic(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    std::array<char, 8> head{};
    return file.read(head.data(), head.size()) && head == kOldWeightsMagic;
}

}  // namespace

TrainedWeightsSource inspect_trained_weights(const std::string& path) {
    std::error_code ec;
    MT_USER_CHECK(fs::exists(path, ec),
                  "'{}' does not exist (expected a checkpoint directory or root from `moetron "
                  "train --save DIR` or `--save-final DIR`)",
                  path);
    fs::path dir = path;
    if (!fs::is_directory(dir, ec)) {
        MT_USER_CHECK(!starts_with_old_weights_magic(dir),
                      "'{}' is a weights file of an older moetron, whose --save-final wrote this "
                      "format; --save-final now writes a checkpoint. To convert it, export it with "
                      "the moetron that wrote it (`moetron export --weights {} --config MODEL "
                      "--dtype fp32 --out HF_DIR`) and import that with this one (`moetron import "
                      "--hf HF_DIR --out CHECKPOINT_ROOT`)",
                      path, path);
        // A file inside a checkpoint directory (its safetensors or state.json) stands for it.
        dir = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
        MT_USER_CHECK(fs::exists(dir / kCheckpointIndexName, ec),
                      "'{}' is neither a checkpoint nor a file of one (expected a checkpoint "
                      "directory or root from `moetron train --save DIR` or `--save-final DIR`)",
                      path);
    }
    const CheckpointRun run = read_checkpoint_run(dir);
    return {run.dir.string(), run.model, run.train};
}

ModelConfig trained_weights_model(const TrainedWeightsSource& source,
                                  const std::string& config_path) {
    if (!config_path.empty()) {
        const std::vector<std::string> differences =
            model_config_differences(source.model, load_model_config(config_path));
        MT_USER_CHECK(differences.empty(),
                      "checkpoint '{}' holds another model than '{}' ({}); leave out --config: a "
                      "checkpoint knows its model",
                      source.path, config_path, fmt::join(differences, ", "));
    }
    return source.model;
}

void read_trained_params(const TrainedWeightsSource& source, const ModelConfig& model,
                         const std::vector<ParamEntry>& entries, float* params) {
    const nlohmann::json state = read_verified_checkpoint_state(source.path);
    (void)checkpoint_counters(source.path, state,
                              model);  // the same model, or an error naming keys
    read_checkpoint_tensors(source.path, entries, params, nullptr, nullptr);
}

}  // namespace moetron
