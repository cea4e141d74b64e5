#include "moetron/core/tensor.h"

namespace moetron {

std::string Shape::str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + (ndim == 1 ? ",)" : ")");
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
    MT_CHECK(shape.ndim >= 1, "[tensor] rows() of a 0-dim view");
    MT_CHECK(0 <= begin && begin <= end && end <= shape[0], "[tensor] rows [{}, {}) of {}", begin,
             end, shape.str());
    Shape s = shape;
    s.dims[0] = end - begin;
    const size_t row_bytes = size_bytes() / (shape[0] ? static_cast<size_t>(shape[0]) : 1);
    return {static_cast<char*>(data) + static_cast<size_t>(begin) * row_bytes, s, dtype, device};
}

TensorView TensorView::reshaped(Shape s) const {
    MT_CHECK(s.numel() == numel(), "[tensor] reshape {} -> {} changes the element count",
             shape.str(), s.str());
    return {data, s, dtype, device};
}

}  // namespace moetron
