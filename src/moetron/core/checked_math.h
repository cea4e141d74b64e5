// Size arithmetic that cannot wrap: every count or byte size computed from user input (command
// line, presets, file headers) goes through these, so that a huge value ends in an error naming
// what was being computed instead of a small wrapped number, a negative size or std::bad_alloc.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "moetron/core/error.h"

namespace moetron {

// a * b, or an error "[op] <what> overflows: a x b" when it does not fit in T.
template <std::integral T>
T checked_mul(T a, T b, std::string_view what) {
    T product{};
    MT_CHECK(!__builtin_mul_overflow(a, b, &product), "{} overflows: {} x {}", what, a, b);
    return product;
}

// a + b, or an error naming `what` when it does not fit in T.
template <std::integral T>
T checked_add(T a, T b, std::string_view what) {
    T sum{};
    MT_CHECK(!__builtin_add_overflow(a, b, &sum), "{} overflows: {} + {}", what, a, b);
    return sum;
}

// The product of all factors, or an error naming `what`.
template <std::integral T>
T checked_product(std::initializer_list<T> factors, std::string_view what) {
    T product = 1;
    for (T f : factors) product = checked_mul(product, f, what);
    return product;
}

}  // namespace moetron
