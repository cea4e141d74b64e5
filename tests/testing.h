// Shared test helpers: deterministic random inputs, float64 central finite differences, and
// error reporting in one grep-able format ("[maxerr] <kernel> <what> rel=<x> abs=<y>").
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "moetron/core/rng.h"

namespace moetron::testing {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
    ParamRng rng(seed, "test");
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * rng.normal(i);
    return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
}

// Gradient of a scalar function f at x by central differences, step h (f evaluated in double).
inline std::vector<double> finite_difference_gradient(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    double h = 1e-5) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + h;
        const double up = f(x);
        x[i] = saved - h;
        const double down = f(x);
        x[i] = saved;
        g[i] = (up - down) / (2 * h);
    }
    return g;
}

struct ErrorStats {
    double max_abs = 0;
    double max_rel = 0;  // |a - e| / max(|e|, floor): floor keeps near-zero entries meaningful
};

template <class A, class E>
ErrorStats compare(const A* actual, const E* expected, size_t n, double floor = 1e-2) {
    ErrorStats s;
    for (size_t i = 0; i < n; ++i) {
        const double a = static_cast<double>(actual[i]), e = static_cast<double>(expected[i]);
        const double abs_err = std::fabs(a - e);
        s.max_abs = std::max(s.max_abs, abs_err);
        s.max_rel = std::max(s.max_rel, abs_err / std::max(std::fabs(e), floor));
    }
    return s;
}

// Prints the figure the closing note quotes and checks it against a tolerance.
inline void expect_close(const char* kernel, const char* what, const ErrorStats& s,
                         double rel_tol) {
    std::printf("[maxerr] %s %s rel=%.3e abs=%.3e\n", kernel, what, s.max_rel, s.max_abs);
    EXPECT_LE(s.max_rel, rel_tol) << kernel << " " << what;
}

}  // namespace moetron::testing
