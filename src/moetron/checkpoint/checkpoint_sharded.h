// The collective save and load of a trainer's checkpoints (save_checkpoint and load_checkpoint of
// train/checkpoint.h fill them from the Trainer), for every world size: one safetensors shard
// file per rank plus state.json and index.json (checkpoint_dir.h has the directory;
// checkpoint_pieces.h the pieces), saved and loaded by every rank of the trainer's world
// together. One process is a world of one: it writes one shard holding everything.
//
// Who writes what: a rank writes the pieces it alone is responsible for, by the optimizer's
// buckets (train/optimizer.h's moment ranges): the parameters and both moments of its
// ZeRO-1 shards (the routed experts' sharded over the expert-data-parallel group); of a replicated
// bucket (--no-zero1) the first rank of the bucket's group writes the whole bucket; a
// tensor without moments (the router correction bias) is written by the first rank of its
// replica group. Under tensor parallelism each TP rank writes its shard of a split tensor (as
// blocks of the global tensor, checkpoint_pieces.h), and a tensor every TP rank holds whole is
// written by TP rank 0 alone. Together the files hold every element of every part once, under
// its global name and position, whatever the layout.
//
// The checkpoint root must be a directory every rank of the job sees (one machine, or a shared
// file system across nodes).
//
// Saving: rank 0 opens the staging directory (atomic_dir.h) and tells the others its path; every
// rank writes and fsyncs its shard there; an exchange of errors (the barrier) follows; rank 0
// writes state.json (its loader state: every rank draws the same batches) and index.json with the
// shard checksums the others sent, commits and moves `latest`. A failure on any rank (at any of
// these points) throws on every rank, naming the rank and its error, and leaves the previous
// checkpoint and `latest` as they were (rank 0's staging directory is removed).
//
// Loading: every rank verifies the whole checkpoint (index checksums, model config, that the
// pieces cover every tensor) and then reads the ranges it holds under its own layout: its
// experts' slice, its TP blocks, its ZeRO-1 shards of the moments (whatever tp wrote them). Each
// rank reads every file's checksum, which is fine for the tiny and small models; a large model
// would verify once per node. Errors are exchanged before anything is written into the trainer, and
// again after reading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/topology.h"

namespace moetron {

class Model;

// "shard-00001-of-00004.safetensors"
std::string checkpoint_shard_file_name(int rank, int world_size);
// "tp1.pp1.vpp1.ep2.cp1.dp2" (Layout::str, the one spelling of a layout): the "layout" of
// state.json and of the shard files. Checkpoints written before it hold "dp2.tp1.ep2" there; no
// reader parses the field (a load reshards by the tensors' own ranges), so both load.
std::string checkpoint_layout_name(const parallel::Topology& topology);
// The "__metadata__" of rank's shard file (beside its "slices").
std::map<std::string, std::string> checkpoint_shard_metadata(int rank,
                                                             const parallel::Topology& topology);

// A collective over comm: returns when error is empty on every rank, else throws on every rank
// "[checkpoint] <what> failed on rank R: <error>" (ranks with the same error listed together).
void throw_if_any_rank_failed(parallel::Communicator& comm, const std::string& error,
                              std::string_view what);
// A collective over comm: whether flag is set on any rank (the agreed stop signal).
bool any_rank(parallel::Communicator& comm, bool flag);
// A collective over comm: runs step on this rank, then throw_if_any_rank_failed with the error it
// threw (empty when none), so that every rank throws when it failed on any.
void run_on_every_rank(parallel::Communicator& comm, std::string_view what,
                       const std::function<void()>& step);

// A range of the optimizer's moments that this rank keeps (train/optimizer.h's
// AdamW::MomentRange): what the save writes and the load reads, in place.
struct MomentShard {
    int64_t offset = 0;  // first float, in the flat parameter buffer
    int64_t numel = 0;
    bool replicated = false;  // every rank of the bucket's group keeps the same moments
    int group_rank = 0;       // this rank in that group
    float* m = nullptr;       // numel floats each
    float* v = nullptr;
};

// The collective save, once every rank's state is known to be safe to save (every rank of world
// calls it; `what` names the save in errors): rank 0 stages root/step-<state.step>, every rank
// writes its shard of model's parameters and of moments, rank 0 writes state.json (state, with
// expert_balance under "expert_balance" unless it is null) and index.json, commits and moves
// `latest`, then applies retention (keep > 0). Returns the checkpoint directory.
std::filesystem::path save_sharded_checkpoint(parallel::Communicator& world, Model& model,
                                              const std::vector<MomentShard>& moments,
                                              const TrainingStateView& state,
                                              const nlohmann::json& expert_balance,
                                              const std::filesystem::path& root, size_t keep,
                                              std::string_view what);

// What every rank has checked and opened before a load writes anything.
struct OpenedCheckpoint {
    std::filesystem::path dir;  // the checkpoint directory (a root resolved through `latest`)
    CheckpointCounters counters;
    nlohmann::json expert_balance;  // state.json's "expert_balance"; null: none saved
    std::optional<CheckpointTensors> tensors;
};
// A load's first half, a collective over world: every rank resolves dir_or_root, verifies the
// index, checks that the checkpoint is one of model (its config; every tensor's shape and
// coverage) and opens its tensor files. Throws on every rank when any failed.
OpenedCheckpoint open_checkpoint_on_every_rank(parallel::Communicator& world,
                                               const std::filesystem::path& dir_or_root,
                                               Model& model, std::string_view what);
// Its second half, on each rank (the caller exchanges the errors): reads the ranges this rank
// holds under its layout into model's parameters (its experts' slots as the model's placements
// name them, its TP blocks) and into moments (its ZeRO-1 shards, whatever tp wrote them).
void read_rank_tensors(const OpenedCheckpoint& opened, Model& model,
                       const std::vector<MomentShard>& moments);

}  // namespace moetron
