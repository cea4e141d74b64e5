// A Backend that forwards every op to another one, unchanged: the base of a decorator that
// changes a few ops (SplitBackwardBackend changes the GEMM backwards; tests record what they
// see). Made from the op list (backend_ops.inc), so it forwards every op there is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "moetron/kernels/backend.h"

namespace moetron {

class ForwardingBackend : public Backend {
  public:
    explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

    Backend& inner() const { return inner_; }

    std::string_view name() const override { return inner_.name(); }
    Device device() const override { return inner_.device(); }
    std::string describe() const override { return inner_.describe(); }
    std::string describe_gemms(Precision format) const override {
        return inner_.describe_gemms(format);
    }
    MemoryResource& memory() override { return inner_.memory(); }
    Stream stream() const override { return inner_.stream(); }

#define MOETRON_OP(ret, op, category, params, args) \
    ret op params override {                        \
        return inner_.op args;                      \
    }
#include "moetron/kernels/backend_ops.inc"

  protected:
    Backend& inner_;
};

}  // namespace moetron
