#include "moetron/train/trained_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/weights_file.h"

namespace moetron {

TrainedWeightsSource inspect_trained_weights(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    MT_USER_CHECK(fs::exists(path, ec),
                  "'{}' does not exist (expected a checkpoint directory from `moetron train "
                  "--save DIR` or a weights file from `moetron train --save-final FILE`)",
                  path);
    TrainedWeightsSource source;
    source.path = path;
    if (!fs::is_directory(path, ec)) return source;
    const CheckpointRun run = read_checkpoint_run(path);
    source.path = run.dir.string();
    source.is_checkpoint = true;
    source.model = run.model;
    source.train = run.train;
    return source;
}

ModelConfig trained_weights_model(const TrainedWeightsSource& source,
                                  const std::string& config_path) {
    if (!source.is_checkpoint) return load_model_config(config_path);
    if (!config_path.empty()) {
        const std::vector<std::string> differences =
            model_config_differences(*source.model, load_model_config(config_path));
        MT_USER_CHECK(differences.empty(),
                      "checkpoint '{}' holds another model than '{}' ({}); leave out --config: a "
                      "checkpoint knows its model",
                      source.path, config_path, fmt::join(differences, ", "));
    }
    return *source.model;
}

void read_trained_params(const TrainedWeightsSource& source, const ModelConfig& model,
                         const std::vector<ParamEntry>& entries, float* params) {
    if (!source.is_checkpoint) {
        load_weights(source.path, entries, params, describe_model_config(model));
        return;
    }
    const nlohmann::json state = read_verified_checkpoint_state(source.path);
    (void)checkpoint_counters(source.path, state,
                              model);  // the same model, or an error naming keys
    read_checkpoint_tensors(source.path, entries, params, nullptr, nullptr);
}

}  // namespace moetron
