// AdamW: the one optimizer, for one process and for every rank of a job alike. A single process is
// a world of one (parallel/local_communicator.h), so there is no other path.
//
// It owns the data-parallel gradient synchronization (parallel/grad_sync.h: buckets posted during
// the backward, summed over the DP group, routed experts over the EDP group) and updates what
// this rank is responsible for:
//   ZeRO-1 (AdamWConfig::grad_sync.zero1): every bucket is sharded over its group; this rank
//     updates only the part it owns (its shard of the reduced gradient, an fp32 copy of the
//     parameters, first and second moments: 1/group of each), then all-gathers the updated
//     parameters back into every rank's full parameter buffer over that group;
//   without it (--no-zero1, the replicated baseline; and a world of one, where there is nobody to
//     shard over): every replica applies the same update to its full copy.
// The math is the backend's (kernels/backend.h: adamw_update, sum_squares, scale_inplace; the
// reference is kernels/cpu/adamw.h): decoupled weight decay only where the parameter asks for it
// (not on norms and biases), non-trainable parameters (the router correction bias, moved by load
// instead of gradient) never touched, bias correction from a 1-based step count. So one rank and
// N ranks update alike.
//
// It lives in train/ rather than parallel/: it is training math that uses the communicator (as
// the trainer does), while parallel/ moves bytes between ranks and knows nothing of optimizers.
//
// The parameter all-gathers are posted per bucket, all of them before any is waited for, so they
// overlap each other and whatever the caller does next (post_step(), then finish_param_gathers()).
// Invariant: while gathers are in flight (params_in_flight()), no float of a sharded bucket's
// parameters may be read or written: not by the forward, an evaluation, a checkpoint, nor this
// optimizer (clip_gradients, post_step and moment_ranges check it and throw).
//
// Gradient clipping uses the norm of the whole (global) gradient: each rank adds the squares of
// what it alone holds (its shard; or, for a replicated bucket, its copy divided by the number of
// replicas; both divided again by the TP copies of a TP-replicated parameter) and one all-reduce
// over the world sums them, counting every element once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/kernels/backend.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/grad_sync.h"

namespace moetron {

struct AdamWConfig {
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;
    double grad_clip = 1.0;  // max global gradient norm; <= 0 disables clipping
    // How the gradients are summed over the replicas, and ZeRO-1 (grad_sync.zero1: shard this
    // optimizer's state over the DP and EDP groups).
    parallel::GradSyncOptions grad_sync;
};

// The groups the optimizer works over; each must outlive it. world is every rank of the job
// (data-parallel x tensor-parallel ranks); dp and edp may be the same group. On one process all
// three are one-rank groups.
struct AdamWGroups {
    parallel::Communicator& world;
    parallel::Communicator& dp;
    parallel::Communicator& edp;
};

class AdamW {
  public:
    // spans describe the flat parameter (and gradient) buffer of num_params floats; grads is the
    // gradient buffer, which the synchronization reduces in place. backend runs the math and
    // must outlive the optimizer; the optimizer's own state (state_arena()) is one arena from its
    // memory(), planned and zeroed here.
    AdamW(std::span<const parallel::ParamSpan> spans, int64_t num_params, float* grads,
          AdamWGroups groups, const AdamWConfig& config, Backend& backend = cpu_backend());

    // The gradient synchronization: arm() before the last micro-batch's backward, its
    // grads_ready() from the model's readiness callback, finish() before clip_gradients().
    parallel::GradSync& grad_sync() { return *sync_; }
    const parallel::GradSync& grad_sync() const { return *sync_; }

    // Global L2 norm of the synchronized gradient (before clipping), after grad_sync().finish();
    // scales what this rank holds so that the global norm is at most grad_clip. grads is the
    // full buffer the sync reduced in place (its sharded buckets' results are in
    // grad_sync().shard_grads()).
    double clip_gradients(float* grads);
    // One AdamW step at learning rate lr: updates what this rank owns, then all-gathers the
    // sharded buckets into params (collectives over the DP and EDP groups) and waits for them:
    // post_step() then finish_param_gathers().
    void step(float* params, const float* grads, double lr);
    // The same step, returning with the sharded buckets' all-gathers in flight (posted in bucket
    // order, every one before any wait). params must stay untouched until finish_param_gathers().
    void post_step(float* params, const float* grads, double lr);
    // Waits for the gathers post_step() posted and copies the padded buckets out of their
    // staging; params is then whole again. Does nothing when none is in flight.
    void finish_param_gathers();
    bool params_in_flight() const { return gather_params_ != nullptr; }

    int64_t step_count() const { return step_count_; }
    // Floats of optimizer state this rank keeps (moments, and the fp32 shard of parameters).
    int64_t state_numel() const;
    // The part of it that serves the buckets of one group (ZeRO-1: 3 floats per owned float of a
    // shard, padding included; replicated: the 2 moments per float of the bucket).
    int64_t state_numel(parallel::ReplicaGroup group) const;

    // The moments this rank keeps, by range of the flat parameter buffer: one range per bucket
    // (a ZeRO-1 shard: the owned part only; ranks that own nothing of a padded bucket get none).
    // For checkpoints, which read and write them in place. The fp32 shard of the parameters needs
    // no saving: step() refreshes it from the parameter buffer.
    struct MomentRange {
        int64_t offset = 0;  // first float, in the flat parameter buffer
        int64_t numel = 0;
        bool replicated = false;  // every rank of the bucket's group keeps the same moments
        int group_rank = 0;       // this rank in that group
        float* m = nullptr;       // numel floats each
        float* v = nullptr;
    };
    std::vector<MomentRange> moment_ranges();
    // The bias-correction count a checkpoint saved (with the moments written in place).
    void restore_step_count(int64_t step_count);
    // The copies outside their group of the buckets inside [offset, offset + numel) (spans given
    // with own_run: a redundant expert's slot, whose replicas are its copies), for the global
    // gradient norm after a new expert placement. Throws when a bucket straddles the range.
    void set_copies_outside_group(int64_t offset, int64_t numel, int copies);
    // The one allocation that holds the state: "shard.params", "shard.m", "shard.v" (the sharded
    // buckets' shards back to back), "replica.m", "replica.v" (the unsharded buckets' moments back
    // to back) and "gather_staging" (the padded sharded buckets' gathers).
    const Arena& state_arena() const { return state_; }

  private:
    struct BucketState {
        std::vector<parallel::DecayRun> runs;  // what this rank updates: shard- or bucket-relative
        int64_t owned_begin = 0;               // bucket-relative start of the owned part
        int64_t owned_numel = 0;
        int64_t state_offset = 0;     // into the shard buffers or the replicated moments
        int64_t staging_offset = -1;  // padded sharded buckets: into gather_staging_
    };

    Backend& backend_;
    std::unique_ptr<parallel::GradSync> sync_;
    parallel::Communicator& world_;
    AdamWConfig config_;
    std::vector<BucketState> states_;
    std::vector<int> copies_;  // (buckets) each bucket's copies outside its group, for the norm
    Arena state_;
    int64_t shard_numel_ = 0;    // floats of each of shard_params_, shard_m_, shard_v_
    int64_t replica_numel_ = 0;  // floats of each of replica_m_, replica_v_
    // Views into state_.
    float* shard_params_ = nullptr;  // sharded buckets (shard layout)
    float* shard_m_ = nullptr;
    float* shard_v_ = nullptr;
    float* replica_m_ = nullptr;  // unsharded buckets, back to back
    float* replica_v_ = nullptr;
    float* gather_staging_ = nullptr;
    std::vector<parallel::CollectiveHandle> gathers_;
    float* gather_params_ = nullptr;  // the buffer the gathers in flight write; null when none
    int64_t step_count_ = 0;
};

}  // namespace moetron
