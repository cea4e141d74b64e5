// Communicator: the one interface through which the engine communicates (DESIGN.md sec. 4).
// Implementations: MPI over host buffers (mpi_communicator.h), a world of one process
// (local_communicator.h); NCCL later. Every collective has an async form that returns a
// CollectiveHandle; the blocking form posts the same nonblocking operation and waits for it, so
// every collective obeys the same timeout. Buffers passed to an async collective, and its
// counts/displacement arrays, must stay alive and untouched until the handle completes (MPI's
// rule).
//
// Every data-moving call takes the ordering context of its buffers (core/stream.h), last: the
// backend's stream() for tensor data (the dispatch rows, gradients, activations), kHostStream for
// host-side control data (counts, metrics, checkpoint bookkeeping). On a GPU a NCCL communicator
// enqueues the collective on that stream, after the kernels that wrote its inputs; the MPI and
// local communicators move host memory and accept host streams only (check_host_stream).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "moetron/core/dtype.h"
#include "moetron/core/stream.h"

namespace moetron::parallel {

enum class CollectiveKind : uint8_t {
    all_reduce,
    reduce_scatter,
    all_gather,
    all_to_all,
    broadcast,
    barrier,
    send_recv,  // point to point: send_async and recv_async (pipeline stages)
};
inline constexpr size_t kNumCollectiveKinds = 7;
std::string_view collective_name(CollectiveKind kind);

// Per-kind counters, for metrics. payload_bytes follows nccl-tests' "size" of each operation on
// this rank: all_reduce and broadcast: the buffer; reduce_scatter: the input (size x count);
// all_gather: the output (size x count); all_to_all: the bytes this rank sends (own copy included);
// send_recv: the bytes this rank sends (receives count calls only).
// peer_bytes is the part of an all_to_all's payload addressed to other ranks (0 for the other
// kinds, whose wire traffic depends on MPI's algorithm).
struct CollectiveCounters {
    uint64_t calls = 0;
    uint64_t payload_bytes = 0;
    uint64_t peer_bytes = 0;
};

struct CommunicatorOptions {
    // A collective whose wait() runs longer than this throws moetron::Error naming the collective,
    // the group, the rank and (MPI) the ranks that did not answer a liveness probe: stopped,
    // hung or dead (mpi_liveness.h). The top level then aborts the job.
    double timeout_s = 300.0;
    // A background thread that drives outstanding nonblocking collectives while the caller
    // computes (Open MPI has no asynchronous progress of its own). Needs MPI_THREAD_MULTIPLE;
    // without it the communicator runs without the thread and says so (progress_thread_active).
    bool progress_thread = true;
    // Sleep of the progress thread between sweeps while collectives are outstanding (the
    // shortest: it backs off while they wait for a peer, parallel/poll_backoff.h).
    double progress_poll_interval_s = 50e-6;
};

// One outstanding collective. Implementations define how it is tested.
class PendingCollective {
  public:
    virtual ~PendingCollective() = default;
    virtual bool test() = 0;  // true once complete; never blocks
    virtual void wait() = 0;  // blocks until complete; throws moetron::Error on timeout
    // Timer::now_s() when the operation was first seen complete (by any thread, the progress
    // thread included); meaningful once test() or wait() has returned complete. The default, for
    // operations complete when posted, is the time of asking.
    virtual double completed_at_s() const;
    // Called instead of wait() when the handle is destroyed while an error unwinds the stack:
    // stop driving the operation (its buffers are about to be freed). The default does nothing.
    virtual void abandon() noexcept {}
};

// Move-only handle to an async collective. A default-constructed handle is already complete.
// Destroying a pending handle waits for it (a collective must not outlive its buffers); if that
// wait fails the process terminates, since a destructor cannot throw. A pending handle destroyed
// while an exception unwinds the stack (a collective timed out; the top level is about to abort
// the job) is abandoned instead: waiting could only add a second timeout and then terminate.
class [[nodiscard]] CollectiveHandle {
  public:
    CollectiveHandle() = default;
    explicit CollectiveHandle(std::unique_ptr<PendingCollective> op) : op_(std::move(op)) {}
    CollectiveHandle(CollectiveHandle&& other) noexcept
        : op_(std::move(other.op_)), completed_at_s_(other.completed_at_s_) {}
    CollectiveHandle& operator=(CollectiveHandle&& other) noexcept;
    CollectiveHandle(const CollectiveHandle&) = delete;
    CollectiveHandle& operator=(const CollectiveHandle&) = delete;
    ~CollectiveHandle();

    bool test();  // true when complete
    void wait();  // returns when complete; throws moetron::Error on timeout
    bool pending() const { return op_ != nullptr; }
    // When the collective completed (PendingCollective::completed_at_s), once test() or wait()
    // has returned complete; NaN before, and for a handle that was never pending.
    double completed_at_s() const { return completed_at_s_; }

  private:
    void finish_or_terminate() noexcept;
    std::unique_ptr<PendingCollective> op_;
    double completed_at_s_ = std::numeric_limits<double>::quiet_NaN();
};

class Communicator {
  public:
    virtual ~Communicator() = default;

    virtual int rank() const = 0;
    virtual int size() const = 0;
    // The group's name ("world", "tp", "ep", "dp", ...), for error messages and metrics.
    virtual const std::string& name() const = 0;
    // Whether a progress thread drives this group's nonblocking collectives.
    virtual bool progress_thread_active() const = 0;

    // ---- async forms (outputs first, then inputs, then counts) ----

    // In place sum over the group; dtype f32 or f64.
    virtual CollectiveHandle all_reduce_sum_async(void* data, size_t count, DType dtype,
                                                  Stream stream) = 0;
    // out (count) = the sum over ranks of inp[rank * count, (rank + 1) * count); inp holds
    // size() * count elements; dtype f32 or f64.
    virtual CollectiveHandle reduce_scatter_sum_async(void* out, const void* inp, size_t count,
                                                      DType dtype, Stream stream) = 0;
    // out (size() * count) = every rank's inp (count), in rank order; any dtype.
    virtual CollectiveHandle all_gather_async(void* out, const void* inp, size_t count, DType dtype,
                                              Stream stream) = 0;
    // Rank r sends send[send_displs[p], + send_counts[p]) to each rank p and receives
    // recv[recv_displs[p], + recv_counts[p]) from each p. Counts and displacements are in
    // elements of dtype, one per rank of the group; any dtype (u8 for raw bytes).
    virtual CollectiveHandle all_to_all_v_async(void* recv, std::span<const int> recv_counts,
                                                std::span<const int> recv_displs, const void* send,
                                                std::span<const int> send_counts,
                                                std::span<const int> send_displs, DType dtype,
                                                Stream stream) = 0;
    // data (count) on every rank = data on rank root.
    virtual CollectiveHandle broadcast_async(void* data, size_t count, DType dtype, int root,
                                             Stream stream) = 0;
    virtual CollectiveHandle barrier_async() = 0;

    // ---- point to point (pipeline stages hand activations and gradients to their neighbours)

    // Sends data (count elements) to rank `peer` of this group, which posts the matching
    // recv_async (the same count, dtype and tag). Messages from one rank to another with the same
    // tag arrive in the order they were posted. data must stay untouched until the handle
    // completes; peer may not be this rank. Counted as send_recv: the calls and bytes sent.
    virtual CollectiveHandle send_async(const void* data, size_t count, DType dtype, int peer,
                                        int tag, Stream stream) = 0;
    // Receives count elements from rank `peer` of this group into data (see send_async).
    virtual CollectiveHandle recv_async(void* data, size_t count, DType dtype, int peer, int tag,
                                        Stream stream) = 0;

    // Collective over this group: ranks with the same color form a new group named `name`,
    // ordered by key (ties by rank in this group). color must be >= 0. The new group shares this
    // group's progress thread and options.
    virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

    virtual const CollectiveCounters& counters(CollectiveKind kind) const = 0;
    virtual void reset_counters() = 0;

    // ---- blocking forms. By default the async form, then wait(); an implementation may skip
    // what only an async caller needs (the MPI one keeps these away from its progress thread).

    virtual void all_reduce_sum(void* data, size_t count, DType dtype, Stream stream) {
        all_reduce_sum_async(data, count, dtype, stream).wait();
    }
    virtual void reduce_scatter_sum(void* out, const void* inp, size_t count, DType dtype,
                                    Stream stream) {
        reduce_scatter_sum_async(out, inp, count, dtype, stream).wait();
    }
    virtual void all_gather(void* out, const void* inp, size_t count, DType dtype, Stream stream) {
        all_gather_async(out, inp, count, dtype, stream).wait();
    }
    virtual void all_to_all_v(void* recv, std::span<const int> recv_counts,
                              std::span<const int> recv_displs, const void* send,
                              std::span<const int> send_counts, std::span<const int> send_displs,
                              DType dtype, Stream stream) {
        all_to_all_v_async(recv, recv_counts, recv_displs, send, send_counts, send_displs, dtype,
                           stream)
            .wait();
    }
    virtual void broadcast(void* data, size_t count, DType dtype, int root, Stream stream) {
        broadcast_async(data, count, dtype, root, stream).wait();
    }
    virtual void barrier() { barrier_async().wait(); }

    // ---- typed conveniences ----

    template <class T>
    void all_reduce_sum(std::span<T> data, Stream stream) {
        all_reduce_sum(data.data(), data.size(), dtype_of<T>(), stream);
    }
    template <class T>
    void all_gather(std::span<T> out, std::span<const T> inp, Stream stream) {
        check_all_gather_sizes(out.size(), inp.size());
        all_gather(out.data(), inp.data(), inp.size(), dtype_of<T>(), stream);
    }
    template <class T>
    void all_to_all_v(T* recv, std::span<const int> recv_counts, std::span<const int> recv_displs,
                      const T* send, std::span<const int> send_counts,
                      std::span<const int> send_displs, Stream stream) {
        all_to_all_v(recv, recv_counts, recv_displs, send, send_counts, send_displs, dtype_of<T>(),
                     stream);
    }

  private:
    void check_all_gather_sizes(size_t out_count, size_t inp_count) const;
};

// Argument checks shared by the implementations; each throws moetron::Error saying which
// argument is wrong, naming the collective and the group.
void check_reduction_dtype(const Communicator& comm, CollectiveKind kind, DType dtype);
void check_all_to_all_args(const Communicator& comm, std::span<const int> recv_counts,
                           std::span<const int> recv_displs, std::span<const int> send_counts,
                           std::span<const int> send_displs);
void check_root(const Communicator& comm, int root);
// send_async / recv_async: peer is another rank of the group, tag >= 0.
void check_peer(const Communicator& comm, int peer, int tag);
// For communicators that move host memory (MPI, local): a stream other than a host stream means
// the caller's buffers live on a device, an internal error (MT_CHECK naming the collective).
void check_host_stream(const Communicator& comm, CollectiveKind kind, Stream stream);

// Adds one call to `counters` for an all_to_all_v from this rank.
void count_all_to_all(CollectiveCounters& counters, int self_rank, std::span<const int> send_counts,
                      DType dtype);

// ---- process-wide MPI lifetime ----

// MPI_Init_thread (asking for MPI_THREAD_MULTIPLE) in the constructor, MPI_Finalize in the
// destructor. Construct one at the top of main, before any communicator, and let every
// communicator die before it. Throws "built without MPI" in a build without MPI.
class MpiSession {
  public:
    MpiSession(int* argc, char*** argv);
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;

    // True when MPI granted MPI_THREAD_MULTIPLE (what the progress thread needs).
    bool thread_multiple() const { return thread_multiple_; }
    // Ends every process of the job (MPI_Abort); for the top level after an uncaught Error.
    [[noreturn]] static void abort_job(int exit_code);

  private:
    bool thread_multiple_ = false;
};

// How many processes an MPI launcher started this job with (Open MPI's OMPI_COMM_WORLD_SIZE, or
// PMI_SIZE / PMIX_SIZE), 1 when no launcher did. Read before MPI starts, to choose between a
// world of one and an MPI world.
int launched_process_count();
inline bool launched_as_mpi_job() {
    return launched_process_count() > 1;
}

// The group of every process of the job ("world"), over a private duplicate of MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_mpi_world(const MpiSession& session,
                                             const CommunicatorOptions& options = {});

}  // namespace moetron::parallel
