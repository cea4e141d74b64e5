// Low-precision dispatch under mpirun: the token rows travel to the experts as bfloat16, MXFP8
// (E4M3 + E8M0 per 32) or DeepSeek-V3's FP8 (E4M3 + float32 per 128), flat and two-tier (every
// split into emulated domains). The experts receive bit for bit each row as the format decodes it
// (the recipe's row-wise quantized copy, dispatch_reference.h), the combine and the backward go
// on from those rows as with float32, and the bytes counted for the dispatch, per tier, are the
// rows sent times parallel::payload_bytes_per_element (the cluster model's definition) times D.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "mpi/dispatch_reference.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

using parallel::Communicator;

constexpr Precision kLowPrecision[] = {Precision::bf16, Precision::mxfp8, Precision::fp8_blockwise};

// Whole blocks of both FP8 formats (32 and 128): the bytes per row are exactly
// payload_bytes_per_element * D.
DispatchCase payload_case(Precision payload) {
    DispatchCase c;
    c.name = "random/" + std::string(precision_name(payload));
    c.hidden = 256;
    c.tokens_per_rank = {13, 5, 9, 1};
    c.payload = payload;
    return c;
}

TEST(MpiDispatchPayload, FlatCarriesTheDecodedRowsInThePayloadsBytes) {
    Communicator& ep = mpi_world();
    for (const Precision payload : kLowPrecision) {
        const DispatchCase c = payload_case(payload);
        const parallel::DispatchConfig cfg = config_for(c);
        parallel::DispatchBuffer buffer(cfg, ep.size(), cpu_backend());
        parallel::DispatchLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
        const DispatchResult got = run_dispatch(c, ep, layout, buffer);
        expect_matches_reference(got, reference_result(c, ep.rank(), ep.size()),
                                 analytic_bytes(c, ep.rank(), ep.size(), false), c.name);
    }
}

TEST(MpiDispatchPayload, TwoTierCarriesTheDecodedRowsInThePayloadsBytesOnBothTiers) {
    Communicator& ep = mpi_world();
    if (ep.size() < 2) GTEST_SKIP() << "two tiers need two domains, so at least 2 ranks";
    for (int64_t L = 1; L < ep.size(); ++L) {
        if (ep.size() % L != 0) continue;
        const int r = ep.rank(), l = static_cast<int>(L);
        const std::unique_ptr<Communicator> rail = ep.split(r % l, r / l, "ep_rail");
        const std::unique_ptr<Communicator> domain = ep.split(r / l, r % l, "ep_domain");
        for (const Precision payload : kLowPrecision) {
            DispatchCase c = payload_case(payload);
            c.domain_size = L;
            c.name += "/domain_size_" + std::to_string(L);
            const parallel::DispatchConfig cfg = config_for(c);
            parallel::TwoTierBuffer buffer(cfg, ep.size(), cpu_backend());
            parallel::TwoTierLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
            const DispatchResult got =
                run_two_tier(c, ep.rank(), ep.size(), layout, buffer, {rail.get(), domain.get()});
            expect_matches_reference(got, reference_result(c, ep.rank(), ep.size()),
                                     analytic_bytes(c, ep.rank(), ep.size(), true), c.name);
        }
    }
}

// The saving against float32 is the formats' ratio, on each tier.
TEST(MpiDispatchPayload, Mxfp8SendsOneAndAThirtySecondBytePerElement) {
    Communicator& ep = mpi_world();
    if (ep.size() < 2) GTEST_SKIP() << "nothing crosses with one rank";
    DispatchCase mx = payload_case(Precision::mxfp8), fp32 = mx;
    fp32.payload = Precision::fp32;
    auto dispatch_bytes = [&](const DispatchCase& c) {
        const parallel::DispatchConfig cfg = config_for(c);
        parallel::DispatchBuffer buffer(cfg, ep.size(), cpu_backend());
        parallel::DispatchLayout layout(cfg, ep.size(), ep.rank(), cpu_backend());
        return run_dispatch(c, ep, layout, buffer).bytes[1];
    };
    const parallel::DispatchBytes got = dispatch_bytes(mx), full = dispatch_bytes(fp32);
    EXPECT_EQ(got.intra_domain * 4 * 32, full.intra_domain * 33);
    EXPECT_EQ(got.inter_domain * 4 * 32, full.inter_domain * 33);
    EXPECT_GT(full.intra_domain + full.inter_domain, 0u);
}

}  // namespace
}  // namespace moetron::testing
