// The bucket layout of data-parallel gradient synchronization: which contiguous ranges of the flat
// gradient buffer travel together in one collective, over which group, and (ZeRO-1) which part of
// each bucket a rank owns. Pure arithmetic on offsets, testable without MPI; grad_sync.h moves the
// bytes and train/optimizer.h updates the owned parts.
//
// Rules:
//  - Only trainable floats travel (the router correction bias has no gradient).
//  - A bucket holds floats of one replica group only: data-parallel (attention, dense MLPs,
//    shared experts, embedding, head, norms: replicated on every rank of the DP group) or
//    expert-data-parallel (routed experts: replicated on the ranks that hold the same experts).
//  - Buckets are contiguous runs of the flat buffer, at most bucket_numel floats each (a run is
//    cut where the group, trainability or copies_outside_group changes, and every bucket_numel
//    floats).
//  - With ZeRO-1 every bucket is sharded over its own group (data-parallel buckets over DP,
//    expert buckets over EDP, as Megatron-Core's distributed optimizer shards expert state over
//    the expert-data-parallel group) and reduce-scattered: bucket of n floats over g ranks, shard
//    size s = ceil(n / g); rank r owns floats [r*s, min((r+1)*s, n)) of the bucket. Cuts inside a
//    run fall on multiples of g so that only a run's last bucket can need padding (n not a multiple
//    of g); such a bucket goes through a staging copy of g*s floats.
//  - Without ZeRO-1 (the replicated baseline) every bucket is all-reduced in place.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace moetron::parallel {

enum class ReplicaGroup : uint8_t {
    data_parallel,         // summed over the DP group
    expert_data_parallel,  // summed over the EDP group (routed experts)
};
std::string_view replica_group_name(ReplicaGroup group);  // "dp", "edp"

// One tensor of the flat parameter (and gradient) buffer.
struct ParamSpan {
    int64_t offset = 0;  // in floats
    int64_t numel = 0;
    ReplicaGroup group = ReplicaGroup::data_parallel;
    bool trainable = true;
    bool weight_decay = true;
    // Ranks outside the group that hold the same copy (a parameter replicated over the TP group:
    // tp). Summing over the group is unchanged; the global gradient norm counts the copy once.
    int copies_outside_group = 1;
    // A run (and buckets) of its own, never merged with its neighbours: a redundant expert's
    // slot, whose copies change when the placement does (AdamW::set_copies_outside_group).
    bool own_run = false;
};

struct BucketOptions {
    int64_t bucket_numel = int64_t{1} << 20;  // floats per bucket at most (4 MiB)
    bool zero1 = false;  // ZeRO-1: shard every bucket over its group (DP buckets, EDP buckets)
    int dp_size = 1;
    int edp_size = 1;
};

// A run of floats inside a bucket or a shard with one weight-decay setting.
struct DecayRun {
    int64_t offset = 0;  // relative to the start of what it describes (bucket or shard)
    int64_t numel = 0;
    bool weight_decay = true;
};

struct GradBucket {
    int64_t offset = 0;  // first float in the flat buffer
    int64_t numel = 0;
    ReplicaGroup group = ReplicaGroup::data_parallel;
    bool sharded = false;              // reduce-scattered (and its parameters all-gathered)
    int group_size = 1;                // ranks of the group it is summed over
    int copies_outside_group = 1;      // as ParamSpan's, the same for every span of the bucket
    int64_t shard_numel = 0;           // s (sharded only): ceil(numel / group_size)
    int64_t shard_offset = 0;          // where this bucket's shard sits in the rank's shard buffer
    std::vector<DecayRun> decay_runs;  // covering [0, numel) of the bucket

    bool padded() const { return sharded && shard_numel * group_size != numel; }
    // Floats of the bucket that group rank `rank` owns: [owned_begin, owned_end), bucket-relative.
    int64_t owned_begin(int rank) const;
    int64_t owned_end(int rank) const;
};

class GradBuckets {
  public:
    // spans may come in any order but must not overlap and must lie inside [0, num_params).
    // Throws moetron::Error naming the span otherwise, or for a bad option.
    GradBuckets(std::span<const ParamSpan> spans, int64_t num_params, const BucketOptions& options);

    const std::vector<GradBucket>& buckets() const { return buckets_; }
    const BucketOptions& options() const { return options_; }
    int64_t num_params() const { return num_params_; }
    // Floats of the rank's shard buffer: the sum of the sharded buckets' shard sizes.
    int64_t shard_buffer_numel() const { return shard_buffer_numel_; }
    // Floats that buckets cover (the trainable ones).
    int64_t covered_numel() const { return covered_numel_; }

    // Index of the first bucket that ends after float `offset` (buckets.size() if none): the
    // buckets overlapping [begin, end) are those from first_bucket_ending_after(begin) while
    // their offset < end.
    size_t first_bucket_ending_after(int64_t offset) const;

    // The decay runs of the part of a sharded bucket that `rank` owns, shard-relative.
    static std::vector<DecayRun> owned_decay_runs(const GradBucket& bucket, int rank);

  private:
    BucketOptions options_;
    int64_t num_params_ = 0;
    int64_t shard_buffer_numel_ = 0;
    int64_t covered_numel_ = 0;
    std::vector<GradBucket> buckets_;
};

}  // namespace moetron::parallel
