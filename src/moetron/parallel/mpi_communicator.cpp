#include "moetron/parallel/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/parallel/mpi_check.h"

namespace moetron::parallel {

namespace {

constexpr double kMaxCountedPollGapS = 1.0;

// The handle's side of one MPI request: waits for it (polling, so that a timeout can fire) and
// names the collective, group and rank when it does not finish.
class MpiPendingCollective final : public PendingCollective {
  public:
    MpiPendingCollective(std::shared_ptr<MpiOperation> op,
                         std::shared_ptr<MpiProgressEngine> progress,
                         std::shared_ptr<MpiLivenessProbe> liveness, CollectiveKind kind,
                         std::string group, int rank, int size, double timeout_s)
        : op_(std::move(op)),
          progress_(std::move(progress)),
          liveness_(std::move(liveness)),
          kind_(kind),
          group_(std::move(group)),
          rank_(rank),
          size_(size),
          timeout_s_(timeout_s) {}

    bool test() override {
        if (!try_complete(*op_)) return false;
        throw_if_failed();
        return true;
    }

    void wait() override {
        if (!try_complete(*op_)) poll_until_complete();
        throw_if_failed();
    }

    double completed_at_s() const override { return op_->completed_at_s; }

    void abandon() noexcept override { progress_->abandon(); }

  private:
    void poll_until_complete() {
        struct WaitScope {
            MpiProgressEngine& engine;
            explicit WaitScope(MpiProgressEngine& e) : engine(e) { engine.begin_wait(); }
            ~WaitScope() { engine.end_wait(); }
        } scope(*progress_);
        // The time this rank spent waiting, not the wall time: a gap between two polls longer than
        // kMaxCountedPollGapS means this process itself was stopped (SIGSTOP, a debugger) or
        // starved, and a rank resumed after a stop must not blame the others for its own pause.
        double waited_s = 0;
        double last_poll_s = Timer::now_s();
        while (!try_complete(*op_)) {
            const double now_s = Timer::now_s();
            waited_s += std::min(now_s - last_poll_s, kMaxCountedPollGapS);
            last_poll_s = now_s;
            MT_CHECK(!progress_->abandoned(),
                     "[{}] group '{}' (rank {} of {}): abandoned, since another collective of the "
                     "job timed out",
                     collective_name(kind_), group_, rank_, size_);
            if (waited_s > timeout_s_) {
                const double window_s = MpiLivenessProbe::window_for_timeout(timeout_s_);
                const std::vector<int> silent = liveness_->silent_ranks(window_s);
                progress_->abandon();
                MT_THROW(
                    "[{}] group '{}' (rank {} of {}; world rank {}) did not finish within {} "
                    "s: {}",
                    collective_name(kind_), group_, rank_, size_, liveness_->world_rank(),
                    timeout_s_, describe_silent_ranks(silent, window_s));
            }
            // Yielding keeps oversubscribed ranks (more ranks than cores) moving.
            std::this_thread::yield();
        }
    }

    void throw_if_failed() const {
        MT_CHECK(op_->error.empty(), "[{}] group '{}' (rank {} of {}): {}", collective_name(kind_),
                 group_, rank_, size_, op_->error);
    }

    std::shared_ptr<MpiOperation> op_;
    std::shared_ptr<MpiProgressEngine> progress_;
    std::shared_ptr<MpiLivenessProbe> liveness_;
    CollectiveKind kind_;
    std::string group_;
    int rank_;
    int size_;
    double timeout_s_;
};

const char* thread_level_name(int level) {
    switch (level) {
        case MPI_THREAD_SINGLE:
            return "MPI_THREAD_SINGLE";
        case MPI_THREAD_FUNNELED:
            return "MPI_THREAD_FUNNELED";
        case MPI_THREAD_SERIALIZED:
            return "MPI_THREAD_SERIALIZED";
        case MPI_THREAD_MULTIPLE:
            return "MPI_THREAD_MULTIPLE";
        default:
            return "an unknown thread level";
    }
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
    switch (dtype) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::f64:
            return MPI_DOUBLE;
        case DType::bf16:
            return MPI_UINT16_T;
        case DType::i32:
            return MPI_INT32_T;
        case DType::i64:
            return MPI_INT64_T;
        case DType::u8:
            return MPI_BYTE;
    }
    MT_THROW("[mpi] no MPI datatype for dtype {}", static_cast<int>(dtype));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 const CommunicatorOptions& options,
                                 std::shared_ptr<MpiProgressEngine> progress,
                                 std::shared_ptr<MpiLivenessProbe> liveness)
    : comm_(comm),
      name_(std::move(name)),
      options_(options),
      progress_(std::move(progress)),
      liveness_(std::move(liveness)) {
    MT_CHECK(comm_ != MPI_COMM_NULL, "[mpi] group '{}': null communicator", name_);
    MT_CHECK(options_.timeout_s > 0, "[mpi] group '{}': timeout_s must be > 0, got {}", name_,
             options_.timeout_s);
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Freeing after MPI_Finalize is erroneous; MPI has released everything by then anyway.
    if (!finalized) {
        const int code = MPI_Comm_free(&comm_);
        if (code != MPI_SUCCESS) {
            std::fprintf(stderr, "moetron: MPI_Comm_free of group '%s' failed: %s\n", name_.c_str(),
                         mpi_error_string(code).c_str());
        }
    }
}

int MpiCommunicator::checked_count(CollectiveKind kind, size_t count) const {
    MT_CHECK(count <= static_cast<size_t>(INT_MAX),
             "[{}] group '{}': {} elements exceed MPI's int count limit ({})",
             collective_name(kind), name_, count, INT_MAX);
    return static_cast<int>(count);
}

CollectiveHandle MpiCommunicator::track(CollectiveKind kind, std::shared_ptr<MpiOperation> op,
                                        Progress progress) {
    if (progress == Progress::background) progress_->track(op);
    return CollectiveHandle(std::make_unique<MpiPendingCollective>(
        std::move(op), progress_, liveness_, kind, name_, rank_, size_, options_.timeout_s));
}

CollectiveHandle MpiCommunicator::all_reduce_sum_async(void* data, size_t count, DType dtype,
                                                       Stream stream) {
    return post_all_reduce(data, count, dtype, stream, Progress::background);
}

CollectiveHandle MpiCommunicator::reduce_scatter_sum_async(void* out, const void* inp, size_t count,
                                                           DType dtype, Stream stream) {
    return post_reduce_scatter(out, inp, count, dtype, stream, Progress::background);
}

CollectiveHandle MpiCommunicator::all_gather_async(void* out, const void* inp, size_t count,
                                                   DType dtype, Stream stream) {
    return post_all_gather(out, inp, count, dtype, stream, Progress::background);
}

CollectiveHandle MpiCommunicator::all_to_all_v_async(void* recv, std::span<const int> recv_counts,
                                                     std::span<const int> recv_displs,
                                                     const void* send,
                                                     std::span<const int> send_counts,
                                                     std::span<const int> send_displs, DType dtype,
                                                     Stream stream) {
    return post_all_to_all_v(recv, recv_counts, recv_displs, send, send_counts, send_displs, dtype,
                             stream, Progress::background);
}

CollectiveHandle MpiCommunicator::broadcast_async(void* data, size_t count, DType dtype, int root,
                                                  Stream stream) {
    return post_broadcast(data, count, dtype, root, stream, Progress::background);
}

CollectiveHandle MpiCommunicator::barrier_async() {
    return post_barrier(Progress::background);
}

CollectiveHandle MpiCommunicator::post_all_reduce(void* data, size_t count, DType dtype,
                                                  Stream stream, Progress progress) {
    constexpr auto kind = CollectiveKind::all_reduce;
    check_host_stream(*this, kind, stream);
    check_reduction_dtype(*this, kind, dtype);
    const int n = checked_count(kind, count);
    auto op = std::make_shared<MpiOperation>();
    MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, data, n, mpi_datatype(dtype), MPI_SUM, comm_, &op->request));
    auto& c = counters_[static_cast<size_t>(kind)];
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    return track(kind, std::move(op), progress);
}

CollectiveHandle MpiCommunicator::post_reduce_scatter(void* out, const void* inp, size_t count,
                                                      DType dtype, Stream stream,
                                                      Progress progress) {
    constexpr auto kind = CollectiveKind::reduce_scatter;
    check_host_stream(*this, kind, stream);
    check_reduction_dtype(*this, kind, dtype);
    const int n = checked_count(kind, count);
    auto op = std::make_shared<MpiOperation>();
    MPI_CHECK(
        MPI_Ireduce_scatter_block(inp, out, n, mpi_datatype(dtype), MPI_SUM, comm_, &op->request));
    auto& c = counters_[static_cast<size_t>(kind)];
    c.calls += 1;
    c.payload_bytes += count * static_cast<size_t>(size_) * dtype_size_bytes(dtype);
    return track(kind, std::move(op), progress);
}

CollectiveHandle MpiCommunicator::post_all_gather(void* out, const void* inp, size_t count,
                                                  DType dtype, Stream stream, Progress progress) {
    constexpr auto kind = CollectiveKind::all_gather;
    check_host_stream(*this, kind, stream);
    const int n = checked_count(kind, count);
    const MPI_Datatype type = mpi_datatype(dtype);
    auto op = std::make_shared<MpiOperation>();
    MPI_CHECK(MPI_Iallgather(inp, n, type, out, n, type, comm_, &op->request));
    auto& c = counters_[static_cast<size_t>(kind)];
    c.calls += 1;
    c.payload_bytes += count * static_cast<size_t>(size_) * dtype_size_bytes(dtype);
    return track(kind, std::move(op), progress);
}

CollectiveHandle MpiCommunicator::post_all_to_all_v(void* recv, std::span<const int> recv_counts,
                                                    std::span<const int> recv_displs,
                                                    const void* send,
                                                    std::span<const int> send_counts,
                                                    std::span<const int> send_displs, DType dtype,
                                                    Stream stream, Progress progress) {
    constexpr auto kind = CollectiveKind::all_to_all;
    check_host_stream(*this, kind, stream);
    check_all_to_all_args(*this, recv_counts, recv_displs, send_counts, send_displs);
    const MPI_Datatype type = mpi_datatype(dtype);
    auto op = std::make_shared<MpiOperation>();
    MPI_CHECK(MPI_Ialltoallv(send, send_counts.data(), send_displs.data(), type, recv,
                             recv_counts.data(), recv_displs.data(), type, comm_, &op->request));
    count_all_to_all(counters_[static_cast<size_t>(kind)], rank_, send_counts, dtype);
    return track(kind, std::move(op), progress);
}

CollectiveHandle MpiCommunicator::post_broadcast(void* data, size_t count, DType dtype, int root,
                                                 Stream stream, Progress progress) {
    constexpr auto kind = CollectiveKind::broadcast;
    check_host_stream(*this, kind, stream);
    check_root(*this, root);
    const int n = checked_count(kind, count);
    auto op = std::make_shared<MpiOperation>();
    MPI_CHECK(MPI_Ibcast(data, n, mpi_datatype(dtype), root, comm_, &op->request));
    auto& c = counters_[static_cast<size_t>(kind)];
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    return track(kind, std::move(op), progress);
}

CollectiveHandle MpiCommunicator::post_barrier(Progress progress) {
    constexpr auto kind = CollectiveKind::barrier;
    auto op = std::make_shared<MpiOperation>();
    MPI_CHECK(MPI_Ibarrier(comm_, &op->request));
    counters_[static_cast<size_t>(kind)].calls += 1;
    return track(kind, std::move(op), progress);
}

CollectiveHandle MpiCommunicator::send_async(const void* data, size_t count, DType dtype, int peer,
                                             int tag, Stream stream) {
    constexpr auto kind = CollectiveKind::send_recv;
    check_host_stream(*this, kind, stream);
    check_peer(*this, peer, tag);
    const int n = checked_count(kind, count);
    auto op = std::make_shared<MpiOperation>();
    op->waits_for_peer = true;
    MPI_CHECK(MPI_Isend(data, n, mpi_datatype(dtype), peer, tag, comm_, &op->request));
    auto& c = counters_[static_cast<size_t>(kind)];
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    c.peer_bytes += count * dtype_size_bytes(dtype);
    return track(kind, std::move(op), Progress::background);
}

CollectiveHandle MpiCommunicator::recv_async(void* data, size_t count, DType dtype, int peer,
                                             int tag, Stream stream) {
    constexpr auto kind = CollectiveKind::send_recv;
    check_host_stream(*this, kind, stream);
    check_peer(*this, peer, tag);
    const int n = checked_count(kind, count);
    auto op = std::make_shared<MpiOperation>();
    op->waits_for_peer = true;
    MPI_CHECK(MPI_Irecv(data, n, mpi_datatype(dtype), peer, tag, comm_, &op->request));
    counters_[static_cast<size_t>(kind)].calls += 1;
    return track(kind, std::move(op), Progress::background);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) {
    MT_CHECK(color >= 0, "[split] group '{}': color must be >= 0 to make group '{}', got {}", name_,
             name, color);
    // MPI_Comm_split blocks without a timeout; a barrier first turns a missing rank into an
    // error that names the group instead of a silent hang.
    barrier();
    MPI_Comm child = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
    return std::make_unique<MpiCommunicator>(child, std::move(name), options_, progress_,
                                             liveness_);
}

MpiSession::MpiSession(int* argc, char*** argv) {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    MT_CHECK(!initialized,
             "[mpi] MPI is already initialized: create one MpiSession at the top of main instead");
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    thread_multiple_ = provided == MPI_THREAD_MULTIPLE;
    if (!thread_multiple_) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == 0) {
            std::fprintf(stderr,
                         "moetron: MPI provides %s, not MPI_THREAD_MULTIPLE: no progress thread; "
                         "nonblocking collectives advance only inside wait() and test()\n",
                         thread_level_name(provided));
        }
    }
}

MpiSession::~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

void MpiSession::abort_job(int exit_code) {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

std::unique_ptr<Communicator> make_mpi_world(const MpiSession& session,
                                             const CommunicatorOptions& options) {
    MT_CHECK(options.progress_poll_interval_s >= 0,
             "[mpi] progress_poll_interval_s must be >= 0, got {}",
             options.progress_poll_interval_s);
    // A private duplicate: our traffic never matches messages of other code on MPI_COMM_WORLD.
    MPI_Comm world = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
    auto progress = std::make_shared<MpiProgressEngine>(
        options.progress_thread && session.thread_multiple(), options.progress_poll_interval_s);
    MPI_Comm probe = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &probe));
    return std::make_unique<MpiCommunicator>(world, "world", options, std::move(progress),
                                             std::make_shared<MpiLivenessProbe>(probe));
}

}  // namespace moetron::parallel
