#include "moetron/parallel/grad_sync.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"

namespace moetron::parallel {

BucketOptions bucket_options(const GradSyncOptions& options, const Communicator& dp,
                             const Communicator& edp) {
    MT_CHECK(options.bucket_bytes >= static_cast<int64_t>(sizeof(float)),
             "[grad_sync] bucket size must be at least one float, got {} bytes",
             options.bucket_bytes);
    BucketOptions b;
    b.bucket_numel = options.bucket_bytes / static_cast<int64_t>(sizeof(float));
    b.zero1 = options.zero1;
    b.dp_size = dp.size();
    b.edp_size = edp.size();
    return b;
}

GradSync::GradSync(std::span<const ParamSpan> spans, int64_t num_params, float* grads,
                   Communicator& dp, Communicator& edp, const GradSyncOptions& options,
                   Backend& backend)
    : options_(options),
      buckets_(spans, num_params, bucket_options(options, dp, edp)),
      grads_(grads),
      dp_(dp),
      edp_(edp),
      backend_(backend),
      stream_(backend.stream()) {
    MT_CHECK(grads != nullptr || num_params == 0, "[grad_sync] the gradient buffer is null");
    const std::vector<GradBucket>& all = buckets_.buckets();
    staging_offset_.assign(all.size(), -1);
    int64_t staging_numel = 0;
    for (size_t b = 0; b < all.size(); ++b) {
        if (!all[b].padded()) continue;
        staging_offset_[b] = staging_numel;
        staging_numel += all[b].shard_numel * all[b].group_size;
    }
    ArenaPlan plan("grad_sync",
                   backend.device() == Device::cpu ? kHostAlignmentBytes : kDeviceAlignmentBytes);
    const size_t shard_grads = plan.add("shard_grads", {buckets_.shard_buffer_numel()});
    const size_t staging = plan.add("staging", {staging_numel});
    arena_ = Arena(plan, backend.memory());
    // Zero once: the padding tails of the staging are never written, so they add zeros to the
    // shards.
    arena_.zero();
    shard_grads_ = arena_.view(shard_grads).f32();
    staging_ = arena_.view(staging).f32();
    ready_numel_.assign(all.size(), 0);
    posted_.assign(all.size(), 0);
    handles_.resize(all.size());
    stats_.num_buckets = static_cast<int64_t>(all.size());
}

void GradSync::arm() {
    MT_CHECK(!armed_, "[grad_sync] arm() called twice without finish()");
    std::fill(ready_numel_.begin(), ready_numel_.end(), 0);
    std::fill(posted_.begin(), posted_.end(), 0);
    stats_ = {};
    stats_.num_buckets = static_cast<int64_t>(buckets_.buckets().size());
    armed_ = true;
}

void GradSync::grads_ready(int64_t begin, int64_t end) {
    if (!armed_) return;
    MT_CHECK(begin >= 0 && begin <= end && end <= buckets_.num_params(),
             "[grad_sync] ready range [{}, {}) lies outside the {}-float gradient buffer", begin,
             end, buckets_.num_params());
    const Timer timer;
    const std::vector<GradBucket>& all = buckets_.buckets();
    for (size_t b = buckets_.first_bucket_ending_after(begin);
         b < all.size() && all[b].offset < end; ++b) {
        const GradBucket& bucket = all[b];
        const int64_t overlap =
            std::min(end, bucket.offset + bucket.numel) - std::max(begin, bucket.offset);
        ready_numel_[b] += overlap;
        MT_CHECK(ready_numel_[b] <= bucket.numel,
                 "[grad_sync] gradients [{}, {}) reported final twice (bucket {})", begin, end, b);
        if (options_.overlap && ready_numel_[b] == bucket.numel) {
            post(b);
            ++stats_.buckets_posted_in_backward;
        }
    }
    stats_.post_s += timer.elapsed_s();
}

void GradSync::post(size_t b) {
    const GradBucket& bucket = buckets_.buckets()[b];
    Communicator& comm = group(bucket.group);
    MT_CHECK(comm.size() == bucket.group_size,
             "[grad_sync] bucket {} was planned for a {} group of {} ranks, group '{}' has {}", b,
             replica_group_name(bucket.group), bucket.group_size, comm.name(), comm.size());
    float* data = grads_ + bucket.offset;
    if (bucket.sharded) {
        const float* input = data;
        if (staging_offset_[b] >= 0) {
            float* staging = staging_ + staging_offset_[b];
            backend_.copy(staging, data, static_cast<size_t>(bucket.numel) * sizeof(float));
            input = staging;
        }
        handles_[b] = comm.reduce_scatter_sum_async(shard_grads_ + bucket.shard_offset, input,
                                                    static_cast<size_t>(bucket.shard_numel),
                                                    DType::f32, stream_);
    } else if (comm.size() > 1) {
        handles_[b] =
            comm.all_reduce_sum_async(data, static_cast<size_t>(bucket.numel), DType::f32, stream_);
    }
    posted_[b] = 1;
    stats_.bytes += bucket.numel * static_cast<int64_t>(sizeof(float));
}

void GradSync::finish() {
    MT_CHECK(armed_, "[grad_sync] finish() without arm()");
    const Timer timer;
    const size_t num_buckets = buckets_.buckets().size();
    for (size_t b = 0; b < num_buckets; ++b)
        if (!posted_[b]) post(b);
    for (CollectiveHandle& h : handles_) h.wait();
    armed_ = false;
    stats_.finish_s = timer.elapsed_s();
}

}  // namespace moetron::parallel
