// Trained weights for `moetron sample` and `moetron export`: a checkpoint (checkpoint_dir.h),
// as `moetron train --save`, `--save-final` or `moetron import` write it. The path may name a
// checkpoint directory, a root with a `latest` pointer, or a file inside a checkpoint directory
// (its safetensors, say). A checkpoint carries its model and [train] settings.
// A weights file of the format `--save-final` wrote before it wrote checkpoints ("MTWEIGHT") is
// refused with the commands that convert it.
#pragma once

#include <string>
#include <vector>

#include "moetron/checkpoint/train_config.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"

namespace moetron {

// What a weights path holds, read without loading the tensors. Throws a user error when the path
// does not exist or holds no checkpoint.
struct TrainedWeightsSource {
    std::string path;   // the checkpoint directory
    ModelConfig model;  // the checkpoint's model config
    TrainConfig train;  // its [train] settings
};
TrainedWeightsSource inspect_trained_weights(const std::string& path);

// The model to use with that source: the checkpoint's own; when config_path is given too, it must
// describe the same model.
ModelConfig trained_weights_model(const TrainedWeightsSource& source,
                                  const std::string& config_path);

// Reads the parameters into params (laid out by entries, the model's), checking names and
// shapes; the checkpoint is verified first (checkpoint_dir.h).
void read_trained_params(const TrainedWeightsSource& source, const ModelConfig& model,
                         const std::vector<ParamEntry>& entries, float* params);

}  // namespace moetron
