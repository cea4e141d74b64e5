// Training checkpoints: everything a run needs to continue bit for bit where it stopped, on one
// process or on every rank of an MPI job, and to continue under another parallel layout. One
// format for every world size: a single process is a world of one and writes one shard.
//
// A checkpoint root holds step-XXXXXXXX directories (atomic_dir.h: written as a staging
// directory, fsync'ed, renamed; `latest` names the newest; old ones removed by retention) and
// belongs to one run (checkpoint_root.h: which runs may save there, what retention may delete).
// `moetron train --save-final`, `moetron import` and `--save` all write such roots, and
// `moetron train --resume`, `sample` and `export` read them. One checkpoint directory holds:
//   shard-RRRRR-of-NNNNN.safetensors  one per rank (checkpoint_sharded.h): the pieces of the fp32
//                      master parameters (the router correction biases are parameters) and of
//                      AdamW's moments that the rank was responsible for, each described by its
//                      global name, global shape and element range (checkpoint_pieces.h)
//   state.json         {"format": "moetron-checkpoint", "version": 2,
//                       "run_id": the run that wrote it (checkpoint_root.h),
//                       "layout": the run's layout as Layout::str spells it
//                       ("tp1.pp1.vpp1.ep2.cp1.dp2"; older checkpoints: "dp2.tp1.ep2"),
//                       "world_size", "topology" (Topology::str),
//                       "shard_files": [the shard files],
//                       "step": optimizer steps done (the lr schedule's position),
//                       "optimizer_step": AdamW's bias-correction count (skipped steps do not
//                       advance it), "skipped_steps": ..., "data_rng": {"key", "counter"} or null
//                       (an import: the loader keeps its own), "data_source": ...,
//                       "model_config": {every ModelConfig field under its HF key},
//                       "train_config": {every TrainConfig field}}
//   index.json         CheckpointIndex: size and XXH3-64 of every file above
// Version 1 (written before one process became a world of one: one model.safetensors with every
// tensor whole and AdamW's moments as "optimizer.m.<name>", "optimizer.v.<name>", layout
// "single") is still read, by every reader.
// Loading verifies the index first (a flipped byte or a truncated or missing file is an error
// naming the file), then that the checkpoint's model config equals the model's (an error names
// the first differing key), then every tensor's dtype, shape and coverage (errors name file and
// tensor), and only then writes into the trainer. A checkpoint loads under any layout and world
// size (resharding): each rank reads the ranges it holds.
//
// This file is the format: state.json, a process's whole state saved as one shard, and the
// reads. A trainer saves and loads with train/checkpoint.h's save_checkpoint and load_checkpoint,
// which fill checkpoint_sharded.h's collective save and load from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moetron/checkpoint/train_config.h"
#include "moetron/core/rng.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"
#include "moetron/parallel/topology.h"

namespace moetron {

class StagedDir;         // atomic_dir.h
struct CheckpointIndex;  // checksum.h

inline constexpr const char* kCheckpointStateFile = "state.json";
// The largest state.json read: it holds two configs and a few counters; larger is not one of ours.
inline constexpr uint64_t kMaxCheckpointStateBytes = 1 << 20;
// state.json's "version" of the checkpoints this build writes (shards, every world size).
inline constexpr int kCheckpointVersion = 2;
// The single file of a version 1 checkpoint, still read.
inline constexpr int kSingleFileCheckpointVersion = 1;
inline constexpr const char* kSingleFileCheckpointModelFile = "model.safetensors";

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

// The run a checkpoint belongs to, as it was configured: what `moetron train --resume`
// continues unless the command line overrides a setting. Reads state.json only (loading the
// checkpoint verifies every file).
struct CheckpointRun {
    std::filesystem::path dir;  // the checkpoint directory (a root resolved through `latest`)
    ModelConfig model;
    TrainConfig train;
    std::string data_source;  // a token or text file's path, "synthetic", or "imported from ..."
    int64_t step = 0;         // optimizer steps done
};
CheckpointRun read_checkpoint_run(const std::filesystem::path& dir_or_root);
TrainConfig train_config_from_json(const nlohmann::json& json, const std::string& source);

// The whole training state of one process as plain buffers: what save_training_state writes
// (`moetron import`, benchmarks and tests; a trainer saves with train/checkpoint.h's
// save_checkpoint).
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
    // The layout of the ranks that wrote the shards (state.json's "layout", "world_size",
    // "topology", "shard_files"); save_training_state writes the one shard of a world of one.
    parallel::Topology topology;
};

// Writes root/step-<step> (one shard: every tensor whole) atomically, points root/latest at it and,
// with keep > 0, deletes the run's oldest so that keep of its checkpoints remain
// (checkpoint_root.h: never another run's, never a newer one). Returns the checkpoint directory.
// Throws when root already holds a checkpoint of that step. The caller has claimed root for the run
// (claim_save_root).
std::filesystem::path save_training_state(const std::filesystem::path& root,
                                          const TrainingStateView& state, size_t keep);

// A checkpoint directory (holding index.json), or a root whose `latest` names one.
std::filesystem::path resolve_checkpoint_dir(const std::filesystem::path& dir_or_root);

// state.json of a checkpoint directory, after verifying the directory's index.
nlohmann::json read_verified_checkpoint_state(const std::filesystem::path& dir);

// The files of a checkpoint that hold tensors: state.json's "shard_files" (version 1:
// model.safetensors).
std::vector<std::string> checkpoint_tensor_files(const std::filesystem::path& dir,
                                                 const nlohmann::json& state);

// state.json of a checkpoint.
nlohmann::json training_state_json(const TrainingStateView& state);

// The steps of every save, for save_training_state and the trainer's collective save: the
// staging directory of root/step-<step> (creating root; throws when that checkpoint exists), and,
// once the tensor files are in it and in index, the state and the index written, the directory
// committed, `latest` moved and retention applied (keep > 0).
std::unique_ptr<StagedDir> stage_checkpoint_dir(const std::filesystem::path& root, int64_t step,
                                                const std::string& run_id);
std::filesystem::path commit_checkpoint_dir(StagedDir& staged, const std::filesystem::path& root,
                                            CheckpointIndex& index, const nlohmann::json& state,
                                            size_t keep);

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

// Reads the parameters of a verified checkpoint (any world size) into params (laid out by entries,
// the unsharded model's), checking every tensor's name, dtype, shape and coverage; m and v (may
// be null) receive the moments.
void read_checkpoint_tensors(const std::filesystem::path& dir,
                             const std::vector<ParamEntry>& entries, float* params, float* m,
                             float* v);

}  // namespace moetron
