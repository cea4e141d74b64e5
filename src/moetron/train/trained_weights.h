// Trained weights wherever they are: a checkpoint (a checkpoint directory, or a root with a
// `latest` pointer; train/checkpoint.h), or a weights file written by `moetron train
// --save-final` (train/weights_file.h). `moetron sample` and `moetron export` take either; a
// checkpoint also carries its model and [train] settings, a weights file only the parameters.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/model/params.h"
#include "moetron/train/train_config.h"

namespace moetron {

// What a weights path holds, read without loading the tensors. Throws a user error when the path
// does not exist.
struct TrainedWeightsSource {
    std::string path;
    bool is_checkpoint = false;        // else a weights file
    std::optional<ModelConfig> model;  // a checkpoint's model config
    std::optional<TrainConfig> train;  // a checkpoint's [train] settings
};
TrainedWeightsSource inspect_trained_weights(const std::string& path);

// The model to use with that source: a checkpoint's own (when config_path is given too, it must
// describe the same model); for a weights file, the model config at config_path.
ModelConfig trained_weights_model(const TrainedWeightsSource& source,
                                  const std::string& config_path);

// Reads the parameters into params (laid out by entries, the model's), checking names and
// shapes; a checkpoint is verified first (train/checkpoint.h).
void read_trained_params(const TrainedWeightsSource& source, const ModelConfig& model,
                         const std::vector<ParamEntry>& entries, float* params);

}  // namespace moetron
