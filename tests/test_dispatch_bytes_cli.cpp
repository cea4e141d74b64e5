// The cluster model's dispatch bytes per tier are the engine's: `moetron bench a2a` (4 ranks in 2
// emulated domains) measures the bytes its flat and two-tier dispatchers send for one concrete
// routing, and sim::moe_dispatch_cost, given that routing's fanout (counted by the same function
// as the bench, parallel/dispatch_traffic.h), predicts exactly those bytes per tier. Before the
// sim and the engine shared the formula, the sim charged a flat dispatch top-k copies per token
// (the engine sends one per destination rank) and a two-tier one an NVLink hop for the rank a
// row lands on. Skipped when mpirun is not on the PATH.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moetron/parallel/dispatch_traffic.h"
#include "moetron/sim/collectives.h"
#include "moetron/sim/hardware.h"
#include "mpi_job.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::mpirun_available;
using moetron::testing::read_file;
using moetron::testing::start_mpirun;
using moetron::testing::TempDir;

constexpr int kRanks = 4, kDomainSize = 2;
constexpr int64_t kTokensPerRank = 64, kHidden = 32;

// Runs the bench with `routing` ("uniform" or "router") and returns its JSON report.
nlohmann::json run_bench(const std::string& routing) {
    TempDir dir;
    const auto log = dir.path() / "bench.log";
    std::vector<std::string> args = {"-np",
                                     std::to_string(kRanks),
                                     MOETRON_BINARY,
                                     "bench",
                                     "a2a",
                                     "--json",
                                     "--domain-size",
                                     std::to_string(kDomainSize),
                                     "--experts",
                                     "16",
                                     "--top-k",
                                     "4",
                                     "--hidden",
                                     std::to_string(kHidden),
                                     "--tokens-per-rank",
                                     std::to_string(kTokensPerRank),
                                     "--iterations",
                                     "1",
                                     "--warmup",
                                     "0",
                                     "--routing",
                                     routing,
                                     "--topk-group",
                                     "2",
                                     "--n-group",
                                     "4"};
    const pid_t job = start_mpirun(log, args);
    int status = 0;
    EXPECT_EQ(::waitpid(job, &status, 0), job);
    const std::string out = read_file(log);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    const size_t begin = out.find('{'), end = out.rfind('}');
    if (begin == std::string::npos || end == std::string::npos) {
        ADD_FAILURE() << "no JSON report in:\n" << out;
        return {};
    }
    return nlohmann::json::parse(out.substr(begin, end - begin + 1));
}

void expect_sim_predicts_measured_bytes(const std::string& routing) {
    SCOPED_TRACE(routing);
    const nlohmann::json report = run_bench(routing);
    ASSERT_TRUE(report.contains("fanout")) << report.dump(2);
    // The job's fanout, summed over its tokens, as one token's mean.
    const double tokens = static_cast<double>(kRanks * kTokensPerRank);
    const nlohmann::json& f = report["fanout"];
    const parallel::DispatchFanout per_token{f["own_domain_ranks"].get<double>() / tokens,
                                             f["other_domain_ranks"].get<double>() / tokens,
                                             f["other_domains"].get<double>() / tokens,
                                             f["other_domain_landings"].get<double>() / tokens};
    const sim::ClusterSpec cluster =
        sim::load_cluster_spec(std::string(MOETRON_SOURCE_DIR) + "/configs/clusters/h100-hgx.toml");
    const sim::GroupPlacement ep_group{kRanks, kRanks / kDomainSize, kDomainSize};
    const double token_bytes = kHidden * sizeof(float);
    for (const auto& [name, kind] : {std::pair{"flat", parallel::DispatchKind::flat},
                                     std::pair{"two_tier", parallel::DispatchKind::two_tier}}) {
        SCOPED_TRACE(name);
        // One rank's mean bytes, for every rank, there (dispatch) and back (combine).
        const sim::CommCost c =
            sim::moe_dispatch_cost(cluster, ep_group, per_token, kind, tokens, token_bytes);
        const double measured_intra = report[name]["intra_domain_bytes"].get<double>();
        const double measured_inter = report[name]["inter_domain_bytes"].get<double>();
        EXPECT_GT(measured_inter, 0);
        EXPECT_NEAR(2 * c.scale_up_bytes, measured_intra, 1e-9 * measured_intra);
        EXPECT_NEAR(2 * c.scale_out_bytes, measured_inter, 1e-9 * measured_inter);
        EXPECT_EQ(report[name]["predicted_intra_domain_bytes"].get<double>(), measured_intra);
        EXPECT_EQ(report[name]["predicted_inter_domain_bytes"].get<double>(), measured_inter);
    }
}

TEST(DispatchBytes, SimPredictsTheBytesBenchA2aMeasuresForUniformRouting) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    expect_sim_predicts_measured_bytes("uniform");
}

TEST(DispatchBytes, SimPredictsTheBytesBenchA2aMeasuresForGroupLimitedRouting) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    expect_sim_predicts_measured_bytes("router");
}

}  // namespace
}  // namespace moetron
