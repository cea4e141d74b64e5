#include "moetron/checkpoint/checkpoint_sharded.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "moetron/model/model.h"
#include "moetron/model/moe.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/topology.h"

namespace moetron {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void broadcast_string(parallel::Communicator& comm, std::string& text, int root) {
    int64_t length = static_cast<int64_t>(text.size());
    comm.broadcast(&length, 1, DType::i64, root, kHostStream);
    text.resize(static_cast<size_t>(length));
    if (length > 0) comm.broadcast(text.data(), text.size(), DType::u8, root, kHostStream);
}

std::string what_failed(const std::exception& e) {
    const std::string what = e.what();
    return what.empty() ? std::string("an unknown error") : what;
}

// A contiguous part of a rank's local tensor that is one block of the global tensor.
struct LocalBlock {
    TensorBlock block;
    int64_t local_offset = 0;  // of the block's first element, in the local tensor
    int64_t numel = 0;
};

// The unsharded model's tensors (global names and shapes), and where a rank's local tensors sit
// in them.
class GlobalTensors {
  public:
    explicit GlobalTensors(const Model& model)
        : table_(model_param_specs(model.config())), shard_(model.expert_shard()), model_(model) {
        for (const ParamEntry& e : table_.entries()) by_name_.emplace(e.name, &e);
    }
    const std::vector<ParamEntry>& entries() const { return table_.entries(); }
    const ParamEntry& global(const ParamEntry& local) const {
        const auto it = by_name_.find(local.name);
        MT_CHECK(it != by_name_.end(), "[checkpoint] tensor '{}' is not in the model's table",
                 local.name);
        return *it->second;
    }
    std::vector<int64_t> dims(const ParamEntry& local) const {
        const Shape& s = global(local).shape;
        return {s.dims.begin(), s.dims.begin() + s.ndim};
    }
    // The local tensor as blocks of the global one, back to back: a rank's routed experts
    // [first, first + count) of (E, ...); a tensor-parallel shard's row blocks (column-parallel:
    // rows [r*b, (r+1)*b) of each of its `blocks` row blocks) or its column block (row-parallel:
    // columns [r*c, (r+1)*c) of every row), as model/params.h's TensorParallelShard; else the
    // whole tensor. With redundant experts each local slot is the block of the logical expert it
    // holds (so a checkpoint keeps logical experts, whatever the placement); when `writing`, only
    // an expert's first replica is, so that every element is written once.
    std::vector<LocalBlock> blocks(const ParamEntry& local, bool writing) const {
        const std::vector<int64_t> g = dims(local);
        const int64_t moe_layer = model_.moe_layer_of(local.name);
        if (moe_layer >= 0) {
            const parallel::ExpertPlacement& placement = *model_.expert_placement(moe_layer);
            std::vector<LocalBlock> out;
            const int64_t per_slot = local.numel / shard_.count;
            for (int64_t i = 0; i < shard_.count; ++i) {
                const int32_t e = placement.slot_expert[static_cast<size_t>(shard_.first + i)];
                if (writing && placement.slots_of(e)[0] != shard_.first + i) continue;
                TensorBlock b{std::vector<int64_t>(g.size(), 0), g};
                b.begin[0] = e;
                b.end[0] = e + 1;
                out.push_back({b, i * per_slot, per_slot});
            }
            return out;
        }
        if (shard_.count > 0 && is_routed_expert_param(local.name)) {
            TensorBlock b{std::vector<int64_t>(g.size(), 0), g};
            b.begin[0] = shard_.first;
            b.end[0] = shard_.first + shard_.count;
            return {{b, 0, local.numel}};
        }
        const TensorParallelShard& tp = local.tp;
        if (!tp.sharded()) return {{TensorBlock{}, 0, local.numel}};
        MT_CHECK(g.size() == 2, "[checkpoint] tensor-parallel tensor '{}' is {}, not a matrix",
                 local.name, dims_string(g));
        const int64_t rows = g[0], cols = g[1];
        std::vector<LocalBlock> out;
        if (tp.split == TensorParallelShard::Split::rows) {
            const int64_t block_rows = rows / tp.blocks, local_rows = block_rows / tp.size;
            for (int64_t b = 0; b < tp.blocks; ++b) {
                const int64_t first_row = b * block_rows + tp.rank * local_rows;
                out.push_back({TensorBlock{{first_row, 0}, {first_row + local_rows, cols}},
                               b * local_rows * cols, local_rows * cols});
            }
        } else {
            const int64_t local_cols = cols / tp.size;
            out.push_back(
                {TensorBlock{{0, tp.rank * local_cols}, {rows, (tp.rank + 1) * local_cols}}, 0,
                 rows * local_cols});
        }
        int64_t total = 0;
        for (const LocalBlock& b : out) total += b.numel;
        MT_CHECK(total == local.numel,
                 "[checkpoint] the tensor-parallel blocks of '{}' hold {} elements, the rank {}",
                 local.name, total, local.numel);
        return out;
    }

  private:
    ParamTable table_;
    ExpertShard shard_;
    const Model& model_;  // its redundant experts' placements
    std::unordered_map<std::string, const ParamEntry*> by_name_;
};

// Calls f(entry, lo, hi) for the part [lo, hi) of every local tensor that overlaps the flat
// range [offset, offset + numel) (entries are sorted by offset and back to back).
template <class F>
void for_each_overlap(const std::vector<ParamEntry>& entries, int64_t offset, int64_t numel, F f) {
    const int64_t end = offset + numel;
    auto it = std::upper_bound(
        entries.begin(), entries.end(), offset,
        [](int64_t value, const ParamEntry& e) { return value < e.offset + e.numel; });
    for (; it != entries.end() && it->offset < end; ++it)
        f(*it, std::max(offset, it->offset), std::min(end, it->offset + it->numel));
}

// Calls f(block, begin, end, at) for each global block that the part [lo, hi) of local tensor e
// (flat offsets into the parameter buffer) overlaps: elements [begin, end) of the block, which
// start at flat offset `at`. A ZeRO-1 range can span several row blocks of a column-parallel
// tensor, and cut a block anywhere. writing: the blocks this rank writes (GlobalTensors::blocks).
template <class F>
void for_each_block_part(const GlobalTensors& global, const ParamEntry& e, int64_t lo, int64_t hi,
                         bool writing, F f) {
    for (const LocalBlock& b : global.blocks(e, writing)) {
        const int64_t first = e.offset + b.local_offset;
        const int64_t from = std::max(lo, first), to = std::min(hi, first + b.numel);
        if (from < to) f(b.block, from - first, to - first, from);
    }
}

// A tensor that every rank of the TP group holds whole and alike (norms, the MLA down
// projections, the router; not the routed experts, which are outside TP): its first TP rank
// writes it.
bool tp_replica_writes(const ParamEntry& e, const parallel::RankCoordinates& c) {
    return e.tp.sharded() || is_routed_expert_param(e.name) || c.tp == 0;
}

// What this rank (c) writes (see the top of checkpoint_sharded.h). The pieces point into the
// model's parameters and the optimizer's moments.
std::vector<CheckpointPiece> pieces_of_this_rank(Model& model,
                                                 const std::vector<MomentShard>& moments,
                                                 const parallel::RankCoordinates& c,
                                                 const GlobalTensors& global) {
    const std::vector<ParamEntry>& entries = model.param_entries();
    const float* params = model.params();
    // The MTP stage's copy of a pipeline's shared embedding: the first stage writes it.
    const bool embedding_copy = !model.runs_embedding();
    auto writes = [&](const ParamEntry& e) {
        return tp_replica_writes(e, c) && !(embedding_copy && e.name == "embed");
    };
    std::vector<CheckpointPiece> pieces;
    for (const MomentShard& r : moments) {
        if (r.replicated && r.group_rank != 0) continue;  // another replica writes it
        for_each_overlap(
            entries, r.offset, r.numel, [&](const ParamEntry& e, int64_t lo, int64_t hi) {
                if (!writes(e)) return;
                const std::vector<int64_t> dims = global.dims(e);
                for_each_block_part(
                    global, e, lo, hi, /*writing=*/true,
                    [&](const TensorBlock& block, int64_t begin, int64_t end, int64_t at) {
                        const int64_t moment = at - r.offset;
                        pieces.push_back(
                            {CheckpointPart::param, e.name, dims, begin, end, params + at, block});
                        pieces.push_back(
                            {CheckpointPart::m, e.name, dims, begin, end, r.m + moment, block});
                        pieces.push_back(
                            {CheckpointPart::v, e.name, dims, begin, end, r.v + moment, block});
                    });
            });
    }
    // Tensors without moments: by the first rank of their replica group.
    for (const ParamEntry& e : entries) {
        if (e.trainable || e.numel == 0) continue;
        const int replica = is_routed_expert_param(e.name) ? c.edp : c.dp;
        if (replica != 0 || !writes(e)) continue;
        for_each_block_part(global, e, e.offset, e.offset + e.numel, /*writing=*/true,
                            [&](const TensorBlock& block, int64_t begin, int64_t end, int64_t at) {
                                pieces.push_back({CheckpointPart::param, e.name, global.dims(e),
                                                  begin, end, params + at, block});
                            });
    }
    return pieces;
}

}  // namespace

std::string checkpoint_shard_file_name(int rank, int world_size) {
    return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, world_size);
}

std::string checkpoint_layout_name(const parallel::Topology& t) {
    return t.layout().str();
}

std::map<std::string, std::string> checkpoint_shard_metadata(int rank,
                                                             const parallel::Topology& topology) {
    return {{"format", "moetron-checkpoint-shard"},
            {"rank", std::to_string(rank)},
            {"world_size", std::to_string(topology.world_size)},
            {"layout", checkpoint_layout_name(topology)}};
}

void throw_if_any_rank_failed(parallel::Communicator& comm, const std::string& error,
                              std::string_view what) {
    const auto n = static_cast<size_t>(comm.size());
    int64_t mine = static_cast<int64_t>(error.size());
    std::vector<int64_t> lengths(n);
    comm.all_gather(lengths.data(), &mine, 1, DType::i64, kHostStream);
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    if (longest == 0) return;
    std::string own = error;
    own.resize(static_cast<size_t>(longest));
    std::string all(static_cast<size_t>(longest) * n, '\0');
    comm.all_gather(all.data(), own.data(), static_cast<size_t>(longest), DType::u8, kHostStream);
    // Ranks with the same error are listed together (a missing file fails every rank alike).
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (size_t r = 0; r < n; ++r) {
        if (lengths[r] == 0) continue;
        std::string message =
            all.substr(r * static_cast<size_t>(longest), static_cast<size_t>(lengths[r]));
        auto it = std::find_if(groups.begin(), groups.end(),
                               [&](const auto& g) { return g.first == message; });
        if (it == groups.end()) {
            groups.push_back({std::move(message), {}});
            it = groups.end() - 1;
        }
        it->second.push_back(static_cast<int>(r));
    }
    std::string report;
    for (const auto& [message, ranks] : groups) {
        report += fmt::format("\n  {} {} of '{}': {}", ranks.size() == 1 ? "rank" : "ranks",
                              fmt::join(ranks, ", "), comm.name(), message);
    }
    MT_THROW("[checkpoint] {} failed:{}", what, report);
}

bool any_rank(parallel::Communicator& comm, bool flag) {
    double count = flag ? 1.0 : 0.0;
    comm.all_reduce_sum(&count, 1, DType::f64, kHostStream);
    return count > 0;
}

void run_on_every_rank(parallel::Communicator& comm, std::string_view what,
                       const std::function<void()>& step) {
    std::string error;
    try {
        step();
    } catch (const std::exception& e) {
        error = what_failed(e);
    }
    throw_if_any_rank_failed(comm, error, what);
}

fs::path save_sharded_checkpoint(parallel::Communicator& world, Model& model,
                                 const std::vector<MomentShard>& moments,
                                 const TrainingStateView& state, const json& expert_balance,
                                 const fs::path& root, size_t keep, std::string_view what) {
    const int rank = world.rank();
    std::string error;

    // Rank 0 opens the staging directory that every rank writes into.
    std::unique_ptr<StagedDir> staged;
    std::string staging;
    if (rank == 0) {
        try {
            staged = stage_checkpoint_dir(root, state.step, state.run_id);
            staging = staged->path().string();
        } catch (const std::exception& e) {
            error = what_failed(e);
        }
    }
    throw_if_any_rank_failed(world, error, what);
    broadcast_string(world, staging, 0);

    // Every rank: its shard, fsync'ed.
    const std::string shard = checkpoint_shard_file_name(rank, world.size());
    FileDigest digest;
    try {
        const GlobalTensors global(model);
        const std::vector<CheckpointPiece> pieces = pieces_of_this_rank(
            model, moments, parallel::coordinates_of(state.topology, rank), global);
        digest = write_checkpoint_shard((fs::path(staging) / shard).string(), pieces,
                                        checkpoint_shard_metadata(rank, state.topology));
    } catch (const std::exception& e) {
        error = what_failed(e);
    }
    throw_if_any_rank_failed(world, error, what);  // also the barrier: every shard is on disk

    // Rank 0: the index (with every shard's checksum), the state, commit, `latest`.
    const std::array<uint64_t, 2> own{digest.num_bytes, digest.xxh3};
    std::vector<uint64_t> digests(2 * static_cast<size_t>(world.size()));
    world.all_gather(digests.data(), own.data(), 2, DType::i64,
                     kHostStream);  // 64-bit words, moved only
    if (rank == 0) {
        try {
            CheckpointIndex index;
            for (int r = 0; r < world.size(); ++r)
                index.add(
                    checkpoint_shard_file_name(r, world.size()),
                    {digests[2 * static_cast<size_t>(r)], digests[2 * static_cast<size_t>(r) + 1]});
            json state_json = training_state_json(state);
            if (!expert_balance.is_null()) state_json["expert_balance"] = expert_balance;
            commit_checkpoint_dir(*staged, root, index, state_json, keep);
        } catch (const std::exception& e) {
            error = what_failed(e);
        }
    }
    throw_if_any_rank_failed(world, error, what);
    return root / checkpoint_dir_name(static_cast<uint64_t>(state.step));
}

OpenedCheckpoint open_checkpoint_on_every_rank(parallel::Communicator& world,
                                               const fs::path& dir_or_root, Model& model,
                                               std::string_view what) {
    const GlobalTensors global(model);
    OpenedCheckpoint opened;
    std::string error;
    try {
        opened.dir = resolve_checkpoint_dir(dir_or_root);
        const json state = read_verified_checkpoint_state(opened.dir);
        opened.counters = checkpoint_counters(opened.dir, state, model.config());
        if (state.contains("expert_balance")) opened.expert_balance = state.at("expert_balance");
        opened.tensors.emplace(CheckpointTensors::open(
            opened.dir, checkpoint_tensor_files(opened.dir, state), global.entries()));
    } catch (const std::exception& e) {
        error = what_failed(e);
    }
    throw_if_any_rank_failed(world, error, what);
    return opened;
}

void read_rank_tensors(const OpenedCheckpoint& opened, Model& model,
                       const std::vector<MomentShard>& moments) {
    MT_CHECK(opened.tensors.has_value(), "[checkpoint] '{}' was not opened", opened.dir.string());
    const CheckpointTensors& tensors = *opened.tensors;
    const GlobalTensors global(model);
    for (const ParamEntry& e : model.param_entries())
        for_each_block_part(global, e, e.offset, e.offset + e.numel, /*writing=*/false,
                            [&](const TensorBlock& block, int64_t begin, int64_t end, int64_t at) {
                                tensors.read(CheckpointPart::param, e.name, block, begin,
                                             end - begin, model.params() + at);
                            });
    for (const MomentShard& r : moments) {
        for_each_overlap(model.param_entries(), r.offset, r.numel,
                         [&](const ParamEntry& e, int64_t lo, int64_t hi) {
                             for_each_block_part(global, e, lo, hi, /*writing=*/false,
                                                 [&](const TensorBlock& block, int64_t begin,
                                                     int64_t end, int64_t at) {
                                                     const int64_t moment = at - r.offset;
                                                     tensors.read(CheckpointPart::m, e.name, block,
                                                                  begin, end - begin, r.m + moment);
                                                     tensors.read(CheckpointPart::v, e.name, block,
                                                                  begin, end - begin, r.v + moment);
                                                 });
                         });
    }
}

}  // namespace moetron
