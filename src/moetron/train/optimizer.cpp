#include "moetron/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/core/error.h"
#include "moetron/kernels/backend.h"

namespace moetron {

using parallel::CollectiveHandle;
using parallel::Communicator;
using parallel::DecayRun;
using parallel::GradBucket;
using parallel::GradBuckets;
using parallel::ReplicaGroup;

AdamW::AdamW(std::span<const parallel::ParamSpan> spans, int64_t num_params, float* grads,
             AdamWGroups groups, const AdamWConfig& config, Backend& backend)
    : backend_(backend),
      sync_(std::make_unique<parallel::GradSync>(spans, num_params, grads, groups.dp, groups.edp,
                                                 config.grad_sync, backend)),
      world_(groups.world),
      config_(config) {
    const parallel::GradSync& sync = *sync_;
    const Communicator& world = world_;
    const Communicator& dp = sync.group(ReplicaGroup::data_parallel);
    const Communicator& edp = sync.group(ReplicaGroup::expert_data_parallel);
    MT_CHECK(world.size() % dp.size() == 0,
             "[optimizer] the data-parallel group '{}' ({} ranks) does not divide the world '{}' "
             "({} ranks)",
             dp.name(), dp.size(), world.name(), world.size());
    MT_CHECK(world.size() % edp.size() == 0,
             "[optimizer] the expert-data-parallel group '{}' ({} ranks) does not divide the world "
             "({} ranks)",
             edp.name(), edp.size(), world.size());

    const std::vector<GradBucket>& buckets = sync.buckets().buckets();
    states_.resize(buckets.size());
    for (const GradBucket& bucket : buckets) copies_.push_back(bucket.copies_outside_group);
    int64_t replica_numel = 0, staging_numel = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
        const GradBucket& bucket = buckets[b];
        BucketState& s = states_[b];
        if (bucket.sharded) {
            const int rank = sync.group(bucket.group).rank();
            s.runs = GradBuckets::owned_decay_runs(bucket, rank);
            s.owned_begin = bucket.owned_begin(rank);
            s.owned_numel = bucket.owned_end(rank) - s.owned_begin;
            s.state_offset = bucket.shard_offset;
            if (bucket.padded()) {
                s.staging_offset = staging_numel;
                staging_numel += bucket.shard_numel * bucket.group_size;
            }
        } else {
            s.runs = bucket.decay_runs;
            s.owned_begin = 0;
            s.owned_numel = bucket.numel;
            s.state_offset = replica_numel;
            replica_numel += bucket.numel;
        }
    }
    shard_numel_ = sync.buckets().shard_buffer_numel();
    replica_numel_ = replica_numel;
    ArenaPlan plan("optimizer_state",
                   backend.device() == Device::cpu ? kHostAlignmentBytes : kDeviceAlignmentBytes);
    const size_t shard_params = plan.add("shard.params", {shard_numel_});
    const size_t shard_m = plan.add("shard.m", {shard_numel_});
    const size_t shard_v = plan.add("shard.v", {shard_numel_});
    const size_t replica_m = plan.add("replica.m", {replica_numel_});
    const size_t replica_v = plan.add("replica.v", {replica_numel_});
    const size_t staging = plan.add("gather_staging", {staging_numel});
    state_ = Arena(plan, backend.memory());
    state_.zero();  // the moments start at zero
    shard_params_ = state_.view(shard_params).f32();
    shard_m_ = state_.view(shard_m).f32();
    shard_v_ = state_.view(shard_v).f32();
    replica_m_ = state_.view(replica_m).f32();
    replica_v_ = state_.view(replica_v).f32();
    gather_staging_ = state_.view(staging).f32();
    gathers_.resize(buckets.size());
}

int64_t AdamW::state_numel() const {
    return 3 * shard_numel_ + 2 * replica_numel_;
}

int64_t AdamW::state_numel(ReplicaGroup group) const {
    int64_t numel = 0;
    for (const GradBucket& bucket : sync_->buckets().buckets()) {
        if (bucket.group != group) continue;
        numel += bucket.sharded ? 3 * bucket.shard_numel : 2 * bucket.numel;
    }
    return numel;
}

std::vector<AdamW::MomentRange> AdamW::moment_ranges() {
    MT_CHECK(!params_in_flight(),
             "[optimizer] moment_ranges() while the parameter all-gathers are in flight: call "
             "finish_param_gathers() first (a checkpoint reads the parameters with the moments)");
    const std::vector<GradBucket>& buckets = sync_->buckets().buckets();
    std::vector<MomentRange> ranges;
    for (size_t b = 0; b < buckets.size(); ++b) {
        const GradBucket& bucket = buckets[b];
        const BucketState& s = states_[b];
        if (s.owned_numel == 0) continue;
        float* m = bucket.sharded ? shard_m_ : replica_m_;
        float* v = bucket.sharded ? shard_v_ : replica_v_;
        ranges.push_back({bucket.offset + s.owned_begin, s.owned_numel, !bucket.sharded,
                          sync_->group(bucket.group).rank(), m + s.state_offset,
                          v + s.state_offset});
    }
    return ranges;
}

double AdamW::clip_gradients(float* grads) {
    MT_CHECK(!params_in_flight(),
             "[optimizer] clip_gradients() while the last step's parameter all-gathers are in "
             "flight: the forward read parameters still being gathered (call "
             "finish_param_gathers() before the next forward)");
    const std::vector<GradBucket>& buckets = sync_->buckets().buckets();
    float* shard_grads = sync_->shard_grads();
    // This rank's part of the global sum of squares: each element of the global gradient counted
    // once over the world.
    double local = 0.0;
    for (size_t b = 0; b < buckets.size(); ++b) {
        const GradBucket& bucket = buckets[b];
        const BucketState& s = states_[b];
        // Ranks outside the group with the same copy (TP replicas) each add their share too.
        const auto copies = static_cast<double>(copies_[b]);
        if (bucket.sharded) {
            local += backend_.sum_squares(shard_grads + s.state_offset, s.owned_numel) / copies;
        } else {
            // Every rank of the bucket's group holds the same summed copy.
            local += backend_.sum_squares(grads + bucket.offset, bucket.numel) /
                     (static_cast<double>(bucket.group_size) * copies);
        }
    }
    world_.all_reduce_sum(&local, 1, DType::f64, kHostStream);
    const double norm = std::sqrt(local);
    const float factor = clip_factor(norm, static_cast<float>(config_.grad_clip));
    if (factor != 1.0f) {
        for (size_t b = 0; b < buckets.size(); ++b) {
            const GradBucket& bucket = buckets[b];
            const BucketState& s = states_[b];
            if (bucket.sharded)
                backend_.scale_inplace(shard_grads + s.state_offset, s.owned_numel, factor);
            else
                backend_.scale_inplace(grads + bucket.offset, bucket.numel, factor);
        }
    }
    return norm;
}

void AdamW::set_copies_outside_group(int64_t offset, int64_t numel, int copies) {
    MT_CHECK(copies >= 1, "[adamw] {} copies", copies);
    const std::vector<GradBucket>& buckets = sync_->buckets().buckets();
    for (size_t b = 0; b < buckets.size(); ++b) {
        const int64_t begin = buckets[b].offset, end = begin + buckets[b].numel;
        if (end <= offset || begin >= offset + numel) continue;
        MT_CHECK(begin >= offset && end <= offset + numel,
                 "[adamw] bucket [{}, {}) straddles the range [{}, {}) whose copies change", begin,
                 end, offset, offset + numel);
        copies_[b] = copies;
    }
}

void AdamW::restore_step_count(int64_t step_count) {
    MT_CHECK(step_count >= 0, "[optimizer] cannot restore a negative step count {}", step_count);
    step_count_ = step_count;
}

void AdamW::step(float* params, const float* grads, double lr) {
    post_step(params, grads, lr);
    finish_param_gathers();
}

void AdamW::post_step(float* params, const float* grads, double lr) {
    MT_CHECK(!params_in_flight(),
             "[optimizer] step {} posted while the parameter all-gathers of step {} are still in "
             "flight (call finish_param_gathers() first)",
             step_count_ + 1, step_count_);
    ++step_count_;
    AdamWParams hp{};
    hp.lr = static_cast<float>(lr);
    hp.beta1 = static_cast<float>(config_.beta1);
    hp.beta2 = static_cast<float>(config_.beta2);
    hp.eps = static_cast<float>(config_.eps);
    hp.step = step_count_;
    const float decay = static_cast<float>(config_.weight_decay);

    const std::vector<GradBucket>& buckets = sync_->buckets().buckets();
    const float* shard_grads = sync_->shard_grads();
    for (size_t b = 0; b < buckets.size(); ++b) {
        const GradBucket& bucket = buckets[b];
        const BucketState& s = states_[b];
        if (!bucket.sharded) {
            float* p = params + bucket.offset;
            const float* g = grads + bucket.offset;
            for (const DecayRun& r : s.runs) {
                hp.weight_decay = r.weight_decay ? decay : 0.0f;
                backend_.adamw_update(p + r.offset, replica_m_ + s.state_offset + r.offset,
                                      replica_v_ + s.state_offset + r.offset, g + r.offset, r.numel,
                                      hp);
            }
            continue;
        }
        // The fp32 shard starts from the full buffer each step, so that anything that wrote the
        // parameters since (a checkpoint load) is picked up.
        float* p = shard_params_ + s.state_offset;
        backend_.copy(p, params + bucket.offset + s.owned_begin,
                      static_cast<size_t>(s.owned_numel) * sizeof(float));
        for (const DecayRun& r : s.runs) {
            hp.weight_decay = r.weight_decay ? decay : 0.0f;
            backend_.adamw_update(p + r.offset, shard_m_ + s.state_offset + r.offset,
                                  shard_v_ + s.state_offset + r.offset,
                                  shard_grads + s.state_offset + r.offset, r.numel, hp);
        }
#ifndef NDEBUG
        // Debug builds: the bucket's parameters read as NaN until its gather lands, so that a read
        // breaking the invariant (optimizer.h) shows up as a non-finite loss, never as a
        // silently stale value. The gather overwrites all of it (finish_param_gathers for padded
        // buckets).
        backend_.fill(params + bucket.offset, bucket.numel,
                      std::numeric_limits<float>::quiet_NaN());
#endif
        float* out =
            s.staging_offset >= 0 ? gather_staging_ + s.staging_offset : params + bucket.offset;
        gathers_[b] = sync_->group(bucket.group)
                          .all_gather_async(out, p, static_cast<size_t>(bucket.shard_numel),
                                            DType::f32, backend_.stream());
    }
    gather_params_ = params;
}

void AdamW::finish_param_gathers() {
    if (gather_params_ == nullptr) return;
    const std::vector<GradBucket>& buckets = sync_->buckets().buckets();
    for (size_t b = 0; b < buckets.size(); ++b) {
        gathers_[b].wait();
        const BucketState& s = states_[b];
        if (s.staging_offset >= 0) {
            backend_.copy(gather_params_ + buckets[b].offset, gather_staging_ + s.staging_offset,
                          static_cast<size_t>(buckets[b].numel) * sizeof(float));
        }
    }
    gather_params_ = nullptr;
}

}  // namespace moetron
