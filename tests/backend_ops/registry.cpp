#include "backend_ops/registry.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "moetron/core/error.h"

namespace moetron::backend_ops {

// ---- fills ----

Fill normal(double scale) {
    return [scale](std::span<double> out, const ParamRng& rng) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = scale * rng.normal(i);
    };
}

Fill uniform(double low, double high) {
    return [low, high](std::span<double> out, const ParamRng& rng) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = low + (high - low) * rng.uniform(i);
    };
}

Fill constant(double value) {
    return [value](std::span<double> out, const ParamRng&) {
        std::fill(out.begin(), out.end(), value);
    };
}

Fill values(std::vector<double> list) {
    return [list = std::move(list)](std::span<double> out, const ParamRng&) {
        MT_CHECK(out.size() == list.size(), "[backend_ops] values() has {} entries for {} elements",
                 list.size(), out.size());
        std::copy(list.begin(), list.end(), out.begin());
    };
}

Fill ids_below(int64_t bound, int64_t ignore_every, double ignore) {
    return [=](std::span<double> out, const ParamRng& rng) {
        for (size_t i = 0; i < out.size(); ++i) {
            const bool ignored = ignore_every > 0 && (i + 1) % ignore_every == 0;
            out[i] =
                ignored ? ignore : std::min<double>(std::floor(rng.uniform(i) * bound), bound - 1);
        }
    };
}

Fill distinct_ids_per_row(int64_t row_length, int64_t bound) {
    return [=](std::span<double> out, const ParamRng& rng) {
        MT_CHECK(row_length <= bound && out.size() % row_length == 0,
                 "[backend_ops] {} distinct ids per row below {} for {} elements", row_length,
                 bound, out.size());
        std::vector<int64_t> pool;
        for (size_t row = 0; row < out.size() / row_length; ++row) {
            pool.resize(bound);
            std::iota(pool.begin(), pool.end(), 0);
            for (int64_t j = 0; j < row_length; ++j) {  // draw without replacement
                const size_t i = row * row_length + j;
                const auto left = static_cast<int64_t>(pool.size());
                const auto pick = std::min<int64_t>(rng.uniform(i) * left, left - 1);
                out[i] = static_cast<double>(pool[pick]);
                pool.erase(pool.begin() + pick);
            }
        }
    };
}

Fill permutation() {
    return [](std::span<double> out, const ParamRng& rng) {
        std::vector<size_t> order(out.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return rng.uniform(a) < rng.uniform(b); });
        for (size_t i = 0; i < out.size(); ++i) out[order[i]] = static_cast<double>(i);
    };
}

Fill levels_per_row(int64_t row_length, double spacing) {
    return [=](std::span<double> out, const ParamRng& rng) {
        std::vector<size_t> order(row_length);
        for (size_t row = 0; row < out.size() / row_length; ++row) {
            const size_t first = row * row_length;
            std::iota(order.begin(), order.end(), first);
            std::stable_sort(order.begin(), order.end(),
                             [&](size_t a, size_t b) { return rng.uniform(a) < rng.uniform(b); });
            for (int64_t rank = 0; rank < row_length; ++rank)
                out[order[rank]] = spacing * (static_cast<double>(rank) - (row_length - 1) / 2.0);
        }
    };
}

// ---- tensor specs ----

TensorSpec TensorSpec::weighted_by(std::string probe) const {
    TensorSpec spec = *this;
    spec.probe_name = std::move(probe);
    return spec;
}

TensorSpec TensorSpec::of(std::string input) const {
    TensorSpec spec = *this;
    spec.input_name = std::move(input);
    return spec;
}

namespace {
TensorSpec make_spec(std::string name, Role role, DType dtype, int64_t count, Fill fill) {
    TensorSpec spec;
    spec.name = std::move(name);
    spec.role = role;
    spec.dtype = dtype;
    spec.count = count;
    spec.fill = std::move(fill);
    return spec;
}
}  // namespace

TensorSpec input(std::string name, int64_t count, Fill fill) {
    return make_spec(std::move(name), Role::input, DType::f32, count, std::move(fill));
}
TensorSpec input_i32(std::string name, int64_t count, Fill fill) {
    return make_spec(std::move(name), Role::input, DType::i32, count, std::move(fill));
}
TensorSpec input_i64(std::string name, int64_t count, Fill fill) {
    return make_spec(std::move(name), Role::input, DType::i64, count, std::move(fill));
}
TensorSpec inout(std::string name, int64_t count, Fill fill) {
    return make_spec(std::move(name), Role::inout, DType::f32, count, std::move(fill));
}
TensorSpec output(std::string name, int64_t count, DType dtype) {
    return make_spec(std::move(name), Role::output, dtype, count, {});
}
TensorSpec probe(std::string name, int64_t count, Fill fill) {
    return make_spec(std::move(name), Role::probe, DType::f32, count, std::move(fill));
}
TensorSpec grad(std::string name, int64_t count) {
    return make_spec(std::move(name), Role::grad, DType::f32, count, {});
}
TensorSpec grad_sum(std::string name, int64_t count, Fill fill) {
    return make_spec(std::move(name), Role::grad_sum, DType::f32, count, std::move(fill));
}
TensorSpec host_result(std::string name) {
    return make_spec(std::move(name), Role::host_result, DType::f64, 1, {});
}

// ---- args ----

void* Args::get(const std::string& name, DType dtype) const {
    const auto it = slots_.find(name);
    MT_CHECK(it != slots_.end(), "[backend_ops] the case has no tensor '{}'", name);
    MT_CHECK(it->second.dtype == dtype, "[backend_ops] tensor '{}' holds {}, read as {}", name,
             dtype_name(it->second.dtype), dtype_name(dtype));
    return it->second.data;
}

// ---- cases ----

OpCase& OpCase::tensors(std::vector<TensorSpec> specs) {
    tensors_ = std::move(specs);
    return *this;
}

OpCase& OpCase::forward(std::string backend_op, OpCall call) {
    forward_op_ = std::move(backend_op);
    forward_ = std::move(call);
    return *this;
}

OpCase& OpCase::backward(std::string backend_op, OpCall call) {
    backward_op_ = std::move(backend_op);
    backward_ = std::move(call);
    return *this;
}

OpCase& OpCase::parity_tolerance(double tolerance) {
    tolerance_.parity = tolerance;
    return *this;
}

OpCase& OpCase::finite_difference(double step, double tolerance) {
    tolerance_.step = step;
    tolerance_.finite_difference = tolerance;
    return *this;
}

std::string OpCase::name() const {
    return shape_.empty() ? op_ : op_ + " " + shape_;
}

const TensorSpec& OpCase::tensor(const std::string& name) const {
    for (const TensorSpec& spec : tensors_)
        if (spec.name == name) return spec;
    MT_THROW("[backend_ops] case '{}' has no tensor '{}'", this->name(), name);
}

OpCase& Registry::add(std::string op, std::string shape) {
    cases_.emplace_back(std::move(op), std::move(shape));
    return cases_.back();
}

}  // namespace moetron::backend_ops
