// Runs a step's micro-batches through this rank's pipeline stage, in a schedule's order
// (train/pipeline_schedule.h): each forward (of one of the stage's chunks: virtual stage
// chunk * pp + stage) takes one of the Model's activation sets and receives the stream from the
// previous virtual stage into it; each backward receives the gradient from the next virtual
// stage, and frees the set. With vpp chunks per stage the stream goes round the pipeline group
// vpp times: the last stage's chunk c feeds the first stage's chunk c + 1. Transfers are the
// pipeline group's send_async / recv_async, posted as early as their buffers allow, so that they
// fly while the stage computes: a forward's output and a backward's input gradient are sent without
// waiting, the gradient a backward will need is received from the moment its forward is done, and
// the next forward's input from the moment a set is free. Activations into virtual stage v travel
// with tag 2v, gradients into it with tag 2v + 1: each in micro-batch order on both sides, so the
// messages match. With MTP the first stage and the last (the MTP modules') both hold the embedding
// (Model::shares_embedding): after the step's last backward they exchange its gradient and each
// adds the other's, before the gradient sync, so the two copies stay one.
// With zb-h1 a backward is two actions: B (backward_input) runs the stage's backward while the
// model's SplitBackwardBackend queues the GEMMs' weight gradients into a stash slot, sends the
// input gradient and frees the activation set; W (backward_weight) replays that slot. The
// model's gradient-ready notices of the step's last B are queued with its weight gradients and
// delivered as the last W makes them true, so that the gradient sync still posts its buckets
// while the backward (that W) goes on.
// Everything is sized in the constructor; a step allocates nothing.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "moetron/core/trace.h"
#include "moetron/kernels/split_backward_backend.h"
#include "moetron/model/model.h"
#include "moetron/parallel/communicator.h"
#include "moetron/train/pipeline_schedule.h"

namespace moetron {

// Where a stage's step time went: computing its forwards and backwards, or waiting for its
// neighbours (the pipeline bubble and exposed transfers).
struct PipelineStageTimes {
    double busy_s = 0;
    double idle_s = 0;
};

class PipelineRunner {
  public:
    // model runs stage pp.rank() of pp.size() (ModelParallel::pipeline_chunks: vpp of them),
    // each chunk with at least the activation sets sets_needed() gives it. rows x seq_len: this
    // rank's micro-batch. recorder (may be null) gets a compute span per forward and backward.
    // split: the model's backend (ModelRuntime::backend) when kind splits the backwards (zb-h1),
    // else null; the constructor plans its stash, and routes the model's gradient-ready
    // callback (already set) through the runner.
    PipelineRunner(Model& model, parallel::Communicator& pp, PipelineScheduleKind kind,
                   int64_t micro_batches, int64_t rows, int64_t seq_len, TraceRecorder* recorder,
                   SplitBackwardBackend* split = nullptr);

    // One step: micro-batch i's rows start at tokens + i * micro_stride (and targets likewise),
    // normalized by den. before_last_backward runs just before the step's last backward (the
    // trainer arms its gradient synchronization there); with split backwards, just before the
    // step's last W (which delivers the last B's notices). Returns this stage's shares of the lm,
    // MTP and balance losses (the lm and MTP losses only on the last stage).
    std::array<double, 3> train_step(const int32_t* tokens, const int32_t* targets,
                                     int64_t micro_stride, const LossDenominators& den,
                                     const std::function<void()>& before_last_backward);
    // The forward of one micro-batch through every stage (validation); the losses on the last
    // stage, zeros elsewhere.
    MicroBatchLosses forward_only(const int32_t* tokens, const int32_t* targets);

    const std::vector<PipelineAction>& order() const { return order_; }
    // Bytes of the weight-gradient stash (zb-h1; 0 otherwise).
    size_t stash_bytes() const { return split_ != nullptr ? split_->stash_bytes() : 0; }
    PipelineStageTimes last_step_times() const { return times_; }

    // The activation sets each chunk of a stage of this schedule needs (for
    // ModelParallel::pipeline_in_flight).
    static std::vector<int64_t> sets_needed(PipelineScheduleKind kind, int64_t pp, int64_t stage,
                                            int64_t micro_batches, int64_t vpp);
    // The most floats of GEMM operands one micro-batch's B can queue for its W on this model's
    // stage, for tokens tokens per micro-batch (each GEMM weight's output gradient and input; for
    // the routed experts the most rows the EP group can send this rank).
    static int64_t stash_floats_per_micro_batch(const Model& model, int64_t tokens);

  private:
    bool first_stage() const { return pp_.rank() == 0; }
    bool last_stage() const { return pp_.rank() + 1 == pp_.size(); }
    int64_t virtual_stage(int64_t chunk) const { return chunk * pp_.size() + pp_.rank(); }
    bool first_virtual(int64_t chunk) const { return virtual_stage(chunk) == 0; }
    bool last_virtual(int64_t chunk) const { return virtual_stage(chunk) + 1 == num_virtual_; }
    int next_rank() const { return (pp_.rank() + 1) % pp_.size(); }
    int prev_rank() const { return (pp_.rank() + pp_.size() - 1) % pp_.size(); }
    static int activation_tag(int64_t into_virtual) { return static_cast<int>(2 * into_virtual); }
    static int gradient_tag(int64_t into_virtual) { return static_cast<int>(2 * into_virtual + 1); }
    int embedding_tag() const { return static_cast<int>(2 * num_virtual_); }
    int64_t& set_of(int64_t chunk, int64_t micro) {
        return set_of_[static_cast<size_t>(chunk * micro_batches_ + micro)];
    }
    // Takes a free set for forward number `index` of the order and posts the receive of its
    // input.
    void acquire_set(size_t index);
    // Acquires sets ahead for the coming forwards while free ones have no send in flight.
    void prefetch_inputs();
    void wait(parallel::CollectiveHandle& handle);
    void run_forward(const PipelineAction& action, const int32_t* tokens, const int32_t* targets,
                     int64_t micro_stride, const LossDenominators& den,
                     std::array<double, 3>& losses);
    // The backward (or, split, its B) of the action's micro-batch and chunk.
    void run_backward(const PipelineAction& action);
    // W: the weight gradients the micro-batch's B queued.
    void run_backward_weight(const PipelineAction& action);
    // The model's gradient-ready notice, with split backwards: queued during the step's last B,
    // else passed on.
    void on_grads_ready(int64_t begin, int64_t end);
    // The first and the MTP stage add each other's embedding gradient (Model::shares_embedding).
    void sum_shared_embedding_grads();

    Model& model_;
    parallel::Communicator& pp_;
    int64_t micro_batches_, vpp_, num_virtual_, rows_, seq_len_, numel_;
    TraceRecorder* recorder_;
    std::vector<PipelineAction> order_;
    std::vector<PipelineAction> forwards_;  // the forwards of order_, in order
    // Per (chunk, micro-batch): its activation set (-1 before its forward's set is taken).
    std::vector<int64_t> set_of_;
    std::vector<std::vector<int64_t>> free_sets_;  // per chunk, a stack
    size_t next_forward_ = 0;                      // the next of forwards_ to get a set
    // Per activation set: the transfers in flight from or into its buffers.
    struct SetTransfers {
        parallel::CollectiveHandle input_recv, output_send, grad_recv, grad_send;
    };
    std::vector<SetTransfers> transfers_;
    ParamEntry embedding_;               // the shared embedding's entry (numel 0: none)
    std::vector<float> embedding_grad_;  // the other stage's gradient of it
    PipelineStageTimes times_;
    SplitBackwardBackend* split_;
    int64_t stash_slots_ = 0;  // the ring of stash slots: B number k fills slot k % stash_slots_
    int64_t inputs_done_ = 0, weights_done_ = 0;  // this step's B's and W's
    bool defer_notices_ = false;                  // during the step's last B
    GradReadyCallback announce_;                  // the model's callback, as the caller set it
};

}  // namespace moetron
