// The cluster model's routing imbalance input (sim/expert_imbalance.h): histograms from a
// parametric skew or a --log-jsonl file, and tokens per rank with and without redundant experts.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/sim/expert_imbalance.h"
#include "temp_dir.h"

namespace moetron::sim {
namespace {

TEST(SimExpertImbalance, ZipfSkewLoadsTheFirstRankAndRedundantSlotsRelieveIt) {
    const std::vector<double> balanced = zipf_expert_loads(16, 0.0);
    const parallel::PlacementShape shape{16, 20, 4, 1, 1};  // R = 4: one spare slot per rank
    EXPECT_DOUBLE_EQ(expert_rank_imbalance(balanced, shape).contiguous, 1.0);
    const std::vector<double> skewed = zipf_expert_loads(16, 1.0);
    double mean = 0;
    for (double l : skewed) mean += l / 16;
    EXPECT_NEAR(mean, 1.0, 1e-12);
    const ExpertImbalance i = expert_rank_imbalance(skewed, shape);
    EXPECT_GT(i.contiguous, 2.0);  // experts 0-3 on rank 0
    EXPECT_LT(i.redundant, 1.2);
}

TEST(SimExpertImbalance, ReadsTheLastMeasuredHistogramOfATrainingLog) {
    testing::TempDir dir;
    const std::string path = (dir.path() / "run.jsonl").string();
    {
        std::ofstream out(path);
        out << "{\"step\":1,\"loss\":5}\n"
            << "{\"step\":10,\"average_expert_load\":[1,2,3,4]}\n"
            << "{\"step\":20,\"average_expert_load\":[4,3,2,1]}\n"
            << "{\"step\":21,\"loss\":4}\n";
    }
    EXPECT_EQ(expert_loads_from_jsonl(path), (std::vector<double>{4, 3, 2, 1}));
    const std::string empty = (dir.path() / "empty.jsonl").string();
    std::ofstream(empty) << "{\"step\":1}\n";
    EXPECT_THROW(expert_loads_from_jsonl(empty), UserError);
    EXPECT_THROW(expert_loads_from_jsonl((dir.path() / "none.jsonl").string()), UserError);
}

}  // namespace
}  // namespace moetron::sim
