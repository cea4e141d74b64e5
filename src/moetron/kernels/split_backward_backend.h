// A Backend decorator that splits the GEMM backwards in two, for zero-bubble pipeline schedules
// (train/pipeline_schedule.h, zb-h1): while a stage runs a micro-batch's B (input-gradient)
// pass, linear_backward and grouped_linear_backward compute only their input gradient and queue
// their weight gradient, with copies of its two operands (the output gradient lives in scratch
// that the next layer's backward overwrites, and the stage's activation set is freed after B);
// the micro-batch's W pass later replays the queue in the order it was filled, so each weight
// gradient accumulates exactly what the unsplit backward would have.
//
// What stays in B: every other op's weight gradient (RMSNorm weights, the embedding) and the
// GEMMs the model runs on the backend below this one (ModelRuntime::whole_backward: the router
// and the output head). Those are cheap next to the layers' GEMMs (the head is one GEMM per
// micro-batch), and keeping them in B keeps the queue to the layers' weights.
//
// The stash is planned once (plan_stash): a ring of slots, one per micro-batch whose W is
// pending, each sized for the most operand floats one micro-batch's backward can queue. Queuing
// allocates nothing; overflowing a slot is an internal error.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/kernels/forwarding_backend.h"

namespace moetron {

class SplitBackwardBackend : public ForwardingBackend {
  public:
    explicit SplitBackwardBackend(Backend& inner) : ForwardingBackend(inner) {}

    // Plans and allocates the stash: `slots` micro-batches queued at once, each with at most
    // `floats_per_slot` floats of copied operands (in the inner backend's memory),
    // `offsets_per_slot` expert segment offsets and `gemms_per_slot` GEMMs and notices.
    void plan_stash(int64_t slots, int64_t floats_per_slot, int64_t offsets_per_slot,
                    int64_t gemms_per_slot);
    // Only weight gradients into [gradients, gradients + numel) (the model's gradient buffer)
    // are deferred; one into another buffer is a partial sum the backward goes on to reduce
    // (MTP's eh_proj under tensor parallelism) and runs whole in B. Unset: all are deferred.
    void set_deferrable_gradients(const float* gradients, int64_t numel);
    // From here until stop_deferring(), the GEMM backwards queue their weight gradients into
    // slot `slot`, which must be empty.
    void defer_into(int64_t slot);
    void stop_deferring();
    // Queues, into the deferring slot, the notice that gradients [begin, end) are final: the
    // backward announced them during B, but they are final only once the weight gradients
    // queued before the notice have run.
    void defer_notice(int64_t begin, int64_t end);
    // Runs the weight gradients queued in `slot`, oldest first, passing each notice to `notify`
    // in its turn, and empties the slot.
    void run_deferred(int64_t slot,
                      const std::function<void(int64_t begin, int64_t end)>& notify = {});
    // The stash's size, for the memory report.
    size_t stash_bytes() const { return stash_.size_bytes(); }

    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim, int64_t out_dim,
                         GemmPrecision precision) override;
    void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const int64_t* offsets, int64_t num_experts,
                                 int64_t in_dim, int64_t out_dim, GemmPrecision precision) override;

  private:
    // One queued item: a weight gradient, dweight += dout^T inp (per expert segment when
    // grouped), or, with a null dweight, the notice that gradients [notice_begin, notice_end)
    // are final.
    struct Deferred {
        float* dweight = nullptr;
        const float* dout = nullptr;  // the slot's copies
        const float* inp = nullptr;
        const int64_t* offsets = nullptr;  // the slot's copy; null for a plain linear
        int64_t num_rows = 0, num_experts = 0, in_dim = 0, out_dim = 0;
        GemmPrecision precision =
            kFp32Gemm;  // the call's: W runs the weight gradient as B would have
        int64_t notice_begin = 0, notice_end = 0;
    };
    struct Slot {
        float* floats = nullptr;
        int64_t floats_used = 0;
        std::vector<int64_t> offsets;  // reserved to offsets_per_slot_, never grown
        std::vector<Deferred> gemms;   // and notices
    };
    // A copy of n floats of src in the deferring slot.
    const float* stash_floats(const float* src, int64_t n);
    // Whether a weight gradient into dweight waits for W now.
    bool defers(const float* dweight) const;

    Arena stash_;
    std::vector<Slot> slots_;
    int64_t floats_per_slot_ = 0, offsets_per_slot_ = 0, gemms_per_slot_ = 0;
    Slot* deferring_ = nullptr;
    const float* deferrable_begin_ = nullptr;  // null: every weight gradient
    const float* deferrable_end_ = nullptr;
};

}  // namespace moetron
