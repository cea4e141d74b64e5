#include "moetron/train/pipeline_runner.h"

#include <algorithm>
#include <string>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"

namespace moetron {

namespace {

// The ranks the model's routed experts are split over (1 without expert parallelism).
int64_t expert_parallel_ranks(const Model& model) {
    const int64_t experts = model.config().n_routed_experts;
    const ExpertShard shard = model.expert_shard();
    const int64_t local = shard.local_experts(experts);
    return local > 0 ? shard.slots(experts) / local : 1;
}

}  // namespace

std::vector<int64_t> PipelineRunner::sets_needed(PipelineScheduleKind kind, int64_t pp,
                                                 int64_t stage, int64_t micro_batches,
                                                 int64_t vpp) {
    return max_in_flight_per_chunk(pipeline_order(kind, pp, stage, micro_batches, vpp), vpp);
}

PipelineRunner::PipelineRunner(Model& model, parallel::Communicator& pp, PipelineScheduleKind kind,
                               int64_t micro_batches, int64_t rows, int64_t seq_len,
                               TraceRecorder* recorder, SplitBackwardBackend* split)
    : model_(model),
      pp_(pp),
      micro_batches_(micro_batches),
      vpp_(static_cast<int64_t>(model.pipeline_chunks().size())),
      num_virtual_(vpp_ * pp.size()),
      rows_(rows),
      seq_len_(seq_len),
      numel_(model.stage_numel(rows, seq_len)),
      recorder_(recorder),
      order_(pipeline_order(kind, pp.size(), pp.rank(), micro_batches, vpp_)),
      set_of_(static_cast<size_t>(vpp_ * micro_batches), -1),
      split_(split) {
    for (const PipelineAction& a : order_)
        if (a.op == PipelineAction::Op::forward) forwards_.push_back(a);
    const std::vector<int64_t> needed = max_in_flight_per_chunk(order_, vpp_);
    int64_t sets = 0;
    free_sets_.resize(static_cast<size_t>(vpp_));
    for (int64_t c = 0; c < vpp_; ++c) {
        const Model::SetRange range = model.stage_sets(c);
        MT_CHECK(range.count >= needed[static_cast<size_t>(c)],
                 "[pipeline] chunk {} has {} activation sets, the schedule keeps {} in flight", c,
                 range.count, needed[static_cast<size_t>(c)]);
        for (int64_t s = range.first + range.count - 1; s >= range.first; --s)
            free_sets_[static_cast<size_t>(c)].push_back(s);
        sets = std::max(sets, range.first + range.count);
    }
    transfers_.resize(static_cast<size_t>(sets));
    if (model.shares_embedding()) {
        for (const ParamEntry& e : model.param_entries())
            if (e.name == "embed") embedding_ = e;
        MT_CHECK(embedding_.numel > 0, "[pipeline] a shared embedding without an 'embed' tensor");
        MT_CHECK(pp.size() > 1, "[pipeline] a shared embedding on a pipeline of one stage");
        embedding_grad_.resize(static_cast<size_t>(embedding_.numel));
    }
    stash_slots_ = max_weight_gradients_pending(order_);
    MT_CHECK((stash_slots_ > 0) == (split != nullptr),
             "[pipeline] the {} schedule {} split backwards, but the runner was given {}",
             pipeline_schedule_name(kind), stash_slots_ > 0 ? "has" : "has no",
             split != nullptr ? "a SplitBackwardBackend" : "none");
    MT_CHECK(split == nullptr || &model.backend() == split,
             "[pipeline] the split backward backend is not the model's backend");
    if (split != nullptr) {
        // GEMM calls per weight: two for kv_a_proj's parts; the routed experts' once per MoE
        // overlap half (2) or dispatch round (at most one per EP rank's share of the copies).
        const auto entries = static_cast<int64_t>(model.param_entries().size());
        const int64_t gemms = entries * 2 * std::max<int64_t>(2, expert_parallel_ranks(model));
        const int64_t local_experts =
            model.expert_shard().local_experts(model.config().n_routed_experts);
        split->plan_stash(stash_slots_, stash_floats_per_micro_batch(model, rows * seq_len),
                          gemms * (local_experts + 1), gemms + /*notices=*/entries);
        split->set_deferrable_gradients(model.grads(), model.num_params());
        announce_ = model.grad_ready_callback();
        model.set_grad_ready_callback(
            [this](int64_t begin, int64_t end) { on_grads_ready(begin, end); });
    }
}

int64_t PipelineRunner::stash_floats_per_micro_batch(const Model& model, int64_t tokens) {
    const ModelConfig& c = model.config();
    const int64_t local_experts = model.expert_shard().local_experts(c.n_routed_experts);
    // Each token sends at most one copy to each expert it picks: min(K, El) to this rank, from
    // each rank of the EP group.
    const int64_t expert_rows =
        expert_parallel_ranks(model) * tokens * std::min(c.num_experts_per_tok, local_experts);
    int64_t floats = 0;
    for (const ParamEntry& e : model.param_entries()) {
        const std::string& n = e.name;
        // Kept in B: not GEMMs (norms, biases, the embedding), or high precision (router, head).
        if (e.shape.ndim < 2 || n == "embed" || n.ends_with("head") || n.ends_with("router"))
            continue;
        const int64_t out_dim = e.shape.dims[static_cast<size_t>(e.shape.ndim) - 2];
        const int64_t in_dim = e.shape.dims[static_cast<size_t>(e.shape.ndim) - 1];
        // kv_a_proj's two parts (latent, rope key) are two calls, each with the whole input.
        const int64_t calls = n.ends_with("kv_a_proj") ? 2 : 1;
        floats += e.shape.ndim == 3 ? expert_rows * (out_dim + in_dim)
                                    : tokens * (out_dim + calls * in_dim);
    }
    return floats;
}

void PipelineRunner::wait(parallel::CollectiveHandle& handle) {
    if (!handle.pending()) return;
    const double begin_s = Timer::now_s();
    handle.wait();
    times_.idle_s += Timer::now_s() - begin_s;
}

void PipelineRunner::acquire_set(size_t index) {
    const PipelineAction& f = forwards_[index];
    std::vector<int64_t>& free = free_sets_[static_cast<size_t>(f.chunk)];
    MT_CHECK(!free.empty(),
             "[pipeline] stage {}: no free activation set for micro-batch {} of chunk {}",
             pp_.rank(), f.micro_batch, f.chunk);
    const int64_t set = free.back();
    free.pop_back();
    set_of(f.chunk, f.micro_batch) = set;
    SetTransfers& t = transfers_[static_cast<size_t>(set)];
    // The set's buffers are rewritten from here on: its last micro-batch's sends must be done.
    wait(t.output_send);
    wait(t.grad_send);
    if (!first_virtual(f.chunk))
        t.input_recv = pp_.recv_async(model_.stage_input(f.chunk, set), static_cast<size_t>(numel_),
                                      DType::f32, prev_rank(),
                                      activation_tag(virtual_stage(f.chunk)), kHostStream);
}

void PipelineRunner::prefetch_inputs() {
    while (next_forward_ < forwards_.size()) {
        const std::vector<int64_t>& free =
            free_sets_[static_cast<size_t>(forwards_[next_forward_].chunk)];
        if (free.empty()) return;
        SetTransfers& t = transfers_[static_cast<size_t>(free.back())];
        // Never block here: waiting on a send could wait for a neighbour that waits for us.
        if ((t.output_send.pending() && !t.output_send.test()) ||
            (t.grad_send.pending() && !t.grad_send.test()))
            return;
        acquire_set(next_forward_++);
    }
}

void PipelineRunner::run_forward(const PipelineAction& action, const int32_t* tokens,
                                 const int32_t* targets, int64_t micro_stride,
                                 const LossDenominators& den, std::array<double, 3>& losses) {
    const int64_t micro = action.micro_batch, chunk = action.chunk;
    if (set_of(chunk, micro) < 0) {
        MT_CHECK(forwards_[next_forward_] == action,
                 "[pipeline] forwards out of the schedule's order");
        acquire_set(next_forward_++);
    }
    const int64_t set = set_of(chunk, micro);
    SetTransfers& t = transfers_[static_cast<size_t>(set)];
    wait(t.input_recv);
    const double begin_s = Timer::now_s();
    MicroBatchLosses l;
    {
        const TraceScope scope(recorder_, "pipeline forward");
        l = model_.stage_forward(chunk, set, tokens + micro * micro_stride,
                                 targets + micro * micro_stride, rows_, seq_len_, &den);
    }
    times_.busy_s += Timer::now_s() - begin_s;
    losses[0] += l.lm_loss;
    losses[1] += l.mtp_loss;
    losses[2] += l.balance_loss;
    if (!last_virtual(chunk)) {
        const int64_t v = virtual_stage(chunk);
        t.output_send = pp_.send_async(model_.stage_output(chunk, set), static_cast<size_t>(numel_),
                                       DType::f32, next_rank(), activation_tag(v + 1), kHostStream);
        t.grad_recv = pp_.recv_async(model_.stage_grad(set), static_cast<size_t>(numel_),
                                     DType::f32, next_rank(), gradient_tag(v), kHostStream);
    }
}

void PipelineRunner::run_backward(const PipelineAction& action) {
    const int64_t micro = action.micro_batch, chunk = action.chunk;
    const int64_t set = set_of(chunk, micro);
    MT_CHECK(set >= 0, "[pipeline] backward of micro-batch {} of chunk {} before its forward",
             micro, chunk);
    SetTransfers& t = transfers_[static_cast<size_t>(set)];
    wait(t.grad_recv);
    const bool split = action.op == PipelineAction::Op::backward_input;
    const double begin_s = Timer::now_s();
    {
        const TraceScope scope(recorder_, split ? "pipeline backward (B)" : "pipeline backward");
        if (split) {
            defer_notices_ = inputs_done_ + 1 == micro_batches_ * vpp_;
            split_->defer_into(inputs_done_++ % stash_slots_);
        }
        model_.stage_backward(set);
        if (split) {
            split_->stop_deferring();
            defer_notices_ = false;
        }
    }
    times_.busy_s += Timer::now_s() - begin_s;
    if (!first_virtual(chunk))
        t.grad_send =
            pp_.send_async(model_.stage_grad(set), static_cast<size_t>(numel_), DType::f32,
                           prev_rank(), gradient_tag(virtual_stage(chunk) - 1), kHostStream);
    free_sets_[static_cast<size_t>(chunk)].push_back(set);
}

void PipelineRunner::on_grads_ready(int64_t begin, int64_t end) {
    if (defer_notices_)
        split_->defer_notice(begin, end);
    else if (announce_)
        announce_(begin, end);
}

void PipelineRunner::run_backward_weight(const PipelineAction& action) {
    MT_CHECK(weights_done_ < inputs_done_, "[pipeline] W of micro-batch {} before its B",
             action.micro_batch);
    const double begin_s = Timer::now_s();
    {
        const TraceScope scope(recorder_, "pipeline backward (W)");
        split_->run_deferred(weights_done_++ % stash_slots_, announce_);
    }
    times_.busy_s += Timer::now_s() - begin_s;
}

std::array<double, 3> PipelineRunner::train_step(
    const int32_t* tokens, const int32_t* targets, int64_t micro_stride,
    const LossDenominators& den, const std::function<void()>& before_last_backward) {
    using Op = PipelineAction::Op;
    times_ = {};
    std::array<double, 3> losses{};
    std::fill(set_of_.begin(), set_of_.end(), -1);
    next_forward_ = 0;
    inputs_done_ = 0;
    weights_done_ = 0;
    // Where the gradients become final (the sync is armed just before): the last backward, or
    // with split backwards the last W, which delivers the last B's notices.
    const Op finishing_op = split_ != nullptr ? Op::backward_weight : Op::backward;
    int64_t remaining_finishing = 0;
    for (const PipelineAction& a : order_) remaining_finishing += a.op == finishing_op ? 1 : 0;
    for (const PipelineAction& action : order_) {
        const bool last = action.op == finishing_op && --remaining_finishing == 0;
        if (last && before_last_backward) before_last_backward();
        switch (action.op) {
            case Op::forward:
                run_forward(action, tokens, targets, micro_stride, den, losses);
                break;
            case Op::backward:
            case Op::backward_input:
                run_backward(action);
                break;
            case Op::backward_weight:
                run_backward_weight(action);
                break;
        }
        prefetch_inputs();
    }
    // The step's last sends must land before the optimizer and the next step touch anything.
    for (SetTransfers& t : transfers_) {
        wait(t.output_send);
        wait(t.grad_send);
    }
    if (embedding_.numel > 0) sum_shared_embedding_grads();
    return losses;
}

void PipelineRunner::sum_shared_embedding_grads() {
    const int peer = first_stage() ? pp_.size() - 1 : 0;
    float* grad = model_.grads() + embedding_.offset;
    const auto n = static_cast<size_t>(embedding_.numel);
    parallel::CollectiveHandle recv =
        pp_.recv_async(embedding_grad_.data(), n, DType::f32, peer, embedding_tag(), kHostStream);
    parallel::CollectiveHandle send =
        pp_.send_async(grad, n, DType::f32, peer, embedding_tag(), kHostStream);
    wait(recv);
    wait(send);
    // a + b == b + a in floating point: both copies get the same sum.
    model_.backend().add_inplace(grad, embedding_grad_.data(), embedding_.numel);
}

MicroBatchLosses PipelineRunner::forward_only(const int32_t* tokens, const int32_t* targets) {
    MicroBatchLosses total;
    // Through the virtual stages in order: this rank's chunk c waits for virtual stage
    // c * pp + stage - 1, so the ranks take turns along the chain. Each chunk uses its first set.
    for (int64_t chunk = 0; chunk < vpp_; ++chunk) {
        const int64_t v = virtual_stage(chunk);
        const Model::SetRange sets = model_.stage_sets(chunk);
        MT_CHECK(free_sets_[static_cast<size_t>(chunk)].size() == static_cast<size_t>(sets.count),
                 "[pipeline] forward_only in the middle of a step");
        SetTransfers& t = transfers_[static_cast<size_t>(sets.first)];
        wait(t.output_send);
        wait(t.grad_send);
        if (!first_virtual(chunk)) {
            t.input_recv =
                pp_.recv_async(model_.stage_input(chunk, sets.first), static_cast<size_t>(numel_),
                               DType::f32, prev_rank(), activation_tag(v), kHostStream);
            wait(t.input_recv);
        }
        const MicroBatchLosses l = model_.stage_forward(chunk, sets.first, tokens, targets, rows_,
                                                        seq_len_, /*denominators=*/nullptr);
        total.lm_loss += l.lm_loss;
        total.mtp_loss += l.mtp_loss;
        total.balance_loss += l.balance_loss;
        total.num_tokens += l.num_tokens;
        if (!last_virtual(chunk)) {
            t.output_send =
                pp_.send_async(model_.stage_output(chunk, sets.first), static_cast<size_t>(numel_),
                               DType::f32, next_rank(), activation_tag(v + 1), kHostStream);
            wait(t.output_send);
        }
    }
    return total;
}

}  // namespace moetron
