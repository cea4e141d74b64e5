// Data-parallel gradient synchronization in buckets (grad_buckets.h), overlapped with the
// backward: the model reports ranges of final gradients (Model::set_grad_ready_callback) and each
// bucket's collective is posted, asynchronously, as soon as its last float is final; finish()
// posts whatever is left and waits for everything before the optimizer.
//
//   data-parallel buckets:        over the DP group
//   expert-data-parallel buckets: over the EDP group (routed experts)
// each all-reduced (sum) in place, or, with ZeRO-1, reduce-scattered into this rank's shard
// buffer (train/optimizer.h updates the shard and all-gathers the parameters back).
// A group of one rank moves nothing (a sharded bucket is then a copy into the shard buffer).
//
// The sum is the whole batch's gradient when each rank's micro-batches were normalized by the
// whole batch's denominators (Model's LossDenominators).
//
// Collectives on one group are posted in the same order on every rank: readiness comes in the
// same order everywhere (every rank runs the same backward), and finish() posts the rest in bucket
// order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/kernels/backend.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/grad_buckets.h"

namespace moetron::parallel {

struct GradSyncOptions {
    int64_t bucket_bytes = int64_t{4} << 20;
    bool zero1 = false;   // ZeRO-1: reduce-scatter the gradients of both groups (DP and EDP)
    bool overlap = true;  // false: post every bucket in finish(), after the backward (baseline)
};

// What the last synchronization cost this rank; exposed_s is what the step waited for.
struct GradSyncStats {
    int64_t num_buckets = 0;
    int64_t buckets_posted_in_backward = 0;  // posted before finish(): overlapped
    int64_t bytes = 0;                       // gradient bytes reduced (payload, this rank)
    double post_s = 0;    // time inside grads_ready(): staging copies and posting
    double finish_s = 0;  // time inside finish(): posting the rest and waiting for all
    double exposed_s() const { return post_s + finish_s; }
};

class GradSync {
  public:
    // grads: the flat gradient buffer (num_params floats) the spans describe; it and the
    // communicators and backend must outlive this object. dp and edp may be the same group.
    // backend is the one that writes the gradients: the collectives carry its stream(), its
    // memory() holds the shards and the staging (one arena, planned here) and it copies into
    // the staging.
    GradSync(std::span<const ParamSpan> spans, int64_t num_params, float* grads, Communicator& dp,
             Communicator& edp, const GradSyncOptions& options, Backend& backend);
    GradSync(const GradSync&) = delete;
    GradSync& operator=(const GradSync&) = delete;

    const GradBuckets& buckets() const { return buckets_; }
    const GradSyncOptions& options() const { return options_; }
    // The ordering context of the gradients (and of the parameters gathered back into place).
    Stream stream() const { return stream_; }
    Communicator& group(ReplicaGroup group) const {
        return group == ReplicaGroup::data_parallel ? dp_ : edp_;
    }

    // Starts tracking readiness for the coming backward: call it before the forward_backward of
    // the step's last micro-batch (earlier micro-batches' gradients are not final). Notifications
    // while not armed are ignored.
    void arm();
    // [begin, end) of the gradient buffer is final (the model's GradReadyCallback). Posts every
    // bucket this completes (when overlap is on). Throws if a float is reported twice.
    void grads_ready(int64_t begin, int64_t end);
    // Posts the buckets not posted yet (in bucket order), waits for all, and disarms. Afterwards
    // the unsharded buckets hold the summed gradients in place and shard_grads() the sharded ones.
    void finish();

    // The reduced shards of the sharded buckets (buckets().shard_buffer_numel() floats; bucket
    // b's shard at buckets().buckets()[b].shard_offset, its owned part first).
    float* shard_grads() { return shard_grads_; }
    const float* shard_grads() const { return shard_grads_; }
    const GradSyncStats& last_stats() const { return stats_; }

  private:
    void post(size_t bucket);

    GradSyncOptions options_;
    GradBuckets buckets_;
    float* grads_;
    Communicator& dp_;
    Communicator& edp_;
    Backend& backend_;
    Stream stream_;
    Arena arena_;                            // "shard_grads" and "staging"
    float* shard_grads_ = nullptr;           // the sharded buckets' reduced shards (shard layout)
    float* staging_ = nullptr;               // padded sharded buckets' inputs, back to back
    std::vector<int64_t> staging_offset_;    // per bucket, -1 when it needs none
    std::vector<int64_t> ready_numel_;       // per bucket: floats reported final
    std::vector<uint8_t> posted_;            // per bucket
    std::vector<CollectiveHandle> handles_;  // per bucket
    bool armed_ = false;
    GradSyncStats stats_;
};

// The bucket options GradSync uses for these groups.
BucketOptions bucket_options(const GradSyncOptions& options, const Communicator& dp,
                             const Communicator& edp);

}  // namespace moetron::parallel
