// Checkpoint save and load throughput for a model preset (default: small): the full training
// state (fp32 parameters and both AdamW moments) through train/checkpoint.h, in GB/s of
// model.safetensors. Run by bench/bench_checkpoint.sh, which measures the disk's sequential write
// speed with dd beside it. Save includes fsync of every file and the directory commit; load
// includes verifying the XXH3 index (one read of every byte) and the checked tensor reads.
//   bench_checkpoint DIR PRESET.toml [REPEATS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "moetron/core/timer.h"
#include "moetron/kernels/backend.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"

namespace fs = std::filesystem;
using namespace moetron;

int main(int argc, char** argv) {
    try {
        if (argc < 3) {
            std::fprintf(stderr, "usage: bench_checkpoint DIR PRESET.toml [REPEATS]\n");
            return 2;
        }
        const fs::path root = argv[1];
        const std::string preset = argv[2];
        const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
        const ModelConfig config = load_model_config(preset);
        const TrainConfig train;
        const ParamTable table(model_param_specs(config));
        const auto n = static_cast<size_t>(table.total_numel());
        std::vector<float> params(n), m(n), v(n);
        table.initialize(cpu_backend(), params.data(), 1);
        for (size_t i = 0; i < n; ++i) {
            m[i] = 1e-3f * params[i];
            v[i] = params[i] * params[i];
        }
        TrainingStateView st;
        st.model_config = &config;
        st.train_config = &train;
        st.entries = &table.entries();
        st.params = params.data();
        st.run_id = new_run_id();
        st.m = m.data();
        st.v = v.data();
        std::printf("model %s: %.1fM parameters, checkpoint %.3f GB (params + m + v, fp32)\n",
                    config.name.c_str(), static_cast<double>(n) / 1e6,
                    3.0 * 4.0 * static_cast<double>(n) / 1e9);
        double best_save = 0, best_load = 0, best_read = 0;
        for (int r = 0; r < repeats; ++r) {
            fs::remove_all(root);
            st.step = r + 1;
            Timer t;
            const fs::path dir = save_training_state(root, st, 0);
            const double save_s = t.elapsed_s();
            const double bytes =
                static_cast<double>(fs::file_size(dir / checkpoint_shard_file_name(0, 1)));
            t.reset();
            read_verified_checkpoint_state(dir);
            const double verify_s = t.elapsed_s();
            t.reset();
            read_checkpoint_tensors(dir, table.entries(), params.data(), m.data(), v.data());
            const double read_s = t.elapsed_s();
            const double save = bytes / save_s / 1e9, load = bytes / (verify_s + read_s) / 1e9,
                         read = bytes / read_s / 1e9;
            std::printf(
                "repeat %d: save %.2f GB/s (%.2f s), load %.2f GB/s (verify %.2f s + "
                "read %.2f s; read alone %.2f GB/s)\n",
                r + 1, save, save_s, load, verify_s, read_s, read);
            best_save = std::max(best_save, save);
            best_load = std::max(best_load, load);
            best_read = std::max(best_read, read);
        }
        fs::remove_all(root);
        std::printf("best: save %.2f GB/s, load %.2f GB/s (read alone %.2f GB/s)\n", best_save,
                    best_load, best_read);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
        return 1;
    }
}
