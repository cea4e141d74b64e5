// The op-parity registry (in the spirit of ggml's test-backend-ops): every Backend op is
// registered once, in cases.cpp, as a few OpCases -- its tensors (how each input is generated,
// which outputs are compared), the calls that run its forward and backward on any Backend, and
// its tolerances. test_backend_ops.cpp runs every case on every available backend against the
// CPU reference, and checks the CPU backward against finite differences. kernels/README.md says
// how to register an op.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "moetron/core/dtype.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/backend.h"

namespace moetron::backend_ops {

// Writes a tensor's initial host values (any dtype is held as double here), drawn from `rng`
// by element index so that every backend and every run sees the same inputs.
using Fill = std::function<void(std::span<double> values, const ParamRng& rng)>;

Fill normal(double scale = 1.0);  // scale * N(0, 1)
Fill uniform(double low, double high);
Fill constant(double value);
Fill values(std::vector<double> list);  // exactly these (the count must match)
// Integers uniform in [0, bound); with ignore_every > 0, every ignore_every-th is `ignore`.
Fill ids_below(int64_t bound, int64_t ignore_every = 0, double ignore = -100);
// Rows of row_length distinct integers in [0, bound) (the experts a router picks per token).
Fill distinct_ids_per_row(int64_t row_length, int64_t bound);
Fill permutation();  // a random permutation of [0, count)
// Rows of row_length values spacing apart, centred on 0, in a random order per row: inputs whose
// order a small perturbation cannot change (the router's choices).
Fill levels_per_row(int64_t row_length, double spacing);

enum class Role {
    input,        // generated; read by the forward or backward
    inout,        // generated; updated in place by the forward, compared after it
    output,       // written by the forward; compared
    probe,        // generated: an upstream gradient the backward reads (a "dout")
    grad,         // written by the backward; compared, and checked against finite differences
    grad_sum,     // added to by the backward (a parameter gradient); generated before, compared
                  // after, and its increment checked against finite differences
    host_result,  // a double the forward returns to the host (sum_squares, a loss sum)
};

struct TensorSpec {
    std::string name;
    Role role = Role::input;
    DType dtype = DType::f32;
    int64_t count = 0;
    Fill fill;               // input, inout, probe, grad_sum
    std::string probe_name;  // output: the probe it is weighted by in the finite-difference loss
    std::string input_name;  // grad, grad_sum: the input it is the gradient of

    // out.weighted_by("dout"): the finite-difference loss is sum(out * dout).
    TensorSpec weighted_by(std::string probe) const;
    // dinp.of("inp"): this is d loss / d inp.
    TensorSpec of(std::string input) const;
};

TensorSpec input(std::string name, int64_t count, Fill fill = normal());
TensorSpec input_i32(std::string name, int64_t count, Fill fill);
TensorSpec input_i64(std::string name, int64_t count, Fill fill);
TensorSpec inout(std::string name, int64_t count, Fill fill = normal());
TensorSpec output(std::string name, int64_t count, DType dtype = DType::f32);
TensorSpec probe(std::string name, int64_t count, Fill fill = normal());
TensorSpec grad(std::string name, int64_t count);
TensorSpec grad_sum(std::string name, int64_t count, Fill fill = normal());
TensorSpec host_result(std::string name);

// The tensors of one run, by name, as the op's calls see them: pointers into the backend's
// memory (host results: into host memory).
class Args {
  public:
    struct Slot {
        void* data;
        DType dtype;
    };
    explicit Args(std::map<std::string, Slot> slots) : slots_(std::move(slots)) {}

    float* f32(const std::string& name) const { return static_cast<float*>(get(name, DType::f32)); }
    double* f64(const std::string& name) const {
        return static_cast<double*>(get(name, DType::f64));
    }
    int32_t* i32(const std::string& name) const {
        return static_cast<int32_t*>(get(name, DType::i32));
    }
    int64_t* i64(const std::string& name) const {
        return static_cast<int64_t*>(get(name, DType::i64));
    }
    uint8_t* u8(const std::string& name) const {
        return static_cast<uint8_t*>(get(name, DType::u8));
    }
    // The host double a host_result names.
    double& result(const std::string& name) const { return *f64(name); }

  private:
    void* get(const std::string& name, DType dtype) const;
    std::map<std::string, Slot> slots_;
};

using OpCall = std::function<void(Backend& backend, const Args& args)>;

struct Tolerance {
    // Largest error allowed between a backend and the CPU, and between the CPU backward and
    // finite differences, as |actual - expected| / max(|expected|, floor * max|expected|): relative
    // for ordinary entries, relative to the tensor's scale for entries near zero.
    double parity = 1e-5;
    double finite_difference = 2e-3;
    double floor = 1e-2;
    double step = 0x1p-5;  // the finite-difference step (a power of two: x +- h stays exact)
};

class OpCase {
  public:
    OpCase(std::string op, std::string shape) : op_(std::move(op)), shape_(std::move(shape)) {}

    OpCase& tensors(std::vector<TensorSpec> specs);
    // The Backend method the call tests (for the coverage check), and the call itself.
    OpCase& forward(std::string backend_op, OpCall call);
    OpCase& backward(std::string backend_op, OpCall call);
    OpCase& parity_tolerance(double tolerance);
    OpCase& finite_difference(double step, double tolerance);

    const std::string& op() const { return op_; }
    const std::string& shape() const { return shape_; }
    std::string name() const;  // "rmsnorm N=7 D=13"
    const std::vector<TensorSpec>& tensors() const { return tensors_; }
    const TensorSpec& tensor(const std::string& name) const;
    const std::string& forward_op() const { return forward_op_; }
    const std::string& backward_op() const { return backward_op_; }
    const OpCall& forward_call() const { return forward_; }
    const OpCall& backward_call() const { return backward_; }
    bool has_backward() const { return static_cast<bool>(backward_); }
    const Tolerance& tolerance() const { return tolerance_; }

  private:
    std::string op_;
    std::string shape_;
    std::vector<TensorSpec> tensors_;
    std::string forward_op_, backward_op_;
    OpCall forward_, backward_;
    Tolerance tolerance_;
};

class Registry {
  public:
    OpCase& add(std::string op, std::string shape);
    const std::vector<OpCase>& cases() const { return cases_; }

  private:
    std::vector<OpCase> cases_;
};

// Every registered case (cases.cpp), built once.
const std::vector<OpCase>& op_cases();

}  // namespace moetron::backend_ops
