// main() of every MPI test executable: MPI_Init_thread through MpiSession, GoogleTest, and one
// exit status for the whole job. Rank 0 prints GoogleTest's usual output; every other rank prints
// only its failures, prefixed with its rank, so no failure goes unseen.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "mpi/mpi_test_main.h"

namespace moetron::testing {

namespace {

struct MpiTestContext {
    const parallel::MpiSession* session = nullptr;
    parallel::Communicator* world = nullptr;
};

// The one piece of process state of a test binary: set by main, read by the tests.
MpiTestContext& context() {
    static MpiTestContext ctx;
    return ctx;
}

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
  public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult& result) override {
        if (!result.failed()) return;
        if (result.file_name() != nullptr)
            std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name(),
                         result.line_number(), result.summary());
        else
            std::fprintf(stderr, "[rank %d] Failure\n%s\n", rank_, result.summary());
        std::fflush(stderr);
    }

  private:
    int rank_;
};

}  // namespace

parallel::Communicator& mpi_world() {
    return *context().world;
}
const parallel::MpiSession& mpi_session() {
    return *context().session;
}

}  // namespace moetron::testing

int main(int argc, char** argv) {
    namespace mt = moetron::testing;
    namespace parallel = moetron::parallel;
    using moetron::DType;
    std::unique_ptr<parallel::MpiSession> session_owner;
    try {
        session_owner = std::make_unique<parallel::MpiSession>(&argc, &argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron MPI test: %s\n", e.what());
        return 2;
    }
    const parallel::MpiSession& session = *session_owner;
    // An error outside a test (a collective of main timing out) ends the whole job at once, with
    // MPI still initialized so that MPI_Abort reaches every rank.
    try {
        ::testing::InitGoogleTest(&argc, argv);
        parallel::CommunicatorOptions options;
        options.timeout_s = mt::kMpiTestTimeoutS;
        auto world = parallel::make_mpi_world(session, options);
        mt::context().session = &session;
        mt::context().world = world.get();

        if (world->rank() != 0) {
            auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
            delete listeners.Release(listeners.default_result_printer());
            listeners.Append(new mt::RankFailurePrinter(world->rank()));
        }
        const int status = RUN_ALL_TESTS();

        // The job passes only if every rank passed.
        double failed_ranks = status != 0 ? 1.0 : 0.0;
        world->all_reduce_sum(&failed_ranks, 1, DType::f64, moetron::kHostStream);
        if (world->rank() == 0 && failed_ranks > 0)
            std::fprintf(stderr, "%d of %d ranks failed\n", static_cast<int>(failed_ranks),
                         world->size());
        mt::context() = {};
        world.reset();
        return failed_ranks > 0 ? 1 : 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron MPI test: %s\n", e.what());
        parallel::MpiSession::abort_job(2);
    }
}
