// The CUDA backend as an object (kernels/cuda/cuda_backend.h): what make_cuda_backend says where
// there is no GPU, and on a GPU its memory, its stream and the grouped GEMM's offsets in either
// memory. The ops' numbers are test_backend_ops's (the op-parity harness).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "expect_contains.h"
#include "moetron/core/arena.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cuda/cuda_backend.h"
#include "moetron/kernels/cuda/device.h"

namespace moetron {
namespace {

std::string message_of_make_cuda_backend(int device) {
    try {
        make_cuda_backend(device);
    } catch (const UserError& e) {
        return e.what();
    }
    return "(no UserError)";
}

TEST(CudaBackend, AMissingDeviceIsAUserError) {
    const int count = cuda::device_count();
#if MOETRON_HAVE_CUDA
    EXPECT_CONTAINS(message_of_make_cuda_backend(count),
                    "there is no CUDA device " + std::to_string(count));
    EXPECT_CONTAINS(message_of_make_cuda_backend(-1), "there is no CUDA device -1");
#else
    EXPECT_EQ(count, 0);
    EXPECT_CONTAINS(message_of_make_cuda_backend(0), "built without CUDA");
#endif
}

class CudaBackendOnDevice : public ::testing::Test {
  protected:
    void SetUp() override {
        if (cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
        backend = make_cuda_backend(0);
    }
    std::unique_ptr<Backend> backend;
};

TEST_F(CudaBackendOnDevice, OwnsDeviceMemoryAndAStream) {
    EXPECT_EQ(backend->name(), "cuda");
    EXPECT_EQ(backend->device(), Device::cuda);
    EXPECT_EQ(backend->memory().device(), Device::cuda);
    EXPECT_EQ(backend->stream().device, Device::cuda);
    EXPECT_NE(backend->stream().native_handle, nullptr);  // its own, not the legacy stream
    EXPECT_NE(make_cuda_backend(0)->stream().native_handle, backend->stream().native_handle);
}

TEST_F(CudaBackendOnDevice, OpsRunInIssueOrderOnItsStream) {
    // x = 1; y = x + x; y *= 3; x = 0: the host sees y = 6 only if every op ran in order.
    const int64_t n = 1 << 20;
    ArenaPlan plan("order", kDeviceAlignmentBytes);
    plan.add("x", {n});
    plan.add("y", {n});
    Arena arena(plan, backend->memory());
    float* x = arena.view("x").f32();
    float* y = arena.view("y").f32();
    const std::vector<float> ones(n, 1.0f);
    backend->copy_from_host(x, ones.data(), n * sizeof(float));
    backend->add(y, x, x, n);
    backend->scale_inplace(y, n, 3.0f);
    backend->zero(x, n * sizeof(float));
    std::vector<float> host(n);
    backend->copy_to_host(host.data(), y, n * sizeof(float));
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(host[i], 6.0f) << i;
    EXPECT_EQ(backend->sum_squares(y, n), 36.0 * static_cast<double>(n));
}

TEST_F(CudaBackendOnDevice, GroupedLinearTakesOffsetsInDeviceOrHostMemory) {
    const int64_t experts = 3, rows = 5, in = 4, out = 2;
    const std::vector<int64_t> offsets = {0, 2, 2, 5};
    ArenaPlan plan("grouped", kDeviceAlignmentBytes);
    plan.add("inp", {rows * in});
    plan.add("weight", {experts * out * in});
    plan.add("offsets", {experts + 1}, DType::i64);
    plan.add("out", {rows * out});
    Arena arena(plan, backend->memory());
    std::vector<float> inp(rows * in), weight(experts * out * in);
    for (size_t i = 0; i < inp.size(); ++i) inp[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.125f * static_cast<float>(i % 5);
    backend->copy_from_host(arena.view("inp").data, inp.data(), inp.size() * sizeof(float));
    backend->copy_from_host(arena.view("weight").data, weight.data(),
                            weight.size() * sizeof(float));
    backend->copy_from_host(arena.view("offsets").data, offsets.data(),
                            offsets.size() * sizeof(int64_t));

    std::vector<float> from_device(rows * out), from_host(rows * out);
    backend->grouped_linear_forward(
        arena.view("out").f32(), arena.view("inp").f32(), arena.view("weight").f32(),
        arena.view("offsets").ptr<int64_t>(), experts, in, out, kFp32Gemm);
    backend->copy_to_host(from_device.data(), arena.view("out").data, rows * out * sizeof(float));
    backend->zero(arena.view("out").data, rows * out * sizeof(float));
    backend->grouped_linear_forward(arena.view("out").f32(), arena.view("inp").f32(),
                                    arena.view("weight").f32(), offsets.data(), experts, in, out,
                                    kFp32Gemm);
    backend->copy_to_host(from_host.data(), arena.view("out").data, rows * out * sizeof(float));
    EXPECT_EQ(from_device, from_host);

    // Row 4 belongs to expert 2: out[4, o] = inp[4] . weight[2, o].
    for (int64_t o = 0; o < out; ++o) {
        float expected = 0;
        for (int64_t i = 0; i < in; ++i)
            expected += inp[4 * in + i] * weight[(2 * out + o) * in + i];
        EXPECT_FLOAT_EQ(from_host[4 * out + o], expected) << o;
    }
}

}  // namespace
}  // namespace moetron
