// The MPI implementation of Communicator: host buffers, any MPI launcher (mpirun, srun). Every
// collective is MPI's nonblocking one (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather,
// MPI_Ialltoallv, MPI_Ibcast, MPI_Ibarrier), so that one code path serves the async forms, the
// blocking forms and the timeout. Most code should hold a Communicator& and never include this.
#pragma once

#include <mpi.h>

#include <array>
#include <memory>
#include <string>

#include "moetron/parallel/communicator.h"
#include "moetron/parallel/mpi_liveness.h"
#include "moetron/parallel/mpi_progress.h"

namespace moetron::parallel {

class MpiCommunicator final : public Communicator {
  public:
    // Takes ownership of comm (freed by the destructor) and sets MPI_ERRORS_RETURN on it. The
    // progress engine and the liveness probe are the world's, shared by every group split from
    // it; a timed-out collective asks the probe which ranks stopped answering.
    MpiCommunicator(MPI_Comm comm, std::string name, const CommunicatorOptions& options,
                    std::shared_ptr<MpiProgressEngine> progress,
                    std::shared_ptr<MpiLivenessProbe> liveness);
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    MPI_Comm comm() const { return comm_; }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const std::string& name() const override { return name_; }
    bool progress_thread_active() const override { return progress_->thread_running(); }

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
    // MPI_Isend / MPI_Irecv, driven by the progress thread like the collectives.
    CollectiveHandle send_async(const void* data, size_t count, DType dtype, int peer, int tag,
                                Stream stream) override;
    CollectiveHandle recv_async(void* data, size_t count, DType dtype, int peer, int tag,
                                Stream stream) override;

    // Blocking forms: posted and waited for by the caller alone, never handed to the progress
    // thread (nothing to overlap, and waking it would only cost the caller time).
    using Communicator::all_gather;
    using Communicator::all_reduce_sum;
    using Communicator::all_to_all_v;
    void all_reduce_sum(void* data, size_t count, DType dtype, Stream stream) override {
        post_all_reduce(data, count, dtype, stream, Progress::caller).wait();
    }
    void reduce_scatter_sum(void* out, const void* inp, size_t count, DType dtype,
                            Stream stream) override {
        post_reduce_scatter(out, inp, count, dtype, stream, Progress::caller).wait();
    }
    void all_gather(void* out, const void* inp, size_t count, DType dtype, Stream stream) override {
        post_all_gather(out, inp, count, dtype, stream, Progress::caller).wait();
    }
    void all_to_all_v(void* recv, std::span<const int> recv_counts,
                      std::span<const int> recv_displs, const void* send,
                      std::span<const int> send_counts, std::span<const int> send_displs,
                      DType dtype, Stream stream) override {
        post_all_to_all_v(recv, recv_counts, recv_displs, send, send_counts, send_displs, dtype,
                          stream, Progress::caller)
            .wait();
    }
    void broadcast(void* data, size_t count, DType dtype, int root, Stream stream) override {
        post_broadcast(data, count, dtype, root, stream, Progress::caller).wait();
    }
    void barrier() override { post_barrier(Progress::caller).wait(); }

    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

    const CollectiveCounters& counters(CollectiveKind kind) const override {
        return counters_[static_cast<size_t>(kind)];
    }
    void reset_counters() override { counters_ = {}; }

  private:
    // Who drives a posted request: the progress thread (async forms) or only the caller's wait.
    enum class Progress { background, caller };

    CollectiveHandle post_all_reduce(void* data, size_t count, DType dtype, Stream stream,
                                     Progress progress);
    CollectiveHandle post_reduce_scatter(void* out, const void* inp, size_t count, DType dtype,
                                         Stream stream, Progress progress);
    CollectiveHandle post_all_gather(void* out, const void* inp, size_t count, DType dtype,
                                     Stream stream, Progress progress);
    CollectiveHandle post_all_to_all_v(void* recv, std::span<const int> recv_counts,
                                       std::span<const int> recv_displs, const void* send,
                                       std::span<const int> send_counts,
                                       std::span<const int> send_displs, DType dtype, Stream stream,
                                       Progress progress);
    CollectiveHandle post_broadcast(void* data, size_t count, DType dtype, int root, Stream stream,
                                    Progress progress);
    CollectiveHandle post_barrier(Progress progress);

    // Wraps a posted request into a handle (and gives it to the progress thread if asked).
    CollectiveHandle track(CollectiveKind kind, std::shared_ptr<MpiOperation> op,
                           Progress progress);
    int checked_count(CollectiveKind kind, size_t count) const;

    MPI_Comm comm_;
    std::string name_;
    int rank_ = 0;
    int size_ = 1;
    CommunicatorOptions options_;
    std::shared_ptr<MpiProgressEngine> progress_;
    std::shared_ptr<MpiLivenessProbe> liveness_;
    std::array<CollectiveCounters, kNumCollectiveKinds> counters_{};
};

// MPI's datatype for a moetron dtype (bf16 travels as 16-bit unsigned words: movement only).
MPI_Datatype mpi_datatype(DType dtype);

}  // namespace moetron::parallel
