// TracedCommunicator: a Communicator that forwards every call to another one and measures it.
// Per step it adds up how long the calling thread was blocked in collectives, by traffic class
// (the metrics' "time in dispatch/combine, TP collectives, data-parallel sync"); while a
// TraceRecorder records, it also logs each collective's span from post to completion on the
// communication track and each blocked interval on the waiting track (core/trace.h).
//
// A blocking collective blocks for its whole duration; an asynchronous one only inside wait()
// (or not at all, if test() saw it complete), which is exactly the part overlap did not hide.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "moetron/core/trace.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/topology.h"

namespace moetron::parallel {

enum class TrafficClass : uint8_t {
    expert_dispatch,  // EP groups: dispatch and combine
    tensor_parallel,  // TP groups
    data_parallel,    // DP and EDP groups: gradient sync, ZeRO-1 gathers, loss sums
    other,
};
inline constexpr size_t kNumTrafficClasses = 4;
std::string_view traffic_class_name(TrafficClass traffic);
TrafficClass traffic_class_of(GroupKind kind);

// Seconds the calling thread spent blocked in collectives, per traffic class; the owner zeroes
// it at the start of each step.
struct CommWaitTotals {
    std::array<double, kNumTrafficClasses> blocked_s{};
    double& operator[](TrafficClass t) { return blocked_s[static_cast<size_t>(t)]; }
    double operator[](TrafficClass t) const { return blocked_s[static_cast<size_t>(t)]; }
    double total_s() const;
};

class TracedCommunicator final : public Communicator {
  public:
    // totals and recorder must outlive this object (and the groups it splits); recorder may be
    // null (no timeline).
    TracedCommunicator(std::unique_ptr<Communicator> inner, TrafficClass traffic,
                       CommWaitTotals* totals, TraceRecorder* recorder);

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    const std::string& name() const override { return inner_->name(); }
    bool progress_thread_active() const override { return inner_->progress_thread_active(); }
    Communicator& inner() { return *inner_; }

    // Each call forwards its stream to the inner communicator.
    CollectiveHandle all_reduce_sum_async(void* data, size_t count, DType dtype,
                                          Stream stream) override;
    CollectiveHandle reduce_scatter_sum_async(void* out, const void* inp, size_t count, DType dtype,
                                              Stream stream) override;
    CollectiveHandle all_gather_async(void* out, const void* inp, size_t count, DType dtype,
                                      Stream stream) override;
    CollectiveHandle all_to_all_v_async(void* recv, std::span<const int> recv_counts,
                                        std::span<const int> recv_displs, const void* send,
                                        std::span<const int> send_counts,
                                        std::span<const int> send_displs, DType dtype,
                                        Stream stream) override;
    CollectiveHandle broadcast_async(void* data, size_t count, DType dtype, int root,
                                     Stream stream) override;
    CollectiveHandle barrier_async() override;
    CollectiveHandle send_async(const void* data, size_t count, DType dtype, int peer, int tag,
                                Stream stream) override;
    CollectiveHandle recv_async(void* data, size_t count, DType dtype, int peer, int tag,
                                Stream stream) override;

    void all_reduce_sum(void* data, size_t count, DType dtype, Stream stream) override;
    void reduce_scatter_sum(void* out, const void* inp, size_t count, DType dtype,
                            Stream stream) override;
    void all_gather(void* out, const void* inp, size_t count, DType dtype, Stream stream) override;
    void all_to_all_v(void* recv, std::span<const int> recv_counts,
                      std::span<const int> recv_displs, const void* send,
                      std::span<const int> send_counts, std::span<const int> send_displs,
                      DType dtype, Stream stream) override;
    void broadcast(void* data, size_t count, DType dtype, int root, Stream stream) override;
    void barrier() override;

    // The new group is traced the same way, in the same traffic class.
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

    const CollectiveCounters& counters(CollectiveKind kind) const override {
        return inner_->counters(kind);
    }
    void reset_counters() override { inner_->reset_counters(); }

  private:
    // What every traced call needs to record itself once it is complete.
    struct CallRecord {
        CollectiveKind kind;
        double posted_s;
        uint64_t bytes;
    };
    CallRecord start(CollectiveKind kind) const;
    uint64_t bytes_since(const CallRecord& call) const;
    CollectiveHandle wrap(CollectiveHandle handle, const CallRecord& call);
    void finish_blocking(const CallRecord& call);

    std::unique_ptr<Communicator> inner_;
    TrafficClass traffic_;
    CommWaitTotals* totals_;
    TraceRecorder* recorder_;

    friend class TracedPending;
};

// Replaces every group in groups with a TracedCommunicator around it, classed by its kind.
void trace_groups(ParallelGroups& groups, CommWaitTotals* totals, TraceRecorder* recorder);

// Per-kind payload bytes of every group in groups since their counters were last reset.
std::array<uint64_t, kNumCollectiveKinds> payload_bytes_by_kind(ParallelGroups& groups);
void reset_group_counters(ParallelGroups& groups);

}  // namespace moetron::parallel
