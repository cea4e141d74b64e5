// CUDA kernels against the CPU reference kernels on the same inputs. Skipped where no GPU is
// present (and compiled only where the CUDA backend is built).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/kernels/cpu/rmsnorm.h"
#include "moetron/kernels/cpu/swiglu.h"
#include "moetron/kernels/cuda/device.h"
#include "testing.h"

#if MOETRON_HAVE_CUDA
#include "moetron/kernels/cuda/ops.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::random_floats;

// bf16 tolerance: a plain bf16 implementation carries relative error ~2^-8 per rounding; allow
// twice the error of rounding inputs and output once (the DESIGN's "2x a plain bf16" rule).
constexpr double kBf16RelTol = 4 * 0x1.0p-8;
constexpr double kF32RelTol = 1e-5;

class CudaKernels : public ::testing::Test {
  protected:
    void SetUp() override {
        if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    }
};

// A device buffer holding a copy of a host vector (or zeros).
template <class T>
struct DeviceBuffer {
    Arena arena;
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : n(count) {
        ArenaPlan plan("test", kDeviceAlignmentBytes);
        plan.add("x", {static_cast<int64_t>(count)}, dtype_of<T>());
        arena = Arena(plan, cuda::device_memory());
        ptr = static_cast<T*>(arena.base());
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
        cuda::copy_to_device(ptr, host.data(), host.size() * sizeof(T));
    }
    std::vector<T> to_host() const {
        std::vector<T> host(n);
        cuda::copy_to_host(host.data(), ptr, n * sizeof(T));
        return host;
    }
};

std::vector<bf16> to_bf16(const std::vector<float>& x) {
    std::vector<bf16> y(x.size());
    convert_f32_to_bf16(y.data(), x.data(), x.size());
    return y;
}
std::vector<float> to_f32(const std::vector<bf16>& x) {
    std::vector<float> y(x.size());
    convert_bf16_to_f32(y.data(), x.data(), x.size());
    return y;
}

TEST_F(CudaKernels, RmsnormMatchesCpuInF32AndBf16) {
    const int64_t rows = 37, dim = 1000;
    auto x = random_floats(rows * dim, 1), w = random_floats(dim, 2),
         dy = random_floats(rows * dim, 3);
    std::vector<float> out(rows * dim), rstd(rows), dx(rows * dim), dw(dim, 0.0f);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6f);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows,
                          dim);

    DeviceBuffer<float> gx(x), gw(w), gdy(dy), gout(rows * dim), grstd(rows), gdx(rows * dim),
        gdw(dim);
    cuda::rmsnorm_forward(gout.ptr, grstd.ptr, gx.ptr, gw.ptr, rows, dim, 1e-6f, nullptr);
    cuda::rmsnorm_backward(gdx.ptr, gdw.ptr, gdy.ptr, gx.ptr, gw.ptr, grstd.ptr, rows, dim,
                           nullptr);
    cuda::synchronize();
    expect_close("cuda_rmsnorm_f32", "out", compare(gout.to_host().data(), out.data(), out.size()),
                 kF32RelTol);
    expect_close("cuda_rmsnorm_f32", "dinp", compare(gdx.to_host().data(), dx.data(), dx.size()),
                 1e-4);
    expect_close("cuda_rmsnorm_f32", "dweight", compare(gdw.to_host().data(), dw.data(), dw.size()),
                 1e-4);

    DeviceBuffer<bf16> bx(to_bf16(x)), bw(to_bf16(w)), bout(rows * dim);
    cuda::rmsnorm_forward(bout.ptr, grstd.ptr, bx.ptr, bw.ptr, rows, dim, 1e-6f, nullptr);
    cuda::synchronize();
    expect_close("cuda_rmsnorm_bf16", "out",
                 compare(to_f32(bout.to_host()).data(), out.data(), out.size()), kBf16RelTol);
}

TEST_F(CudaKernels, SwigluMatchesCpu) {
    const int64_t rows = 19, ffn = 300;
    auto inp = random_floats(rows * 2 * ffn, 4), dy = random_floats(rows * ffn, 5);
    std::vector<float> out(rows * ffn), dinp(rows * 2 * ffn);
    cpu::swiglu_forward(out.data(), inp.data(), rows, ffn);
    cpu::swiglu_backward(dinp.data(), dy.data(), inp.data(), rows, ffn);
    DeviceBuffer<float> ginp(inp), gdy(dy), gout(rows * ffn), gdinp(rows * 2 * ffn);
    cuda::swiglu_forward(gout.ptr, ginp.ptr, rows, ffn, nullptr);
    cuda::swiglu_backward(gdinp.ptr, gdy.ptr, ginp.ptr, rows, ffn, nullptr);
    cuda::synchronize();
    expect_close("cuda_swiglu_f32", "out", compare(gout.to_host().data(), out.data(), out.size()),
                 1e-5);
    expect_close("cuda_swiglu_f32", "dinp",
                 compare(gdinp.to_host().data(), dinp.data(), dinp.size()), 1e-5);
}

TEST_F(CudaKernels, AdamwMatchesCpuAndWritesBf16Copy) {
    const int64_t n = 5000;
    auto p = random_floats(n, 6), g = random_floats(n, 7);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    DeviceBuffer<float> gp(p), gg(g), gm(m), gv(v);
    DeviceBuffer<bf16> gp16(n);
    for (int64_t step = 1; step <= 3; ++step) {
        cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n,
                          {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step});
        cuda::adamw_update(gp.ptr, gp16.ptr, gm.ptr, gv.ptr, gg.ptr, n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                           0.1f, step, nullptr);
    }
    cuda::synchronize();
    expect_close("cuda_adamw", "params", compare(gp.to_host().data(), p.data(), p.size()), 1e-5);
    expect_close("cuda_adamw", "params_bf16",
                 compare(to_f32(gp16.to_host()).data(), p.data(), p.size()), kBf16RelTol);
}

}  // namespace
}  // namespace moetron

#else

TEST(CudaKernels, NotBuilt) {
    GTEST_SKIP() << "moetron was built without CUDA (no nvcc found)";
}

#endif
