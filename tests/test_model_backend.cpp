// The op seam on the model side: a Model runs all of its math through the Backend it was built
// for (a ProfilingBackend around cpu_backend() sees every op of initialization, a training step
// and the router bias update, with the same numbers as a model on cpu_backend()), and model/'s
// sources call no CPU kernel and hold no OpenMP loop of their own.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moetron/kernels/profiling_backend.h"
#include "moetron/model/model.h"
#include "tiny_model_config.h"

namespace moetron {
namespace {

using testing::tiny_model_config;

constexpr int64_t kBatch = 2, kSeqLen = 16;

struct Step {
    std::vector<int32_t> tokens, targets;
    Step() {
        for (int64_t i = 0; i < kBatch * kSeqLen; ++i) {
            tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
            targets.push_back(
                i % kSeqLen == kSeqLen - 1 ? -1 : static_cast<int32_t>((i * 53 + 5) % 256));
        }
    }
};

// Initialization, one training step and a bias update; the losses of the step.
MicroBatchLosses run_step(Model& model, const Step& step) {
    model.init_parameters(7);
    const MicroBatchLosses losses =
        model.forward_backward(step.tokens.data(), step.targets.data(), kBatch, kSeqLen, 1.0f);
    model.update_router_bias(0.001f);
    return losses;
}

bool same_floats(const float* a, const float* b, int64_t n) {
    return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(ModelBackend, EveryOpOfAStepGoesThroughTheModelsBackend) {
    ProfilingBackend profiling;
    Model model(tiny_model_config(), ModelRuntime{kBatch, kSeqLen, &profiling}, LossWeights{});
    EXPECT_EQ(&model.backend(), &profiling);
    const Step step;
    const MicroBatchLosses got = run_step(model, step);

    // The ops a one-process step of the tiny model uses, its expert dispatcher's included (tensor
    // parallelism adds zero and the vocabulary-parallel ones).
    EXPECT_GT(profiling.memory_requests(), 0) << "the arenas come from the backend's memory";
    for (const char* op : {"init_normal",
                           "fill",
                           "rope_tables",
                           "embedding_forward",
                           "embedding_backward",
                           "rmsnorm_forward",
                           "rmsnorm_backward",
                           "linear_forward",
                           "linear_backward",
                           "matmul",
                           "rope_forward",
                           "rope_backward",
                           "mla_kv_forward",
                           "mla_kv_backward",
                           "attention_forward",
                           "attention_backward",
                           "swiglu_forward",
                           "swiglu_backward",
                           "grouped_linear_forward",
                           "grouped_linear_backward",
                           "router_forward",
                           "router_backward",
                           "count_expert_load",
                           "balance_loss_forward",
                           "balance_loss_backward",
                           "router_bias_update",
                           "shift_sequences",
                           "copy_rows_strided",
                           "cross_entropy_forward",
                           "cross_entropy_backward",
                           "add",
                           "add_inplace",
                           "copy_from_host"})
        EXPECT_GT(profiling.calls(op), 0) << op;

    // The wrapper changes nothing: the same numbers as a model on the default backend.
    Model reference(tiny_model_config(), ModelRuntime{kBatch, kSeqLen}, LossWeights{});
    EXPECT_EQ(&reference.backend(), &cpu_backend());
    const MicroBatchLosses want = run_step(reference, step);
    EXPECT_EQ(got.lm_loss, want.lm_loss);
    EXPECT_EQ(got.mtp_loss, want.mtp_loss);
    EXPECT_EQ(got.balance_loss, want.balance_loss);
    EXPECT_TRUE(same_floats(model.params(), reference.params(), model.num_params()));
    EXPECT_TRUE(same_floats(model.grads(), reference.grads(), model.num_params()));
    EXPECT_EQ(model.last_routing(), reference.last_routing());
}

// The loads a step counts live in the backend's memory; expert_load() reads them back, and the
// bias update consumes them.
TEST(ModelBackend, ExpertLoadsAreReadBackAndResetByTheBiasUpdate) {
    ProfilingBackend profiling;
    Model model(tiny_model_config(), ModelRuntime{kBatch, kSeqLen, &profiling}, LossWeights{});
    model.init_parameters(7);
    const Step step;
    model.forward_backward(step.tokens.data(), step.targets.data(), kBatch, kSeqLen, 1.0f);
    const ExpertLoadStats loads = model.expert_load();
    ASSERT_EQ(loads.tokens_per_expert.size(), 3u);  // layers 1-2 and the MTP block
    for (const std::vector<int64_t>& layer : loads.tokens_per_expert) {
        int64_t total = 0;
        for (int64_t x : layer) total += x;
        EXPECT_EQ(total, kBatch * kSeqLen * 2);  // N tokens x K experts each
    }
    EXPECT_GT(profiling.calls("copy_to_host"), 0);
    model.update_router_bias(0.001f);
    for (const std::vector<int64_t>& layer : model.expert_load().tokens_per_expert)
        EXPECT_EQ(layer, std::vector<int64_t>(8, 0));
}

std::string read_text(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// model/ reaches kernels only through a Backend: no CPU kernel header, no cpu:: call, no OpenMP
// loop of its own (those live in kernels/cpu/, one op per loop).
TEST(ModelBackend, ModelSourcesCallNoCpuKernelDirectly) {
    const std::filesystem::path dir =
        std::filesystem::path(MOETRON_SOURCE_DIR) / "src/moetron/model";
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::string text = read_text(entry.path());
        const std::string name = entry.path().filename().string();
        EXPECT_EQ(text.find("moetron/kernels/cpu/"), std::string::npos) << name;
        EXPECT_EQ(text.find("cpu::"), std::string::npos) << name;
        EXPECT_EQ(text.find("#pragma omp"), std::string::npos) << name;
        ++files;
    }
    EXPECT_GT(files, 10);
}

}  // namespace
}  // namespace moetron
