// ProfilingBackend (kernels/profiling_backend.h): it knows every op of Backend, once, with a
// category; it counts and times what it forwards; and a training step through it computes exactly
// what one without it does, the optimizer's ops included.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moetron/kernels/profiling_backend.h"
#include "moetron/model/config.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"

namespace moetron {
namespace {

// Every "virtual <type> <name>(" of kernels/backend.h, read from the source, so that an op added
// to Backend without a category fails here.
std::vector<std::string> backend_members_declared() {
    const std::string path = std::string(MOETRON_SOURCE_DIR) + "/src/moetron/kernels/backend.h";
    std::ifstream file(path);
    EXPECT_TRUE(file) << "cannot read " << path;
    std::vector<std::string> members;
    for (std::string line; std::getline(file, line);) {
        const size_t virtual_at = line.find("virtual ");
        const size_t paren = line.find('(');
        if (virtual_at == std::string::npos || paren == std::string::npos) continue;
        size_t begin = paren;
        while (begin > 0 && (std::isalnum(static_cast<unsigned char>(line[begin - 1])) ||
                             line[begin - 1] == '_'))
            --begin;
        if (begin == 0 || line[begin - 1] == '~') continue;  // the destructor
        members.push_back(line.substr(begin, paren - begin));
    }
    return members;
}

TEST(ProfilingBackend, EveryBackendOpHasExactlyOneCategory) {
    const std::set<std::string> identity = {"name", "device", "describe", "stream"};
    std::map<std::string, int> listed;
    for (const ProfiledOp& op : profiled_ops()) listed[std::string(op.name)] += 1;
    const std::vector<std::string> declared = backend_members_declared();
    EXPECT_GE(declared.size(), 60u) << "kernels/backend.h no longer parses as expected";
    std::set<std::string> ops;
    for (const std::string& member : declared) {
        if (identity.count(member)) continue;
        ops.insert(member);
        EXPECT_EQ(listed[member], 1)
            << "Backend::" << member
            << " is not in kProfiledOps exactly once (kernels/profiling_backend.cpp)";
    }
    for (const auto& [name, times] : listed) {
        EXPECT_TRUE(ops.count(name)) << name << " is in kProfiledOps but not in Backend";
    }
}

TEST(ProfilingBackend, CountsAndTimesEachOpUnderItsCategory) {
    ProfilingBackend profiling;
    std::vector<float> a(64, 1.0f), b(64, 2.0f), c(64, 0.0f);
    for (int i = 0; i < 3; ++i)
        profiling.matmul(c.data(), a.data(), b.data(), 8, 8, 8, false, false, 0.0f);
    profiling.add(c.data(), a.data(), b.data(), 64);
    EXPECT_EQ(profiling.calls("matmul"), 3);
    EXPECT_EQ(profiling.calls("add"), 1);
    EXPECT_EQ(profiling.calls("attention_forward"), 0);
    EXPECT_FLOAT_EQ(c[5], 3.0f);  // forwarded: 1 + 2
    EXPECT_THROW((void)profiling.calls("no_such_op"), std::invalid_argument);

    const std::string table = format_op_profile(profiling, /*steps=*/1, /*step_seconds=*/1.0);
    const size_t gemms = table.find("GEMMs");
    const size_t matmul = table.find("  matmul");
    const size_t other = table.find("other");
    const size_t add = table.find("  add");
    ASSERT_NE(gemms, std::string::npos) << table;
    ASSERT_NE(other, std::string::npos) << table;
    EXPECT_GT(matmul, gemms) << table;  // listed under its category
    EXPECT_GT(add, other) << table;
    EXPECT_EQ(table.find("attention"), std::string::npos) << "a category never called is left out";

    profiling.reset();
    EXPECT_EQ(profiling.calls("matmul"), 0);
}

// The trainer routes its model and its optimizer through the backend it is given, and the
// decorator changes no number.
TEST(ProfilingBackend, ATrainingStepThroughItIsBitIdentical) {
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TrainConfig config;
    config.batch_size = 2;
    config.seq_len = 16;
    config.steps = 4;
    config.warmup_steps = 0;
    config.seed = 3;
    config.eval_batches = 1;
    const auto make_loader = [&] {
        TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/20000);
        return DataLoader(std::move(data.tokens), data.source, model.vocab_size, config.seq_len,
                          config.val_fraction, config.seed);
    };
    ProfilingBackend profiling;
    Trainer profiled(model, config, make_loader(), TrainParallel{}, profiling);
    Trainer plain(model, config, make_loader());
    for (int step = 0; step < 2; ++step) {
        const StepRecord got = profiled.step();
        const StepRecord want = plain.step();
        EXPECT_EQ(got.loss, want.loss) << "step " << step;
        EXPECT_EQ(got.mtp_loss, want.mtp_loss) << "step " << step;
        EXPECT_EQ(got.balance_loss, want.balance_loss) << "step " << step;
        EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << step;
    }
    EXPECT_GT(profiling.calls("attention_forward"), 0);
    EXPECT_GT(profiling.calls("grouped_linear_backward"), 0);
    EXPECT_GT(profiling.calls("adamw_update"), 0);  // the optimizer's math, too
    EXPECT_GT(profiling.calls("sum_squares"), 0);
}

}  // namespace
}  // namespace moetron
