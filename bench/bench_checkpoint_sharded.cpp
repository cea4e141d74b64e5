// N shard files against one (what a world of one writes), for a model preset (default: small), on
// one process: the training state (fp32 parameters and both AdamW moments) cut into N contiguous
// ranges of the flat buffer (as N ZeRO-1 ranks own it; pieces cut tensors anywhere), written as
// N shard files one after another (checkpoint/checkpoint_pieces.h; a real job writes them in
// parallel), then read back under an M-way cut (resharding) through CheckpointTensors and
// checked bit for bit. Beside it, the same state as one shard holding every tensor whole
// (save_training_state, read_checkpoint_tensors). Write times include each file's fsync.
//   bench_checkpoint_sharded DIR PRESET.toml [N] [M] [REPEATS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/kernels/backend.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"

namespace fs = std::filesystem;
using namespace moetron;

namespace {

struct Range {
    int64_t begin, end;
};

Range cut(int64_t n, int parts, int k) {
    return {n * k / parts, n * (k + 1) / parts};
}

std::vector<int64_t> dims_of(const ParamEntry& e) {
    return {e.shape.dims.begin(), e.shape.dims.begin() + e.shape.ndim};
}

// Calls f(entry, lo, hi) for the part [lo, hi) (flat offsets) of every tensor inside r.
template <class F>
void for_each_piece(const std::vector<ParamEntry>& entries, Range r, F f) {
    for (const ParamEntry& e : entries) {
        const int64_t lo = std::max(r.begin, e.offset), hi = std::min(r.end, e.offset + e.numel);
        if (lo < hi) f(e, lo, hi);
    }
}

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc < 3) {
            std::fprintf(stderr,
                         "usage: bench_checkpoint_sharded DIR PRESET.toml [N] [M] "
                         "[REPEATS]\n");
            return 2;
        }
        const fs::path root = argv[1];
        const ModelConfig config = load_model_config(argv[2]);
        const int num_writers = argc > 3 ? std::atoi(argv[3]) : 4;
        const int num_readers = argc > 4 ? std::atoi(argv[4]) : 2;
        const int repeats = argc > 5 ? std::atoi(argv[5]) : 2;
        MT_CHECK(num_writers >= 1 && num_readers >= 1 && repeats >= 1, "N, M, REPEATS >= 1");
        const TrainConfig train;
        const ParamTable table(model_param_specs(config));
        const std::vector<ParamEntry>& entries = table.entries();
        const int64_t n = table.total_numel();
        std::vector<float> params(static_cast<size_t>(n)), m(params.size()), v(params.size());
        table.initialize(cpu_backend(), params.data(), 1);
        for (size_t i = 0; i < params.size(); ++i) {
            m[i] = 1e-3f * params[i];
            v[i] = params[i] * params[i];
        }
        const double state_bytes = 3.0 * 4.0 * static_cast<double>(n);
        std::printf("model %s: %.1fM parameters, state %.3f GB; %d shard files, read as %d\n",
                    config.name.c_str(), static_cast<double>(n) / 1e6, state_bytes / 1e9,
                    num_writers, num_readers);

        for (int r = 0; r < repeats; ++r) {
            fs::remove_all(root);
            fs::create_directories(root / "sharded");
            // One shard, every tensor whole.
            TrainingStateView st;
            st.model_config = &config;
            st.train_config = &train;
            st.entries = &entries;
            st.params = params.data();
            st.run_id = new_run_id();
            st.m = m.data();
            st.v = v.data();
            st.step = 1;
            Timer t;
            const fs::path single = save_training_state(root / "single", st, 0);
            const double single_write_s = t.elapsed_s();
            std::vector<float> p2(params.size()), m2(params.size()), v2(params.size());
            t.reset();
            read_checkpoint_tensors(single, entries, p2.data(), m2.data(), v2.data());
            const double single_read_s = t.elapsed_s();

            // N shard files.
            std::vector<std::string> files;
            t.reset();
            for (int k = 0; k < num_writers; ++k) {
                std::vector<CheckpointPiece> pieces;
                for_each_piece(entries, cut(n, num_writers, k),
                               [&](const ParamEntry& e, int64_t lo, int64_t hi) {
                                   const int64_t b = lo - e.offset, end = hi - e.offset;
                                   pieces.push_back({CheckpointPart::param, e.name, dims_of(e), b,
                                                     end, params.data() + lo});
                                   pieces.push_back({CheckpointPart::m, e.name, dims_of(e), b, end,
                                                     m.data() + lo});
                                   pieces.push_back({CheckpointPart::v, e.name, dims_of(e), b, end,
                                                     v.data() + lo});
                               });
                files.push_back("shard-" + std::to_string(k) + ".safetensors");
                write_checkpoint_shard((root / "sharded" / files.back()).string(), pieces, {});
            }
            const double sharded_write_s = t.elapsed_s();
            std::fill(p2.begin(), p2.end(), 0.0f);
            std::fill(m2.begin(), m2.end(), 0.0f);
            std::fill(v2.begin(), v2.end(), 0.0f);
            t.reset();
            const CheckpointTensors tensors =
                CheckpointTensors::open(root / "sharded", files, entries);
            for (int k = 0; k < num_readers; ++k) {
                for_each_piece(
                    entries, cut(n, num_readers, k),
                    [&](const ParamEntry& e, int64_t lo, int64_t hi) {
                        const int64_t b = lo - e.offset;
                        tensors.read(CheckpointPart::param, e.name, b, hi - lo, p2.data() + lo);
                        tensors.read(CheckpointPart::m, e.name, b, hi - lo, m2.data() + lo);
                        tensors.read(CheckpointPart::v, e.name, b, hi - lo, v2.data() + lo);
                    });
            }
            const double sharded_read_s = t.elapsed_s();
            const size_t bytes = params.size() * sizeof(float);
            MT_CHECK(std::memcmp(p2.data(), params.data(), bytes) == 0 &&
                         std::memcmp(m2.data(), m.data(), bytes) == 0 &&
                         std::memcmp(v2.data(), v.data(), bytes) == 0,
                     "the resharded read differs from the state written");
            std::printf(
                "repeat %d: single file write %.2f GB/s (%.2f s), read %.2f GB/s (%.2f s) | "
                "%d shards write %.2f GB/s (%.2f s), read as %d %.2f GB/s (%.2f s)\n",
                r + 1, state_bytes / single_write_s / 1e9, single_write_s,
                state_bytes / single_read_s / 1e9, single_read_s, num_writers,
                state_bytes / sharded_write_s / 1e9, sharded_write_s, num_readers,
                state_bytes / sharded_read_s / 1e9, sharded_read_s);
        }
        fs::remove_all(root);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_checkpoint_sharded: %s\n", e.what());
        return 1;
    }
}
