#include "moetron/kernels/split_backward_backend.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "moetron/core/error.h"

namespace moetron {

void SplitBackwardBackend::plan_stash(int64_t slots, int64_t floats_per_slot,
                                      int64_t offsets_per_slot, int64_t gemms_per_slot) {
    MT_CHECK(slots >= 0 && floats_per_slot >= 0 && offsets_per_slot >= 0 && gemms_per_slot >= 0,
             "[split_backward] bad stash plan: {} slots of {} floats, {} offsets, {} GEMMs", slots,
             floats_per_slot, offsets_per_slot, gemms_per_slot);
    MT_CHECK(deferring_ == nullptr, "[split_backward] plan_stash while deferring");
    ArenaPlan plan("weight-gradient stash",
                   memory().device() == Device::cpu ? kHostAlignmentBytes : kDeviceAlignmentBytes);
    for (int64_t s = 0; s < slots; ++s) plan.add("slot" + std::to_string(s), {floats_per_slot});
    stash_ = Arena(plan, memory());
    slots_.assign(static_cast<size_t>(slots), Slot{});
    for (int64_t s = 0; s < slots; ++s) {
        Slot& slot = slots_[static_cast<size_t>(s)];
        slot.floats = static_cast<float*>(stash_.view(static_cast<size_t>(s)).data);
        slot.offsets.reserve(static_cast<size_t>(offsets_per_slot));
        slot.gemms.reserve(static_cast<size_t>(gemms_per_slot));
    }
    floats_per_slot_ = floats_per_slot;
    offsets_per_slot_ = offsets_per_slot;
    gemms_per_slot_ = gemms_per_slot;
}

void SplitBackwardBackend::set_deferrable_gradients(const float* gradients, int64_t numel) {
    deferrable_begin_ = gradients;
    deferrable_end_ = gradients + numel;
}

bool SplitBackwardBackend::defers(const float* dweight) const {
    if (deferring_ == nullptr || dweight == nullptr) return false;
    if (deferrable_begin_ == nullptr) return true;
    // Compared as addresses: dweight may lie in another allocation.
    const auto at = reinterpret_cast<uintptr_t>(dweight);
    return at >= reinterpret_cast<uintptr_t>(deferrable_begin_) &&
           at < reinterpret_cast<uintptr_t>(deferrable_end_);
}

void SplitBackwardBackend::defer_into(int64_t slot) {
    MT_CHECK(slot >= 0 && slot < static_cast<int64_t>(slots_.size()),
             "[split_backward] slot {} of a stash of {}", slot, slots_.size());
    Slot& s = slots_[static_cast<size_t>(slot)];
    MT_CHECK(s.gemms.empty(), "[split_backward] slot {} still holds {} weight gradients", slot,
             s.gemms.size());
    deferring_ = &s;
}

void SplitBackwardBackend::stop_deferring() {
    deferring_ = nullptr;
}

void SplitBackwardBackend::defer_notice(int64_t begin, int64_t end) {
    MT_CHECK(deferring_ != nullptr, "[split_backward] a notice while not deferring");
    MT_CHECK(static_cast<int64_t>(deferring_->gemms.size()) < gemms_per_slot_,
             "[split_backward] more than the {} GEMMs and notices planned per stash slot",
             gemms_per_slot_);
    deferring_->gemms.push_back({.notice_begin = begin, .notice_end = end});
}

void SplitBackwardBackend::run_deferred(
    int64_t slot, const std::function<void(int64_t begin, int64_t end)>& notify) {
    MT_CHECK(slot >= 0 && slot < static_cast<int64_t>(slots_.size()),
             "[split_backward] slot {} of a stash of {}", slot, slots_.size());
    Slot& s = slots_[static_cast<size_t>(slot)];
    for (const Deferred& g : s.gemms) {
        if (g.dweight == nullptr) {
            if (notify) notify(g.notice_begin, g.notice_end);
        } else if (g.offsets == nullptr)
            inner().linear_backward(nullptr, g.dweight, g.dout, g.inp, nullptr, g.num_rows,
                                    g.in_dim, g.out_dim, g.precision);
        else
            inner().grouped_linear_backward(nullptr, g.dweight, g.dout, g.inp, nullptr, g.offsets,
                                            g.num_experts, g.in_dim, g.out_dim, g.precision);
    }
    s.gemms.clear();
    s.offsets.clear();
    s.floats_used = 0;
}

const float* SplitBackwardBackend::stash_floats(const float* src, int64_t n) {
    MT_CHECK(deferring_->floats_used + n <= floats_per_slot_,
             "[split_backward] a micro-batch's weight gradients need more than the {} floats "
             "planned per stash slot",
             floats_per_slot_);
    float* dst = deferring_->floats + deferring_->floats_used;
    deferring_->floats_used += n;
    inner().copy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return dst;
}

void SplitBackwardBackend::linear_backward(float* dinp, float* dweight, const float* dout,
                                           const float* inp, const float* weight, int64_t num_rows,
                                           int64_t in_dim, int64_t out_dim,
                                           GemmPrecision precision) {
    if (!defers(dweight)) {
        inner().linear_backward(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim,
                                precision);
        return;
    }
    MT_CHECK(static_cast<int64_t>(deferring_->gemms.size()) < gemms_per_slot_,
             "[split_backward] more than the {} GEMMs and notices planned per stash slot",
             gemms_per_slot_);
    const float* dout_copy = stash_floats(dout, num_rows * out_dim);
    const float* inp_copy = stash_floats(inp, num_rows * in_dim);
    deferring_->gemms.push_back({.dweight = dweight,
                                 .dout = dout_copy,
                                 .inp = inp_copy,
                                 .num_rows = num_rows,
                                 .in_dim = in_dim,
                                 .out_dim = out_dim,
                                 .precision = precision});
    if (dinp != nullptr)
        inner().linear_backward(dinp, nullptr, dout, inp, weight, num_rows, in_dim, out_dim,
                                precision);
}

void SplitBackwardBackend::grouped_linear_backward(float* dinp, float* dweight, const float* dout,
                                                   const float* inp, const float* weight,
                                                   const int64_t* offsets, int64_t num_experts,
                                                   int64_t in_dim, int64_t out_dim,
                                                   GemmPrecision precision) {
    if (!defers(dweight)) {
        inner().grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets, num_experts,
                                        in_dim, out_dim, precision);
        return;
    }
    MT_CHECK(static_cast<int64_t>(deferring_->gemms.size()) < gemms_per_slot_,
             "[split_backward] more than the {} GEMMs and notices planned per stash slot",
             gemms_per_slot_);
    std::vector<int64_t>& kept = deferring_->offsets;
    MT_CHECK(static_cast<int64_t>(kept.size()) + num_experts + 1 <= offsets_per_slot_,
             "[split_backward] more than the {} expert offsets planned per stash slot",
             offsets_per_slot_);
    // The offsets are host memory on every backend (the grouped GEMMs read them on the host).
    const size_t first = kept.size();
    kept.insert(kept.end(), offsets, offsets + num_experts + 1);
    const int64_t num_rows = offsets[num_experts];
    const float* dout_copy = stash_floats(dout, num_rows * out_dim);
    const float* inp_copy = stash_floats(inp, num_rows * in_dim);
    deferring_->gemms.push_back({.dweight = dweight,
                                 .dout = dout_copy,
                                 .inp = inp_copy,
                                 .offsets = kept.data() + first,
                                 .num_rows = num_rows,
                                 .num_experts = num_experts,
                                 .in_dim = in_dim,
                                 .out_dim = out_dim,
                                 .precision = precision});
    if (dinp != nullptr)
        inner().grouped_linear_backward(dinp, nullptr, dout, inp, weight, offsets, num_experts,
                                        in_dim, out_dim, precision);
}

}  // namespace moetron
