#include "backend_ops/harness.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "moetron/core/arena.h"
#include "moetron/core/error.h"

namespace moetron::backend_ops {

namespace {

constexpr uint64_t kSeed = 20261201;
// What an integer output holds before the op writes it (every integer the ops write is >= 0).
constexpr double kUnwritten = -987654;

bool is_integer(DType dtype) {
    return dtype == DType::i32 || dtype == DType::i64 || dtype == DType::u8;
}

bool generated(Role role) {
    return role == Role::input || role == Role::inout || role == Role::probe ||
           role == Role::grad_sum;
}

bool compared(Role role) {
    return role == Role::inout || role == Role::output || role == Role::grad ||
           role == Role::grad_sum || role == Role::host_result;
}

std::vector<std::byte> to_bytes(const std::vector<double>& values, DType dtype) {
    std::vector<std::byte> bytes(values.size() * dtype_size_bytes(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
        std::byte* at = bytes.data() + i * dtype_size_bytes(dtype);
        if (dtype == DType::f32) {
            const auto v = static_cast<float>(values[i]);
            std::memcpy(at, &v, sizeof v);
        } else if (dtype == DType::f64) {
            std::memcpy(at, &values[i], sizeof(double));
        } else if (dtype == DType::i32) {
            const auto v = static_cast<int32_t>(values[i]);
            std::memcpy(at, &v, sizeof v);
        } else if (dtype == DType::i64) {
            const auto v = static_cast<int64_t>(values[i]);
            std::memcpy(at, &v, sizeof v);
        } else if (dtype == DType::u8) {
            // A byte cannot hold kUnwritten: an unwritten u8 output starts at 0 (and goes
            // undetected).
            const auto v = static_cast<uint8_t>(values[i] == kUnwritten ? 0 : values[i]);
            std::memcpy(at, &v, sizeof v);
        } else {
            MT_THROW("[backend_ops] dtype {} is not supported", dtype_name(dtype));
        }
    }
    return bytes;
}

std::vector<double> from_bytes(const std::vector<std::byte>& bytes, DType dtype) {
    std::vector<double> values(bytes.size() / dtype_size_bytes(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
        const std::byte* at = bytes.data() + i * dtype_size_bytes(dtype);
        if (dtype == DType::f32) {
            float v;
            std::memcpy(&v, at, sizeof v);
            values[i] = v;
        } else if (dtype == DType::f64) {
            std::memcpy(&values[i], at, sizeof(double));
        } else if (dtype == DType::i32) {
            int32_t v;
            std::memcpy(&v, at, sizeof v);
            values[i] = v;
        } else if (dtype == DType::u8) {
            values[i] = static_cast<double>(std::to_integer<uint8_t>(*at));
        } else {
            int64_t v;
            std::memcpy(&v, at, sizeof v);
            values[i] = static_cast<double>(v);
        }
    }
    return values;
}

// One case's tensors on one backend: an arena in the backend's memory holding every tensor
// (host results in host memory), and the initial values each run starts from.
class CaseRun {
  public:
    CaseRun(const OpCase& op_case, Backend& backend) : op_case_(op_case), backend_(backend) {
        ArenaPlan plan(op_case.name(), kDeviceAlignmentBytes);
        for (const TensorSpec& spec : op_case.tensors()) {
            if (spec.role != Role::host_result) plan.add(spec.name, {spec.count}, spec.dtype);
        }
        plan.add(" guard", {1});  // never an empty arena; the name cannot clash with a tensor's
        arena_ = Arena(plan, backend.memory());

        std::map<std::string, Args::Slot> slots;
        for (const TensorSpec& spec : op_case.tensors()) {
            initial_[spec.name] = initial_values(spec);
            if (spec.role == Role::host_result) {
                slots[spec.name] = {&host_results_[spec.name], DType::f64};
            } else {
                slots[spec.name] = {arena_.view(spec.name).data, spec.dtype};
            }
        }
        args_ = std::make_unique<Args>(std::move(slots));
        for (const TensorSpec& spec : op_case.tensors()) upload(spec.name, initial_[spec.name]);
    }

    const std::vector<double>& initial(const std::string& name) const { return initial_.at(name); }

    void upload(const std::string& name, const std::vector<double>& values) {
        const TensorSpec& spec = op_case_.tensor(name);
        if (spec.role == Role::host_result) {
            host_results_[name] = values[0];
            return;
        }
        const std::vector<std::byte> bytes = to_bytes(values, spec.dtype);
        backend_.copy_from_host(arena_.view(name).data, bytes.data(), bytes.size());
    }

    std::vector<double> download(const std::string& name) {
        const TensorSpec& spec = op_case_.tensor(name);
        if (spec.role == Role::host_result) return {host_results_[name]};
        std::vector<std::byte> bytes(static_cast<size_t>(spec.count) *
                                     dtype_size_bytes(spec.dtype));
        backend_.copy_to_host(bytes.data(), arena_.view(name).data, bytes.size());
        return from_bytes(bytes, spec.dtype);
    }

    void forward() {
        op_case_.forward_call()(backend_, *args_);
        backend_.synchronize();
    }
    void backward() {
        op_case_.backward_call()(backend_, *args_);
        backend_.synchronize();
    }

  private:
    std::vector<double> initial_values(const TensorSpec& spec) const {
        std::vector<double> values(spec.count);
        if (generated(spec.role)) {
            MT_CHECK(spec.fill, "[backend_ops] {}: tensor '{}' has no fill", op_case_.name(),
                     spec.name);
            spec.fill(values, ParamRng(kSeed, op_case_.name() + "/" + spec.name));
        } else {
            std::fill(
                values.begin(), values.end(),
                is_integer(spec.dtype) ? kUnwritten : std::numeric_limits<double>::quiet_NaN());
        }
        return values;
    }

    const OpCase& op_case_;
    Backend& backend_;
    Arena arena_;
    std::map<std::string, std::vector<double>> initial_;
    std::map<std::string, double> host_results_;  // std::map: the addresses stay put
    std::unique_ptr<Args> args_;
};

struct ErrorSummary {
    double max_error = 0;  // the metric of Tolerance
    size_t worst = 0;
    std::string problem;  // an unwritten or non-finite element, or a mismatch in length
};

// The error of `actual` against `expected` as Tolerance describes it.
ErrorSummary compare_floats(const std::vector<double>& actual, const std::vector<double>& expected,
                            double floor) {
    ErrorSummary error;
    if (actual.size() != expected.size()) {
        error.problem = fmt::format("{} values, expected {}", actual.size(), expected.size());
        return error;
    }
    double scale = 0;
    for (double e : expected) scale = std::max(scale, std::fabs(e));
    for (size_t i = 0; i < actual.size(); ++i) {
        if (!std::isfinite(actual[i]) || !std::isfinite(expected[i])) {
            error.problem = fmt::format(
                "[{}] = {} (expected {}): not finite, or never written (outputs start as NaN)", i,
                actual[i], expected[i]);
            return error;
        }
        double denominator = std::max(std::fabs(expected[i]), floor * scale);
        if (denominator == 0) denominator = 1;  // an all-zero tensor: absolute error
        const double err = std::fabs(actual[i] - expected[i]) / denominator;
        if (err > error.max_error) {
            error.max_error = err;
            error.worst = i;
        }
    }
    return error;
}

std::string compare_integers(const std::vector<double>& actual,
                             const std::vector<double>& expected) {
    if (actual.size() != expected.size())
        return fmt::format("{} values, expected {}", actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) {
        if (actual[i] == kUnwritten || expected[i] == kUnwritten)
            return fmt::format("[{}] was never written", i);
        if (actual[i] != expected[i])
            return fmt::format("[{}] = {}, expected {}", i, actual[i], expected[i]);
    }
    return {};
}

}  // namespace

Results run_case(const OpCase& op_case, Backend& backend) {
    CaseRun run(op_case, backend);
    run.forward();
    if (op_case.has_backward()) run.backward();
    Results results;
    for (const TensorSpec& spec : op_case.tensors()) {
        if (compared(spec.role)) results[spec.name] = {spec.dtype, run.download(spec.name)};
    }
    return results;
}

std::vector<std::string> compare_results(const OpCase& op_case, const std::string& backend_name,
                                         const Results& actual, const Results& expected) {
    std::vector<std::string> problems;
    for (const auto& [name, want] : expected) {
        const auto found = actual.find(name);
        if (found == actual.end()) {
            problems.push_back(
                fmt::format("{} on {}: no tensor '{}'", op_case.name(), backend_name, name));
            continue;
        }
        const std::vector<double>& got = found->second.values;
        if (is_integer(want.dtype)) {
            const std::string problem = compare_integers(got, want.values);
            if (!problem.empty())
                problems.push_back(
                    fmt::format("{} on {}: {}{}", op_case.name(), backend_name, name, problem));
            continue;
        }
        const ErrorSummary error = compare_floats(got, want.values, op_case.tolerance().floor);
        std::printf("[maxerr] %s on %s: %s err=%.3e\n", op_case.name().c_str(),
                    backend_name.c_str(), name.c_str(), error.max_error);
        if (!error.problem.empty()) {
            problems.push_back(
                fmt::format("{} on {}: {}{}", op_case.name(), backend_name, name, error.problem));
        } else if (error.max_error > op_case.tolerance().parity) {
            problems.push_back(fmt::format(
                "{} on {}: {}[{}] = {}, the CPU has {}: error {:.3e} > parity tolerance {:.1e}",
                op_case.name(), backend_name, name, error.worst, got[error.worst],
                want.values[error.worst], error.max_error, op_case.tolerance().parity));
        }
    }
    return problems;
}

int64_t finite_difference_elements(const OpCase& op_case) {
    if (!op_case.has_backward()) return 0;
    int64_t elements = 0;
    for (const TensorSpec& spec : op_case.tensors()) {
        if ((spec.role == Role::grad || spec.role == Role::grad_sum) && !spec.input_name.empty())
            elements += op_case.tensor(spec.input_name).count;
    }
    return elements;
}

std::vector<std::string> check_finite_differences(const OpCase& op_case, Backend& backend) {
    CaseRun run(op_case, backend);
    run.forward();
    run.backward();

    std::vector<const TensorSpec*> weighted_outputs, inouts, gradients;
    for (const TensorSpec& spec : op_case.tensors()) {
        if (spec.role == Role::output && !spec.probe_name.empty())
            weighted_outputs.push_back(&spec);
        if (spec.role == Role::inout) inouts.push_back(&spec);
        if ((spec.role == Role::grad || spec.role == Role::grad_sum) && !spec.input_name.empty())
            gradients.push_back(&spec);
    }

    // L = sum over weighted outputs of output . probe, in double, after a fresh forward.
    const auto loss = [&] {
        for (const TensorSpec* spec : inouts) run.upload(spec->name, run.initial(spec->name));
        run.forward();
        double sum = 0;
        for (const TensorSpec* spec : weighted_outputs) {
            const std::vector<double> out = run.download(spec->name);
            const std::vector<double>& weight = run.initial(spec->probe_name);
            for (size_t i = 0; i < out.size(); ++i) sum += out[i] * weight[i];
        }
        return sum;
    };

    std::vector<std::string> problems;
    for (const TensorSpec* gradient : gradients) {
        std::vector<double> analytic = run.download(gradient->name);
        if (gradient->role == Role::grad_sum) {  // the backward added this much
            const std::vector<double>& before = run.initial(gradient->name);
            for (size_t i = 0; i < analytic.size(); ++i) analytic[i] -= before[i];
        }
        const std::string& input = gradient->input_name;
        std::vector<double> x = run.initial(input);
        std::vector<double> numeric(x.size());
        const double h = op_case.tolerance().step;
        // L with x[i] moved by `delta` (as the float32 input holds it).
        const auto loss_at = [&](size_t i, double delta) {
            const double saved = x[i];
            x[i] = static_cast<float>(saved + delta);
            run.upload(input, x);
            const double value = loss();
            x[i] = saved;
            return value;
        };
        for (size_t i = 0; i < x.size(); ++i) {
            // The five-point central stencil: error O(h^4), so the step can stay large enough
            // that float32 rounding in the forward hardly shows.
            numeric[i] =
                (8 * (loss_at(i, h) - loss_at(i, -h)) - (loss_at(i, 2 * h) - loss_at(i, -2 * h))) /
                (12 * h);
        }
        run.upload(input, x);

        const ErrorSummary error = compare_floats(analytic, numeric, op_case.tolerance().floor);
        std::printf("[maxerr] %s: %s against finite differences err=%.3e\n", op_case.name().c_str(),
                    gradient->name.c_str(), error.max_error);
        if (!error.problem.empty()) {
            problems.push_back(
                fmt::format("{}: {}{}", op_case.name(), gradient->name, error.problem));
        } else if (error.max_error > op_case.tolerance().finite_difference) {
            problems.push_back(fmt::format(
                "{}: {}[{}] = {}, finite differences give {}: error {:.3e} > tolerance {:.1e}",
                op_case.name(), gradient->name, error.worst, analytic[error.worst],
                numeric[error.worst], error.max_error, op_case.tolerance().finite_difference));
        }
    }
    return problems;
}

}  // namespace moetron::backend_ops
