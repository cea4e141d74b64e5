// Tensor parallelism's pieces over the world as one TP group (model/vocab_parallel.h,
// parallel/tensor_parallel.h): the vocabulary-parallel cross-entropy and embedding against the
// plain kernels on the whole vocabulary, the sequence-parallel gather and reduce-scatter of rows,
// the f sum and the row shares. Runs under mpirun
// -np 1, 2 and 4 (one rank: the plain kernels themselves).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/cross_entropy.h"
#include "moetron/kernels/cpu/embedding.h"
#include "moetron/model/model.h"
#include "moetron/model/vocab_parallel.h"
#include "moetron/parallel/tensor_parallel.h"
#include "moetron/train/preset_path.h"
#include "mpi/mpi_test_main.h"
#include "testing.h"

namespace moetron::testing {
namespace {

constexpr int32_t kIgnore = -1;

// The same numbers on every rank.
std::vector<float> shared_random(int64_t n, uint64_t seed, float scale) {
    const ParamRng rng(seed, "test");
    std::vector<float> out(static_cast<size_t>(n));
    rng.fill_normal(out.data(), static_cast<uint64_t>(n), scale);
    return out;
}

TEST(MpiTensorParallel, VocabParallelCrossEntropyMatchesThePlainKernel) {
    const parallel::TensorParallel tp(&mpi_world(), cpu_backend());
    const int64_t N = 10, V = 48, Vp = V / tp.size();
    std::vector<float> logits = shared_random(N * V, 1, 2.0f);
    for (int64_t v = 0; v < V; ++v) logits[3 * V + v] += 300.0f;  // needs the global max
    std::vector<int32_t> targets(N);
    for (int64_t t = 0; t < N; ++t) targets[t] = static_cast<int32_t>((t * 7 + 5) % V);
    targets[4] = kIgnore;
    const float dloss = 0.1f;

    std::vector<float> losses(N), lse(N), dlogits(N * V);
    const cpu::CrossEntropyResult want = cpu::cross_entropy_forward(
        losses.data(), lse.data(), logits.data(), targets.data(), N, V, kIgnore);
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V,
                                kIgnore, dloss);

    // This rank's columns, as the column-parallel head gives them.
    const int64_t first = tp.rank() * Vp;
    std::vector<float> part(N * Vp);
    for (int64_t t = 0; t < N; ++t)
        for (int64_t v = 0; v < Vp; ++v) part[t * Vp + v] = logits[t * V + first + v];
    std::vector<float> row_max(N), part_max(tp.size() * N);
    std::vector<double> sums(2 * N);
    const VocabParallelScratch scratch{row_max.data(), part_max.data(), sums.data()};
    std::vector<float> got_losses(N), got_lse(N);
    const cpu::CrossEntropyResult got = vocab_parallel_cross_entropy_forward(
        cpu_backend(), got_losses.data(), got_lse.data(), part.data(), targets.data(), scratch, N,
        V, kIgnore, tp);
    EXPECT_EQ(got.num_valid, want.num_valid);
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
    for (int64_t t = 0; t < N; ++t) {
        EXPECT_NEAR(got_lse[t], lse[t], 1e-5 * std::fabs(lse[t])) << t;
        EXPECT_NEAR(got_losses[t], losses[t], 1e-4) << t;
    }
    vocab_parallel_cross_entropy_backward(cpu_backend(), part.data(), part.data(), got_lse.data(),
                                          targets.data(), N, V, kIgnore, dloss, tp);
    for (int64_t t = 0; t < N; ++t)
        for (int64_t v = 0; v < Vp; ++v)
            EXPECT_NEAR(part[t * Vp + v], dlogits[t * V + first + v], 1e-6)
                << "token " << t << " column " << first + v;
}

// The lookup comes out as this rank's token rows (sequence parallelism); the backward takes every
// rank's rows of the output gradient.
TEST(MpiTensorParallel, VocabParallelEmbeddingMatchesThePlainKernel) {
    const parallel::TensorParallel tp(&mpi_world(), cpu_backend());
    const int64_t N = 8, V = 16, D = 6, Vp = V / tp.size(), rows = N / tp.size();
    const std::vector<float> table = shared_random(V * D, 2, 1.0f);
    const std::vector<float> dout = shared_random(N * D, 3, 1.0f);
    const std::vector<int32_t> tokens = {0, 15, 7, 8, 3, 12, 7, 15};
    std::vector<float> want(N * D), dtable(V * D, 0.0f);
    cpu::embedding_forward(want.data(), tokens.data(), table.data(), N, V, D);
    cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), N, V, D);

    const int64_t first = tp.rank() * Vp, first_row = tp.rank() * rows;
    std::vector<float> got(rows * D), full(N * D);
    vocab_parallel_embedding_forward(cpu_backend(), got.data(), tokens.data(),
                                     table.data() + first * D, full.data(), N, V, D, tp);
    // One nonzero part per element: the sum is exact.
    EXPECT_EQ(got, std::vector<float>(want.begin() + first_row * D,
                                      want.begin() + (first_row + rows) * D));
    std::vector<float> dpart(Vp * D, 0.0f);
    vocab_parallel_embedding_backward(cpu_backend(), dpart.data(), dout.data() + first_row * D,
                                      tokens.data(), full.data(), N, V, D, tp);
    EXPECT_EQ(dpart,
              std::vector<float>(dtable.begin() + first * D, dtable.begin() + (first + Vp) * D));
}

// Sequence parallelism's pair: the gather of every rank's rows, the reduce-scatter of sums.
TEST(MpiTensorParallel, GatherAndReduceScatterRows) {
    const parallel::TensorParallel tp(&mpi_world(), cpu_backend());
    const int n = tp.size();
    const std::vector<float> mine = {static_cast<float>(tp.rank()), 1.0f};
    std::vector<float> full(2 * n, -1.0f);
    const float* gathered = tp.gather_rows(full.data(), mine.data(), 2);
    for (int r = 0; r < n; ++r) {
        EXPECT_EQ(gathered[2 * r], static_cast<float>(r));
        EXPECT_EQ(gathered[2 * r + 1], 1.0f);
    }
    std::vector<float> partial(2 * n);
    for (int i = 0; i < 2 * n; ++i) partial[i] = static_cast<float>(i);
    std::vector<float> rows(2);
    tp.reduce_scatter_rows(rows.data(), partial.data(), 2);
    EXPECT_EQ(rows[0], static_cast<float>(n * 2 * tp.rank()));
    EXPECT_EQ(rows[1], static_cast<float>(n * (2 * tp.rank() + 1)));
}

TEST(MpiTensorParallel, SumsAndRowSharesCoverTheGroup) {
    const parallel::TensorParallel tp(&mpi_world(), cpu_backend());
    std::vector<float> x = {1.0f, static_cast<float>(tp.rank())};
    tp.sum_partial_input_grads(x.data(), 2);
    const int n = tp.size();
    EXPECT_EQ(x, (std::vector<float>{static_cast<float>(n), static_cast<float>(n * (n - 1) / 2)}));
    const parallel::RowRange rows = tp.row_share(8 * n, "rows");
    EXPECT_EQ(rows.first, 8 * tp.rank());
    EXPECT_EQ(rows.count, 8);
    if (n > 1) {
        try {
            (void)tp.row_share(8 * n + 1, "tokens of the test");
            ADD_FAILURE() << "no error for rows that do not split";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("tokens of the test"), std::string::npos)
                << e.what();
        }
    }
    // Without a group every operator is the identity.
    const parallel::TensorParallel none;
    EXPECT_FALSE(none.enabled());
    std::vector<float> y = {2.0f};
    none.sum_partial_input_grads(y.data(), 1);
    EXPECT_EQ(y[0], 2.0f);
}

// What the model needs of tp, named with the numbers before any work.
TEST(MpiTensorParallel, ModelNamesWhatTpMustDivide) {
    parallel::Communicator& world = mpi_world();
    if (world.size() == 1) GTEST_SKIP() << "one rank divides everything";
    const ModelConfig c = load_model_config(find_preset("tiny"));
    ModelParallel mp;
    mp.tp = &world;
    mp.load = &world;
    auto expect_error = [&](const ModelConfig& config, ModelRuntime runtime, const char* what) {
        try {
            Model model(config, runtime, {}, mp);
            ADD_FAILURE() << "no error; expected one containing: " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect_error(c, {1, 8 * world.size() + 1}, "tokens of a micro-batch");
    // What the layout cannot split is the user's mistake, said by the one check of a layout
    // against the model (layout_fit.h) whether or not a Topology was checked before.
    auto expect_user_error = [&](const ModelConfig& config, const char* what) {
        try {
            Model model(config, {1, 8}, {}, mp);
            ADD_FAILURE() << "no error; expected one containing: " << what;
        } catch (const UserError& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        } catch (const Error& e) {
            ADD_FAILURE() << "an internal error where a user error was expected: " << e.what();
        }
    };
    const std::string tp = "[layout] tp " + std::to_string(world.size()) + " does not divide ";
    ModelConfig odd_vocab = c;
    odd_vocab.vocab_size = 8 * world.size() + 1;
    expect_user_error(odd_vocab, (tp + "vocab_size").c_str());
    ModelConfig odd_mlp = c;
    odd_mlp.intermediate_size = 8 * world.size() + 1;
    expect_user_error(odd_mlp, (tp + "intermediate_size").c_str());
    ModelConfig odd_heads = c;
    odd_heads.num_attention_heads = world.size() + 1;
    expect_user_error(odd_heads, (tp + "the " + std::to_string(world.size() + 1)).c_str());
    ModelParallel no_load = mp;
    no_load.load = nullptr;
    try {
        Model model(c, {1, 8}, {}, no_load);
        ADD_FAILURE() << "no error without a load group";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("ModelParallel::load"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace moetron::testing
