// Training checkpoints: everything a run needs to continue bit for bit where it stopped, on one
// process or on every rank of an MPI job, and to continue under another parallel layout.
//
// A checkpoint root holds step-XXXXXXXX directories (atomic_dir.h: written as a staging
// directory, fsync'ed, renamed; `latest` names the newest; old ones removed by retention) and
// belongs to one run (checkpoint_root.h: which runs may save there, what retention may delete).
// One checkpoint directory holds:
//   model.safetensors  (one process) fp32 master parameters under their moetron names (the router
//                      correction biases are parameters), and AdamW's moments as
//                      "optimizer.m.<name>" and "optimizer.v.<name>"
//   shard-RRRRR-of-NNNNN.safetensors  (a distributed run, checkpoint_sharded.h) one per rank:
//                      the pieces of those tensors the rank was responsible for, each described
//                      by its global name, global shape and element range (checkpoint_pieces.h)
//   state.json         {"format": "moetron-checkpoint", "version": 1 (one process) or 2 (sharded),
//                       "run_id": the run that wrote it (train/checkpoint_root.h),
//                       "layout": "single", or the run's "dpD.epE" with "world_size",
//                       "topology" and "shard_files" (version 2),
//                       "step": optimizer steps done (the lr schedule's position),
//                       "optimizer_step": AdamW's bias-correction count (skipped steps do not
//                       advance it), "skipped_steps": ..., "data_rng": {"key", "counter"} or null
//                       (an import: the loader keeps its own), "data_source": ...,
//                       "model_config": {every ModelConfig field under its HF key},
//                       "train_config": {every TrainConfig field}}
//   index.json         CheckpointIndex: size and XXH3-64 of every file above
// Loading verifies the index first (a flipped byte or a truncated or missing file is an error
// naming the file), then that the checkpoint's model config equals the model's (an error names
// the first differing key), then every tensor's dtype, shape and coverage (errors name file and
// tensor), and only then writes into the trainer. Either format loads into either kind of
// trainer, under any layout (resharding): each reader takes the ranges it holds.
#pragma once

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"
#include "moetron/train/train_config.h"

namespace moetron {

class Trainer;
struct StepRecord;

inline constexpr const char* kCheckpointModelFile = "model.safetensors";
inline constexpr const char* kCheckpointStateFile = "state.json";

// A ModelConfig back from model_config_to_json (model/config.h), through the model-config parser
// so the result is validated.
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source);
nlohmann::json train_config_to_json(const TrainConfig& config);

// The fields (HF keys) where two model configs differ, ignoring "name"; empty if none.
std::vector<std::string> model_config_differences(const ModelConfig& a, const ModelConfig& b);

// The TrainConfig fields where config differs from the one the checkpoint in dir was saved with,
// as "key: saved -> now" lines (a resumed run with other settings is not the same run).
std::vector<std::string> train_config_differences(const std::filesystem::path& dir,
                                                  const TrainConfig& config);

// The whole training state as plain buffers: what save_training_state writes.
struct TrainingStateView {
    const ModelConfig* model_config = nullptr;
    const TrainConfig* train_config = nullptr;
    const std::vector<ParamEntry>* entries = nullptr;  // index params, m and v alike
    const float* params = nullptr;
    const float* m = nullptr;  // null: zeros (a fresh optimizer)
    const float* v = nullptr;
    int64_t step = 0;
    int64_t optimizer_step = 0;
    int64_t skipped_steps = 0;
    std::optional<RngStream::State> data_rng;
    std::string data_source;
    std::string run_id;  // the run saving (checkpoint_root.h)
};

// Writes root/step-<step> atomically, points root/latest at it and, with keep > 0, deletes the
// run's oldest so that keep of its checkpoints remain (checkpoint_root.h: never another run's,
// never a newer one). Returns the checkpoint directory. Throws when root already holds a
// checkpoint of that step. The caller has claimed root for the run (claim_save_root).
std::filesystem::path save_training_state(const std::filesystem::path& root,
                                          const TrainingStateView& state, size_t keep);

// A checkpoint directory (holding index.json), or a root whose `latest` names one.
std::filesystem::path resolve_checkpoint_dir(const std::filesystem::path& dir_or_root);

// state.json of a checkpoint directory, after verifying the directory's index.
nlohmann::json read_verified_checkpoint_state(const std::filesystem::path& dir);

// The files of a checkpoint that hold tensors: model.safetensors, or state.json's "shard_files".
std::vector<std::string> checkpoint_tensor_files(const std::filesystem::path& dir,
                                                 const nlohmann::json& state);

// state.json of a checkpoint (version 1; the sharded save adds its fields to it).
nlohmann::json training_state_json(const TrainingStateView& state);

// What a trainer resumes from, read from a verified state after checking that the checkpoint's
// model is this one (an error names the differing keys).
struct CheckpointCounters {
    int64_t step = 0;
    int64_t optimizer_step = 0;
    int64_t skipped_steps = 0;
    std::optional<RngStream::State> data_rng;  // null: the loader keeps its own
    std::optional<std::string> run_id;         // null: written before run ids
};
CheckpointCounters checkpoint_counters(const std::filesystem::path& dir,
                                       const nlohmann::json& state, const ModelConfig& model);

// Reads the parameters of a verified checkpoint (either format) into params (laid out by entries,
// the unsharded model's), checking every tensor's name, dtype, shape and coverage; m and v (may
// be null) receive the moments.
void read_checkpoint_tensors(const std::filesystem::path& dir,
                             const std::vector<ParamEntry>& entries, float* params, float* m,
                             float* v);

// The trainer's whole state into root (see save_training_state).
std::filesystem::path save_checkpoint(Trainer& trainer, const std::filesystem::path& root,
                                      size_t keep);
// Restores parameters, moments, optimizer and schedule step, skipped-step count and the data
// loader's RNG from a checkpoint directory or root. Returns the directory loaded.
// A distributed trainer saves and loads through checkpoint_sharded.h (collectives over its
// world: every rank calls these together).
std::filesystem::path load_checkpoint(Trainer& trainer, const std::filesystem::path& dir_or_root);

// ---- stopping on SIGTERM / SIGINT ----
// The handlers only set a flag (the one piece of global mutable state of the checkpoint code, a
// volatile sig_atomic_t as the C++ standard allows a handler to write); the trainer reads it at
// the end of each step, saves and stops. A second signal while saving is ignored. In a
// distributed run the ranks agree on the flag at the end of every step (one all-reduce of a
// number), so that a signal reaching any rank stops every rank after the same step, and every
// rank saves that step.
void install_stop_signal_handlers();
bool stop_signal_received();
void clear_stop_signal();  // for tests that run several trainers in one process

// What Trainer::run consults after each logged step (Trainer::set_run_control).
class RunControl {
  public:
    struct Options {
        std::string save_root;     // "" : no checkpoints
        int64_t save_every = 0;    // 0: only at the end and on a stop signal
        size_t keep = 0;           // 0: keep every checkpoint
        std::FILE* out = nullptr;  // progress lines ("saved ..."); null: quiet
    };
    explicit RunControl(Options options) : options_(std::move(options)) {}
    // Saves when due (every save_every steps, at the last step, on a stop signal). Returns true
    // when the run must stop (a stop signal arrived; on any rank of a distributed trainer).
    bool after_step(Trainer& trainer, const StepRecord& record);
    const std::filesystem::path& last_saved() const { return last_saved_; }

  private:
    Options options_;
    std::filesystem::path last_saved_;
};

}  // namespace moetron
