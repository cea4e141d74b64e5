// The training run's knobs: the [train] table of a model preset (configs/models/*.toml), then
// command-line overrides. Unknown keys are errors that name the closest known key, so a typo in a
// preset never silently falls back to a default.
//
// In checkpoint/, below the trainer that runs with it, because it is part of the checkpoint
// format: state.json holds every field (checkpoint_dir.h), read back with the defaults for the
// fields an older checkpoint lacks and compared on --resume, and `moetron import` writes the
// defaults.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moetron {

// Bounds of the [train] keys, shared by the presets' checks and the command line's overrides.
// Large enough for any real run; what matters is that nothing beyond them reaches the arithmetic
// (memory that cannot fit is refused separately, with the planned size).
inline constexpr int64_t kMaxTrainSteps = 1'000'000'000'000;
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 40;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
inline constexpr double kMaxLearningRate = 10.0;

struct TrainConfig {
    int64_t batch_size = 8;     // B: sequences per micro-batch
    int64_t seq_len = 64;       // S: tokens per sequence (each window holds S + 1 tokens)
    int64_t grad_accum = 1;     // micro-batches per optimizer step
    int64_t steps = 300;        // optimizer steps
    double lr = 3e-3;           // peak learning rate, reached after warmup
    double min_lr = 3e-4;       // cosine decay ends here at the last step
    int64_t warmup_steps = 30;  // linear warmup from lr / warmup_steps to lr
    double weight_decay = 0.1;  // decoupled (AdamW); never applied to norms and biases
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;            // global gradient-norm clip (<= 0 disables)
    uint64_t seed = 1234;              // parameter initialization and data sampling
    double bias_update_speed = 1e-3;   // gamma of the aux-loss-free router bias update
    double balance_loss_alpha = 1e-4;  // sequence-wise balance loss weight
    double mtp_lambda = 0.3;           // MTP loss weight
    int64_t eval_every = 50;           // validation every this many steps (0: only at the end)
    int64_t eval_batches = 4;          // micro-batches per validation
    double val_fraction = 0.1;         // tail of the token stream held out for validation

    int64_t tokens_per_step() const { return batch_size * seq_len * grad_accum; }
};

// The keys a [train] table may hold, in the order of the struct above.
const std::vector<std::string_view>& train_config_keys();

// Reads the [train] table of a TOML text; keys not given keep the struct's defaults. A text
// without a [train] table (or a JSON config) yields the defaults. Errors name source_name.
TrainConfig parse_train_config_toml(std::string_view text, std::string_view source_name);
// Reads the file at path (TOML preset or Hugging Face config.json) as above.
TrainConfig load_train_config(const std::string& path);

// Throws moetron::Error naming the first impossible value.
void validate_train_config(const TrainConfig& config);

}  // namespace moetron
