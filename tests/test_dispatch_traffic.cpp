// parallel/dispatch_traffic: the rows a dispatch sends per tier, counted for a concrete routing,
// and the cluster model's expectation of the same count (sim/routing.h) over every routing.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/quantize.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "moetron/sim/routing.h"

namespace moetron::parallel {
namespace {

// 4 ranks in 2 domains of 2, 2 experts per rank: experts 0-1 on rank 0, ..., 6-7 on rank 3.
TEST(DispatchTraffic, CountsOneRowPerRankAndPerDomain) {
    // Rank 1 (domain 0, local index 1) dispatches two tokens of top-3:
    //   token 0: experts 0, 1 (rank 0 twice), 7 (rank 3: domain 1, local index 1)
    //   token 1: experts 2 (itself), 4, 5 (rank 2 twice: domain 1, local index 0)
    const std::vector<int32_t> ids = {0, 1, 7, 2, 4, 5};
    const DispatchFanout f = count_dispatch_fanout(ids, 3, 2, 2, 1);
    EXPECT_EQ(f.own_domain_ranks, 1);       // rank 0, once for two experts
    EXPECT_EQ(f.other_domain_ranks, 2);     // rank 3 and rank 2
    EXPECT_EQ(f.other_domains, 2);          // domain 1 for each token
    EXPECT_EQ(f.other_domain_landings, 1);  // rank 3 has rank 1's local index
    // Flat: a row to rank 0 (NVLink), rank 3 and rank 2 (NIC), not K = 6 copies.
    const TierRows flat = dispatch_rows(DispatchKind::flat, f);
    EXPECT_EQ(flat.intra_domain, 1);
    EXPECT_EQ(flat.inter_domain, 2);
    // Two-tier: one NIC row per token to domain 1; token 0 lands on rank 3 itself, token 1 on
    // rank 3 and goes on to rank 2 over NVLink; plus rank 0 in its own domain.
    const TierRows two_tier = dispatch_rows(DispatchKind::two_tier, f);
    EXPECT_EQ(two_tier.intra_domain, 2);
    EXPECT_EQ(two_tier.inter_domain, 2);
}

// The sim's expected fanout is the mean count over every routing of its model and every rank
// a token may live on: uniform top-2 of 8 experts on 4 ranks in 2 domains of 2.
TEST(DispatchTraffic, SimExpectationIsTheMeanOverAllRoutings) {
    const sim::RoutingShape shape{8, 1, 1, 2, 4, 2};
    DispatchFanout sum;
    double cases = 0;
    for (int32_t a = 0; a < 8; ++a) {
        for (int32_t b = a + 1; b < 8; ++b) {
            for (int64_t rank = 0; rank < 4; ++rank) {
                const std::vector<int32_t> ids = {a, b};
                const DispatchFanout f = count_dispatch_fanout(ids, 2, 2, 2, rank);
                sum.own_domain_ranks += f.own_domain_ranks;
                sum.other_domain_ranks += f.other_domain_ranks;
                sum.other_domains += f.other_domains;
                sum.other_domain_landings += f.other_domain_landings;
                cases += 1;
            }
        }
    }
    const DispatchFanout expected = sim::expected_dispatch_fanout(shape);
    EXPECT_NEAR(expected.own_domain_ranks, sum.own_domain_ranks / cases, 1e-12);
    EXPECT_NEAR(expected.other_domain_ranks, sum.other_domain_ranks / cases, 1e-12);
    EXPECT_NEAR(expected.other_domains, sum.other_domains / cases, 1e-12);
    EXPECT_NEAR(expected.other_domain_landings, sum.other_domain_landings / cases, 1e-12);
}

// The bytes per element the engine and the cluster model count are the sizes of what the
// quantizers write for one DeepSeek-V3 token row (7168 wide): elements plus scales.
TEST(DispatchTraffic, PayloadBytesAreTheQuantizersOutput) {
    const int64_t hidden = 7168;
    const double mxfp8_row = static_cast<double>(hidden) + static_cast<double>(cpu::blocks_covering(
                                                               hidden, cpu::kMxfp8BlockSize));
    const double fp8_row = static_cast<double>(hidden) +
                           static_cast<double>(cpu::blocks_covering(hidden, 128) * sizeof(float));
    EXPECT_DOUBLE_EQ(payload_bytes_per_element(Precision::mxfp8) * hidden, mxfp8_row);
    EXPECT_DOUBLE_EQ(payload_bytes_per_element(Precision::fp8_blockwise) * hidden, fp8_row);
    EXPECT_DOUBLE_EQ(payload_bytes_per_element(Precision::bf16), 2.0);
    EXPECT_DOUBLE_EQ(payload_bytes_per_element(Precision::fp32), 4.0);
    // NVFP4 has no payload in the engine (the cluster model prices its own).
    EXPECT_THROW(payload_bytes_per_element(Precision::nvfp4), UserError);
    EXPECT_THROW(payload_row_bytes(Precision::nvfp4, hidden), UserError);
}

// --dispatch-payload's words, the same for the engine and the cluster model.
TEST(DispatchTraffic, DispatchPayloadWords) {
    for (const DispatchPayload p : {DispatchPayload::activation, DispatchPayload::recipe})
        EXPECT_EQ(parse_dispatch_payload(dispatch_payload_name(p)), p);
    EXPECT_THROW(parse_dispatch_payload("fp32"), UserError);  // train's old word for activation
    EXPECT_THROW(parse_dispatch_payload("bf16"), UserError);
    EXPECT_EQ(engine_token_format(DispatchPayload::recipe, Precision::mxfp8), Precision::mxfp8);
    EXPECT_EQ(engine_token_format(DispatchPayload::activation, Precision::mxfp8), Precision::fp32);
}

}  // namespace
}  // namespace moetron::parallel
