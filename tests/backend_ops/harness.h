// Running a registered OpCase (registry.h) on a Backend, comparing two runs, and checking a
// backward against central finite differences.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend_ops/registry.h"
#include "moetron/kernels/backend.h"

namespace moetron::backend_ops {

// The finite-difference check perturbs each element of each differentiated input twice; cases
// with more elements than this are checked for parity only (each op has a smaller case too).
inline constexpr int64_t kMaxFiniteDifferenceElements = 600;

// A tensor's values after a run, as doubles.
struct HostValues {
    DType dtype;
    std::vector<double> values;
};
// Every compared tensor (inout, output, grad, grad_sum, host_result) by name.
using Results = std::map<std::string, HostValues>;

// Generates the inputs, runs the forward and then the backward (if any) on `backend` and returns
// the compared tensors. Outputs and gradients start as NaN (integers as kUnwritten), so an
// element an op fails to write shows up. Throws what the op throws (OpNotImplemented).
Results run_case(const OpCase& op_case, Backend& backend);

// Problems (one line each; none when `actual` matches `expected`) for every compared tensor:
// integers must be equal, floats within the case's parity tolerance, and every value written
// and finite. Prints a "[maxerr]" line per float tensor.
std::vector<std::string> compare_results(const OpCase& op_case, const std::string& backend_name,
                                         const Results& actual, const Results& expected);

// How many input elements the finite-difference check perturbs (0: the case has no backward).
int64_t finite_difference_elements(const OpCase& op_case);

// Problems found checking the backward on `backend` against central differences of
// L = sum over weighted outputs of (output * its probe), with the loss and the differences in
// double (the forward itself computes in float32); five-point central stencil.
std::vector<std::string> check_finite_differences(const OpCase& op_case, Backend& backend);

}  // namespace moetron::backend_ops
