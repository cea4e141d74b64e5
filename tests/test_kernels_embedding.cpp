// kernels/cpu/embedding: lookup, scatter-add backward (accumulating, race-free under OpenMP)
// against float64 finite differences, and the out-of-vocabulary error.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/embedding.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;

TEST(Embedding, ForwardCopiesTableRows) {
    const int64_t V = 11, D = 7;
    const auto table = testing::random_floats(V * D, 1);
    const std::vector<int32_t> tokens = {3, 0, 10, 3, 5};
    std::vector<float> out(tokens.size() * D);
    cpu::embedding_forward(out.data(), tokens.data(), table.data(), 5, V, D);
    for (size_t t = 0; t < tokens.size(); ++t)
        for (int64_t d = 0; d < D; ++d) EXPECT_EQ(out[t * D + d], table[tokens[t] * D + d]);
}

TEST(Embedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
    // Token 2 appears three times: its row must receive the sum of three gradients.
    const int64_t V = 6, D = 5, N = 7;
    const std::vector<int32_t> tokens = {2, 4, 2, 0, 5, 2, 4};
    const auto table = testing::random_floats(V * D, 2);
    const auto dout = testing::random_floats(N * D, 3);

    std::vector<float> dtable(V * D, 0.0f);
    cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), N, V, D);

    auto loss = [&](const std::vector<double>& tab) {  // L = <dout, table[tokens]>
        double l = 0;
        for (int64_t t = 0; t < N; ++t)
            for (int64_t d = 0; d < D; ++d) l += dout[t * D + d] * tab[tokens[t] * D + d];
        return l;
    };
    const auto expected = testing::finite_difference_gradient(loss, testing::to_double(table));
    expect_close("embedding", "dtable", compare(dtable.data(), expected.data(), V * D), 1e-6);
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dtable[1 * D + d], 0.0f);  // token 1 unused

    // The gradient rule: a second micro-batch adds into the same buffer.
    std::vector<double> twice(V * D);
    for (int64_t i = 0; i < V * D; ++i) twice[i] = 2.0 * expected[i];
    cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), N, V, D);
    expect_close("embedding", "dtable after two micro-batches",
                 compare(dtable.data(), twice.data(), V * D), 1e-6);
}

TEST(Embedding, BackwardIsIdenticalForAnyThreadCount) {
    // Threads split the columns, so every element adds its tokens in position order: the result
    // is bitwise the serial one. D = 200 spans several column blocks, one of them partial.
    const int64_t V = 9, D = 200, N = 40;
    std::vector<int32_t> tokens(N);
    for (int64_t t = 0; t < N; ++t) tokens[t] = static_cast<int32_t>((t * 7) % 4);  // heavy repeats
    const auto dout = testing::random_floats(N * D, 4);

    std::vector<float> serial(V * D, 0.5f);
    for (int64_t t = 0; t < N; ++t)
        for (int64_t d = 0; d < D; ++d) serial[tokens[t] * D + d] += dout[t * D + d];

    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(3);
    std::vector<float> parallel(V * D, 0.5f);
    cpu::embedding_backward(parallel.data(), dout.data(), tokens.data(), N, V, D);
    omp_set_num_threads(saved_threads);
    EXPECT_EQ(parallel, serial);
}

// Vocabulary parts (two ranks' row blocks): the forward parts sum to the lookup, the backward
// parts are the plain gradient's rows.
TEST(Embedding, VocabularyPartsSumToTheLookupAndSplitTheGradient) {
    const int64_t V = 12, D = 5, N = 6, half = V / 2;
    const auto table = testing::random_floats(V * D, 7);
    const auto dout = testing::random_floats(N * D, 8);
    const std::vector<int32_t> tokens = {3, 11, 6, 3, 0, 5};
    std::vector<float> want(N * D), dtable(V * D, 0.0f);
    cpu::embedding_forward(want.data(), tokens.data(), table.data(), N, V, D);
    cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), N, V, D);

    std::vector<float> sum(N * D, 0.0f), part(N * D, 9.0f);  // garbage: must be overwritten
    for (int64_t first : {int64_t{0}, half}) {
        cpu::embedding_part_forward(part.data(), tokens.data(), table.data() + first * D, N, first,
                                    half, D);
        for (int64_t i = 0; i < N * D; ++i) sum[i] += part[i];
        std::vector<float> dpart(half * D, 0.0f);
        cpu::embedding_part_backward(dpart.data(), dout.data(), tokens.data(), N, first, half, D);
        EXPECT_EQ(dpart, std::vector<float>(dtable.begin() + first * D,
                                            dtable.begin() + (first + half) * D));
    }
    EXPECT_EQ(sum, want);
}

TEST(Embedding, TokenOutsideVocabularyIsAnErrorNamingIt) {
    const int64_t V = 4, D = 3;
    std::vector<float> table(V * D), out(2 * D);
    const std::vector<int32_t> tokens = {1, 4};
    try {
        cpu::embedding_forward(out.data(), tokens.data(), table.data(), 2, V, D);
        ADD_FAILURE() << "no error for token id 4 with vocab_size 4";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("token id 4"), std::string::npos) << msg;
        EXPECT_NE(msg.find("vocab_size = 4"), std::string::npos) << msg;
    }
    const std::vector<int32_t> negative = {-1, 0};
    EXPECT_THROW(cpu::embedding_backward(table.data(), out.data(), negative.data(), 2, V, D),
                 Error);
}

}  // namespace
}  // namespace moetron
