// The op-parity harness: every registered case (backend_ops/cases*.cpp) on every backend against
// the CPU reference, the CPU backward against finite differences, and the registry against the op
// list, kernels/backend_ops.inc (every op has a case, every backward a finite-difference check). A
// case a backend cannot run is skipped with the reason: no CUDA device, or no kernel for the op
// yet.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend_ops/harness.h"
#include "backend_ops/registry.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/backend_ops.h"
#include "moetron/kernels/cuda/cuda_backend.h"
#include "moetron/kernels/cuda/device.h"

namespace moetron::backend_ops {
namespace {

const std::vector<std::string> kBackendNames = {"cpu", "cuda"};

// The backend of that name, or null with the reason it is not available here.
Backend* available_backend(const std::string& name, std::string& reason) {
    if (name == "cpu") return &cpu_backend();
#if MOETRON_HAVE_CUDA
    if (cuda::device_count() == 0) {
        reason = "no CUDA device";
        return nullptr;
    }
    static const std::unique_ptr<Backend> cuda_backend = make_cuda_backend(0);
    return cuda_backend.get();
#else
    reason = "no CUDA device (moetron was built without CUDA)";
    return nullptr;
#endif
}

// "rmsnorm N=7 D=13" -> "rmsnorm_N7_D13": a gtest name.
std::string test_name(const std::string& text) {
    std::string name;
    for (char c : text) {
        if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
            name += c;
        } else if (c == ' ' && !name.empty() && name.back() != '_') {
            name += '_';
        } else if (c == '.') {
            name += 'p';
        }
    }
    return name;
}

std::vector<size_t> all_case_indices() {
    std::vector<size_t> indices(op_cases().size());
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = i;
    return indices;
}

std::vector<size_t> finite_difference_case_indices() {
    std::vector<size_t> indices;
    for (size_t i = 0; i < op_cases().size(); ++i) {
        const int64_t elements = finite_difference_elements(op_cases()[i]);
        if (elements > 0 && elements <= kMaxFiniteDifferenceElements) indices.push_back(i);
    }
    return indices;
}

// ---- every case on every backend against the CPU ----

class OpParity : public ::testing::TestWithParam<std::tuple<std::string, size_t>> {};

TEST_P(OpParity, MatchesCpuReference) {
    const auto& [backend_name, index] = GetParam();
    const OpCase& op_case = op_cases()[index];
    std::string reason;
    Backend* backend = available_backend(backend_name, reason);
    if (backend == nullptr) GTEST_SKIP() << "skipped: " << reason;

    const Results expected = run_case(op_case, cpu_backend());
    Results actual;
    try {
        actual = run_case(op_case, *backend);
    } catch (const OpNotImplemented& e) {
        GTEST_SKIP() << "skipped: op not implemented on " << backend_name << " (" << e.what()
                     << ")";
    }
    for (const std::string& problem : compare_results(op_case, backend_name, actual, expected))
        ADD_FAILURE() << problem;
}

INSTANTIATE_TEST_SUITE_P(Cases, OpParity,
                         ::testing::Combine(::testing::ValuesIn(kBackendNames),
                                            ::testing::ValuesIn(all_case_indices())),
                         [](const auto& info) {
                             return std::get<0>(info.param) + "_" +
                                    test_name(op_cases()[std::get<1>(info.param)].name());
                         });

// ---- the CPU backward against finite differences ----

class OpGradients : public ::testing::TestWithParam<size_t> {};

TEST_P(OpGradients, CpuBackwardMatchesFiniteDifferences) {
    for (const std::string& problem :
         check_finite_differences(op_cases()[GetParam()], cpu_backend()))
        ADD_FAILURE() << problem;
}

INSTANTIATE_TEST_SUITE_P(Cases, OpGradients, ::testing::ValuesIn(finite_difference_case_indices()),
                         [](const auto& info) { return test_name(op_cases()[info.param].name()); });

// ---- the registry against the op list (kernels/backend_ops.inc) ----

// The ops the harness runs every case with (it moves the tensors in and out, and waits), which
// therefore have no case of their own.
const std::set<std::string> kHarnessOps = {"synchronize", "copy_to_host", "copy_from_host"};

TEST(BackendOpsRegistry, EveryBackendOpHasACase) {
    std::set<std::string> registered;
    for (const OpCase& op_case : op_cases()) {
        registered.insert(op_case.forward_op());
        if (op_case.has_backward()) registered.insert(op_case.backward_op());
    }
    for (const BackendOpInfo& op : backend_op_list()) {
        const std::string name(op.name);
        if (kHarnessOps.count(name)) continue;
        EXPECT_TRUE(registered.count(name))
            << "Backend::" << name << " has no case in tests/backend_ops/cases*.cpp "
            << "(kernels/README.md: registering an op)";
    }
    for (const std::string& name : registered)
        EXPECT_NO_THROW(backend_op_named(name)) << "a case runs " << name << ", which is no op";
}

// Every GEMM has a case in every low-precision format.
TEST(BackendOpsRegistry, EveryGemmHasACaseInEveryRecipeFormat) {
    for (const BackendOpInfo& op : backend_op_list()) {
        if (!op.gemm || op.name == "matmul") continue;  // matmul: the linears' own GEMM
        for (const Precision format :
             {Precision::bf16, Precision::mxfp8, Precision::fp8_blockwise}) {
            bool found = false;
            for (const OpCase& op_case : op_cases()) {
                const bool runs = op_case.forward_op() == op.name ||
                                  (op_case.has_backward() && op_case.backward_op() == op.name);
                found =
                    found || (runs && op_case.name().find(std::string(precision_name(format))) !=
                                          std::string::npos);
            }
            EXPECT_TRUE(found) << op.name << " has no case in " << precision_name(format);
        }
    }
}

TEST(BackendOpsRegistry, EveryBackwardIsCheckedByFiniteDifferences) {
    std::set<std::string> backwards, checked;
    for (size_t i = 0; i < op_cases().size(); ++i) {
        if (op_cases()[i].has_backward()) backwards.insert(op_cases()[i].backward_op());
    }
    for (size_t i : finite_difference_case_indices()) checked.insert(op_cases()[i].backward_op());
    for (const std::string& op : backwards) {
        EXPECT_TRUE(checked.count(op)) << op << " has no case small enough for finite differences ("
                                       << kMaxFiniteDifferenceElements << " input elements)";
    }
}

TEST(BackendOpsRegistry, CasesAreWellFormed) {
    std::set<std::string> names;
    for (const OpCase& op_case : op_cases()) {
        EXPECT_TRUE(names.insert(test_name(op_case.name())).second)
            << "two cases named " << op_case.name();
        EXPECT_TRUE(op_case.forward_call()) << op_case.name() << " has no forward";
        for (const TensorSpec& spec : op_case.tensors()) {
            if (!spec.probe_name.empty()) {
                const TensorSpec& p = op_case.tensor(spec.probe_name);
                EXPECT_EQ(p.role, Role::probe) << op_case.name() << ": " << spec.name;
                EXPECT_EQ(p.count, spec.count) << op_case.name() << ": " << spec.name;
            }
            if (!spec.input_name.empty()) {
                const TensorSpec& x = op_case.tensor(spec.input_name);
                EXPECT_EQ(x.role, Role::input) << op_case.name() << ": " << spec.name;
                EXPECT_EQ(x.count, spec.count) << op_case.name() << ": " << spec.name;
            }
        }
    }
}

}  // namespace
}  // namespace moetron::backend_ops
