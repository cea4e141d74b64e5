#include "moetron/parallel/traced_communicator.h"

#include <cmath>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"

namespace moetron::parallel {

std::string_view traffic_class_name(TrafficClass traffic) {
    switch (traffic) {
        case TrafficClass::expert_dispatch:
            return "expert_dispatch";
        case TrafficClass::tensor_parallel:
            return "tensor_parallel";
        case TrafficClass::data_parallel:
            return "data_parallel";
        case TrafficClass::other:
            return "other";
    }
    return "unknown";
}

TrafficClass traffic_class_of(GroupKind kind) {
    switch (kind) {
        case GroupKind::ep:
        case GroupKind::ep_domain:
        case GroupKind::ep_rail:
            return TrafficClass::expert_dispatch;
        case GroupKind::tp:
            return TrafficClass::tensor_parallel;
        case GroupKind::dp:
        case GroupKind::edp:
            return TrafficClass::data_parallel;
        case GroupKind::cp:
        case GroupKind::pp:
        case GroupKind::rail:  // the world's rail; the dispatch uses the EP group's (ep_rail)
            return TrafficClass::other;
    }
    return TrafficClass::other;
}

double CommWaitTotals::total_s() const {
    double total = 0;
    for (const double s : blocked_s) total += s;
    return total;
}

// The handle side of a traced asynchronous collective: completes the inner handle, then charges
// the blocked time and records the spans.
class TracedPending final : public PendingCollective {
  public:
    TracedPending(CollectiveHandle inner, TracedCommunicator& comm,
                  TracedCommunicator::CallRecord call)
        : inner_(std::move(inner)), comm_(comm), call_(call) {}

    bool test() override {
        if (!inner_.test()) return false;
        record(Timer::now_s(), Timer::now_s());
        return true;
    }

    void wait() override {
        const double wait_begin_s = Timer::now_s();
        inner_.wait();
        record(wait_begin_s, Timer::now_s());
    }

    double completed_at_s() const override { return completed_s_; }

  private:
    void record(double wait_begin_s, double wait_end_s) {
        completed_s_ = std::isnan(inner_.completed_at_s()) ? wait_end_s : inner_.completed_at_s();
        (*comm_.totals_)[comm_.traffic_] += wait_end_s - wait_begin_s;
        if (comm_.recorder_ == nullptr) return;
        const char* name = collective_name(call_.kind).data();
        comm_.recorder_->record({.name = name,
                                 .group = comm_.name().c_str(),
                                 .track = TraceTrack::communication,
                                 .begin_s = call_.posted_s,
                                 .end_s = completed_s_,
                                 .bytes = call_.bytes});
        if (wait_end_s > wait_begin_s)
            comm_.recorder_->record({.name = name,
                                     .group = comm_.name().c_str(),
                                     .track = TraceTrack::waiting,
                                     .begin_s = wait_begin_s,
                                     .end_s = wait_end_s,
                                     .bytes = call_.bytes});
    }

    CollectiveHandle inner_;
    TracedCommunicator& comm_;
    TracedCommunicator::CallRecord call_;
    double completed_s_ = 0;
};

TracedCommunicator::TracedCommunicator(std::unique_ptr<Communicator> inner, TrafficClass traffic,
                                       CommWaitTotals* totals, TraceRecorder* recorder)
    : inner_(std::move(inner)), traffic_(traffic), totals_(totals), recorder_(recorder) {
    MT_CHECK(inner_ != nullptr && totals_ != nullptr,
             "[trace] a traced communicator needs a group and a totals record");
}

TracedCommunicator::CallRecord TracedCommunicator::start(CollectiveKind kind) const {
    // bytes holds the counter before the call until bytes_since() turns it into the call's share.
    return {kind, Timer::now_s(), inner_->counters(kind).payload_bytes};
}

uint64_t TracedCommunicator::bytes_since(const CallRecord& call) const {
    return inner_->counters(call.kind).payload_bytes - call.bytes;
}

CollectiveHandle TracedCommunicator::wrap(CollectiveHandle handle, const CallRecord& call) {
    CallRecord done = call;
    done.bytes = bytes_since(call);
    return CollectiveHandle(std::make_unique<TracedPending>(std::move(handle), *this, done));
}

void TracedCommunicator::finish_blocking(const CallRecord& call) {
    const double end_s = Timer::now_s();
    (*totals_)[traffic_] += end_s - call.posted_s;
    if (recorder_ == nullptr || !recorder_->enabled()) return;
    const char* name = collective_name(call.kind).data();
    const uint64_t bytes = bytes_since(call);
    for (const TraceTrack track : {TraceTrack::communication, TraceTrack::waiting})
        recorder_->record({.name = name,
                           .group = inner_->name().c_str(),
                           .track = track,
                           .begin_s = call.posted_s,
                           .end_s = end_s,
                           .bytes = bytes});
}

CollectiveHandle TracedCommunicator::all_reduce_sum_async(void* data, size_t count, DType dtype,
                                                          Stream stream) {
    const CallRecord call = start(CollectiveKind::all_reduce);
    return wrap(inner_->all_reduce_sum_async(data, count, dtype, stream), call);
}

CollectiveHandle TracedCommunicator::reduce_scatter_sum_async(void* out, const void* inp,
                                                              size_t count, DType dtype,
                                                              Stream stream) {
    const CallRecord call = start(CollectiveKind::reduce_scatter);
    return wrap(inner_->reduce_scatter_sum_async(out, inp, count, dtype, stream), call);
}

CollectiveHandle TracedCommunicator::all_gather_async(void* out, const void* inp, size_t count,
                                                      DType dtype, Stream stream) {
    const CallRecord call = start(CollectiveKind::all_gather);
    return wrap(inner_->all_gather_async(out, inp, count, dtype, stream), call);
}

CollectiveHandle TracedCommunicator::all_to_all_v_async(
    void* recv, std::span<const int> recv_counts, std::span<const int> recv_displs,
    const void* send, std::span<const int> send_counts, std::span<const int> send_displs,
    DType dtype, Stream stream) {
    const CallRecord call = start(CollectiveKind::all_to_all);
    return wrap(inner_->all_to_all_v_async(recv, recv_counts, recv_displs, send, send_counts,
                                           send_displs, dtype, stream),
                call);
}

CollectiveHandle TracedCommunicator::broadcast_async(void* data, size_t count, DType dtype,
                                                     int root, Stream stream) {
    const CallRecord call = start(CollectiveKind::broadcast);
    return wrap(inner_->broadcast_async(data, count, dtype, root, stream), call);
}

CollectiveHandle TracedCommunicator::barrier_async() {
    const CallRecord call = start(CollectiveKind::barrier);
    return wrap(inner_->barrier_async(), call);
}

CollectiveHandle TracedCommunicator::send_async(const void* data, size_t count, DType dtype,
                                                int peer, int tag, Stream stream) {
    const CallRecord call = start(CollectiveKind::send_recv);
    return wrap(inner_->send_async(data, count, dtype, peer, tag, stream), call);
}

CollectiveHandle TracedCommunicator::recv_async(void* data, size_t count, DType dtype, int peer,
                                                int tag, Stream stream) {
    const CallRecord call = start(CollectiveKind::send_recv);
    return wrap(inner_->recv_async(data, count, dtype, peer, tag, stream), call);
}

void TracedCommunicator::all_reduce_sum(void* data, size_t count, DType dtype, Stream stream) {
    const CallRecord call = start(CollectiveKind::all_reduce);
    inner_->all_reduce_sum(data, count, dtype, stream);
    finish_blocking(call);
}

void TracedCommunicator::reduce_scatter_sum(void* out, const void* inp, size_t count, DType dtype,
                                            Stream stream) {
    const CallRecord call = start(CollectiveKind::reduce_scatter);
    inner_->reduce_scatter_sum(out, inp, count, dtype, stream);
    finish_blocking(call);
}

void TracedCommunicator::all_gather(void* out, const void* inp, size_t count, DType dtype,
                                    Stream stream) {
    const CallRecord call = start(CollectiveKind::all_gather);
    inner_->all_gather(out, inp, count, dtype, stream);
    finish_blocking(call);
}

void TracedCommunicator::all_to_all_v(void* recv, std::span<const int> recv_counts,
                                      std::span<const int> recv_displs, const void* send,
                                      std::span<const int> send_counts,
                                      std::span<const int> send_displs, DType dtype,
                                      Stream stream) {
    const CallRecord call = start(CollectiveKind::all_to_all);
    inner_->all_to_all_v(recv, recv_counts, recv_displs, send, send_counts, send_displs, dtype,
                         stream);
    finish_blocking(call);
}

void TracedCommunicator::broadcast(void* data, size_t count, DType dtype, int root, Stream stream) {
    const CallRecord call = start(CollectiveKind::broadcast);
    inner_->broadcast(data, count, dtype, root, stream);
    finish_blocking(call);
}

void TracedCommunicator::barrier() {
    const CallRecord call = start(CollectiveKind::barrier);
    inner_->barrier();
    finish_blocking(call);
}

std::unique_ptr<Communicator> TracedCommunicator::split(int color, int key, std::string name) {
    return std::make_unique<TracedCommunicator>(inner_->split(color, key, std::move(name)),
                                                traffic_, totals_, recorder_);
}

void trace_groups(ParallelGroups& groups, CommWaitTotals* totals, TraceRecorder* recorder) {
    for (const GroupKind kind : kAllGroupKinds) {
        std::unique_ptr<Communicator>& slot = groups.slot(kind);
        if (slot != nullptr)
            slot = std::make_unique<TracedCommunicator>(std::move(slot), traffic_class_of(kind),
                                                        totals, recorder);
    }
}

std::array<uint64_t, kNumCollectiveKinds> payload_bytes_by_kind(ParallelGroups& groups) {
    std::array<uint64_t, kNumCollectiveKinds> bytes{};
    for (const GroupKind kind : kAllGroupKinds) {
        const std::unique_ptr<Communicator>& slot = groups.slot(kind);
        if (slot == nullptr) continue;
        for (size_t k = 0; k < kNumCollectiveKinds; ++k)
            bytes[k] += slot->counters(static_cast<CollectiveKind>(k)).payload_bytes;
    }
    return bytes;
}

void reset_group_counters(ParallelGroups& groups) {
    for (const GroupKind kind : kAllGroupKinds)
        if (groups.slot(kind) != nullptr) groups.slot(kind)->reset_counters();
}

}  // namespace moetron::parallel
