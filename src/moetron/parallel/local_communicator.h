// A group of one process: every collective is a local copy (or nothing) and completes at once.
// It lets single-process runs and tests use the same code paths as a distributed job, and works in
// builds without MPI.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "moetron/parallel/communicator.h"

namespace moetron::parallel {

class LocalCommunicator final : public Communicator {
  public:
    explicit LocalCommunicator(std::string name = "world") : name_(std::move(name)) {}

    int rank() const override { return 0; }
    int size() const override { return 1; }
    const std::string& name() const override { return name_; }
    bool progress_thread_active() const override { return false; }

    // Host buffers only: every data-moving call checks that its stream is a host stream.
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
    // A group of one has no other rank to talk to: both throw (check_peer).
    CollectiveHandle send_async(const void* data, size_t count, DType dtype, int peer, int tag,
                                Stream stream) override;
    CollectiveHandle recv_async(void* data, size_t count, DType dtype, int peer, int tag,
                                Stream stream) override;

    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

    const CollectiveCounters& counters(CollectiveKind kind) const override {
        return counters_[static_cast<size_t>(kind)];
    }
    void reset_counters() override { counters_ = {}; }

  private:
    CollectiveCounters& counter(CollectiveKind kind) {
        return counters_[static_cast<size_t>(kind)];
    }

    std::string name_;
    std::array<CollectiveCounters, kNumCollectiveKinds> counters_{};
};

}  // namespace moetron::parallel
