// TensorView: a non-owning view (pointer, shape, dtype, device) into an arena. Views never own or
// free memory; arenas do (core/arena.h). Row-major, contiguous. Element access through at<T>()
// is bounds- and type-checked in debug builds (MOETRON_CHECKED_ACCESS, on when NDEBUG is unset).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "moetron/core/checked_math.h"
#include "moetron/core/dtype.h"
#include "moetron/core/error.h"

#if !defined(NDEBUG) && !defined(MOETRON_CHECKED_ACCESS)
#define MOETRON_CHECKED_ACCESS 1
#endif

namespace moetron {

enum class Device : uint8_t { cpu, cuda };

inline constexpr int kMaxDims = 5;

struct Shape {
    std::array<int64_t, kMaxDims> dims{};
    int ndim = 0;

    Shape() = default;
    Shape(std::initializer_list<int64_t> d) {
        MT_CHECK(d.size() <= kMaxDims, "[tensor] at most {} dims, got {}", kMaxDims, d.size());
        for (int64_t x : d) {
            MT_CHECK(x >= 0, "[tensor] negative dimension {}", x);
            dims[ndim++] = x;
        }
    }
    int64_t operator[](int i) const { return dims[i]; }
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i) n = checked_mul(n, dims[i], "[tensor] element count");
        return n;
    }
    bool operator==(const Shape& o) const {
        if (ndim != o.ndim) return false;
        for (int i = 0; i < ndim; ++i)
            if (dims[i] != o.dims[i]) return false;
        return true;
    }
    std::string str() const;  // "(2, 3, 4)"
};

struct TensorView {
    void* data = nullptr;
    Shape shape;
    DType dtype = DType::f32;
    Device device = Device::cpu;

    TensorView() = default;
    TensorView(void* d, Shape s, DType t, Device dev = Device::cpu)
        : data(d), shape(s), dtype(t), device(dev) {}

    int64_t numel() const { return shape.numel(); }
    size_t size_bytes() const { return static_cast<size_t>(numel()) * dtype_size_bytes(dtype); }
    int ndim() const { return shape.ndim; }
    int64_t dim(int i) const { return shape[i]; }

    // Typed raw pointer; checks the dtype always (cheap, and a wrong cast is a silent disaster).
    template <class T>
    T* ptr() const {
        MT_CHECK(dtype == dtype_of<T>(), "[tensor] view holds {}, accessed as {}",
                 dtype_name(dtype), dtype_name(dtype_of<T>()));
        return static_cast<T*>(data);
    }
    float* f32() const { return ptr<float>(); }

    // Element access by multi-index; CPU views only.
    template <class T, class... Idx>
    T& at(Idx... idx) const {
        const int64_t ix[] = {static_cast<int64_t>(idx)...};
        constexpr int n = sizeof...(Idx);
#if MOETRON_CHECKED_ACCESS
        MT_CHECK(device == Device::cpu, "[tensor] at() on a device view");
        MT_CHECK(n == shape.ndim, "[tensor] {} indices for a {}-dim view", n, shape.ndim);
        for (int i = 0; i < n; ++i)
            MT_CHECK(ix[i] >= 0 && ix[i] < shape[i], "[tensor] index {} = {} out of range {}", i,
                     ix[i], shape.str());
        MT_CHECK(dtype == dtype_of<T>(), "[tensor] view holds {}, accessed as {}",
                 dtype_name(dtype), dtype_name(dtype_of<T>()));
#endif
        int64_t off = 0;
        for (int i = 0; i < n; ++i) off = off * shape[i] + ix[i];
        return static_cast<T*>(data)[off];
    }

    // A view of rows [begin, end) along dimension 0.
    TensorView rows(int64_t begin, int64_t end) const;
    // The same memory seen with another shape of equal element count.
    TensorView reshaped(Shape s) const;
};

}  // namespace moetron
