#include "moetron/kernels/profiling_backend.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "moetron/core/error.h"

namespace moetron {

ProfilingBackend::ProfilingBackend(Backend& inner)
    : ForwardingBackend(inner), synchronize_around_ops_(inner.device() != Device::cpu) {}

int64_t ProfilingBackend::calls(std::string_view op) const {
    int64_t calls = 0;
    for (const OpTotals& t : totals_[static_cast<size_t>(backend_op_named(op))]) calls += t.calls;
    return calls;
}

void ProfilingBackend::reset() {
    totals_.fill({});
    memory_requests_ = 0;
}

template <typename Call>
decltype(auto) ProfilingBackend::timed(BackendOp op, Precision format, Call&& call) {
    if (paused_) return call();
    if (synchronize_around_ops_) inner_.synchronize();
    const auto start = std::chrono::steady_clock::now();
    const auto account = [&] {
        if (synchronize_around_ops_) inner_.synchronize();
        OpTotals& t = totals_[static_cast<size_t>(op)][static_cast<size_t>(format)];
        t.calls += 1;
        t.seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    if constexpr (std::is_void_v<decltype(call())>) {
        call();
        account();
    } else {
        auto result = call();
        account();
        return result;
    }
}

// Every op timed: GEMMs under the format of their call, the rest as float32.
#define MOETRON_OP(ret, op, category, params, args)                                   \
    ret ProfilingBackend::op params {                                                 \
        return timed(BackendOp::op, Precision::fp32, [&] { return inner_.op args; }); \
    }
#define MOETRON_GEMM_OP(ret, op, category, params, args)                               \
    ret ProfilingBackend::op params {                                                  \
        return timed(BackendOp::op, precision.format, [&] { return inner_.op args; }); \
    }
#include "moetron/kernels/backend_ops.inc"

std::string format_op_profile(const ProfilingBackend& profile, int64_t steps, double step_seconds) {
    MT_CHECK(steps > 0 && step_seconds > 0, "[profile] {} steps in {} s", steps, step_seconds);
    const double ms_per_step = 1e3 * step_seconds / static_cast<double>(steps);
    const auto per_step = [&](double total) { return total / static_cast<double>(steps); };

    // One row per op and format that was called.
    struct Row {
        BackendOp op;
        Precision format;
        const ProfilingBackend::OpTotals* totals;
    };
    std::vector<Row> rows;
    std::array<ProfilingBackend::OpTotals, kNumOpCategories> by_category{};
    double ops_seconds = 0;
    for (size_t i = 0; i < kNumBackendOps; ++i) {
        const auto op = static_cast<BackendOp>(i);
        for (size_t f = 0; f < kNumPrecisions; ++f) {
            const auto format = static_cast<Precision>(f);
            const ProfilingBackend::OpTotals& t = profile.totals(op, format);
            if (t.calls == 0) continue;
            rows.push_back({op, format, &t});
            ProfilingBackend::OpTotals& c =
                by_category[static_cast<size_t>(backend_op(op).category)];
            c.calls += t.calls;
            c.seconds += t.seconds;
            ops_seconds += t.seconds;
        }
    }
    std::vector<size_t> categories(kNumOpCategories);
    std::iota(categories.begin(), categories.end(), size_t{0});
    std::stable_sort(categories.begin(), categories.end(), [&](size_t a, size_t b) {
        return by_category[a].seconds > by_category[b].seconds;
    });
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
        return a.totals->seconds > b.totals->seconds;
    });

    std::string out =
        fmt::format("{:<34} {:>10} {:>7} {:>11}\n", "op (per step)", "ms", "% step", "calls");
    const auto line = [&](std::string_view label, const ProfilingBackend::OpTotals& t) {
        const double ms = 1e3 * per_step(t.seconds);
        out += fmt::format("{:<34} {:>10.2f} {:>6.1f}% {:>11.1f}\n", label, ms,
                           100.0 * ms / ms_per_step, per_step(static_cast<double>(t.calls)));
    };
    for (size_t c : categories) {
        if (by_category[c].calls == 0) continue;
        line(op_category_name(static_cast<OpCategory>(c)), by_category[c]);
        for (const Row& r : rows) {
            if (static_cast<size_t>(backend_op(r.op).category) != c) continue;
            const std::string_view name = backend_op(r.op).name;
            line(r.format == Precision::fp32
                     ? fmt::format("  {}", name)
                     : fmt::format("  {} [{}]", name, precision_name(r.format)),
                 *r.totals);
        }
    }
    const double rest_ms = ms_per_step - 1e3 * per_step(ops_seconds);
    out += fmt::format("{:<34} {:>10.2f} {:>6.1f}%\n", "outside the backend's ops", rest_ms,
                       100.0 * rest_ms / ms_per_step);
    out += fmt::format("{:<34} {:>10.2f} {:>6.1f}%\n", "step", ms_per_step, 100.0);
    return out;
}

}  // namespace moetron
