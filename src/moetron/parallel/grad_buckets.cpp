#include "moetron/parallel/grad_buckets.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::parallel {

std::string_view replica_group_name(ReplicaGroup group) {
    return group == ReplicaGroup::data_parallel ? "dp" : "edp";
}

int64_t GradBucket::owned_begin(int rank) const {
    if (!sharded) return 0;
    return std::min(static_cast<int64_t>(rank) * shard_numel, numel);
}

int64_t GradBucket::owned_end(int rank) const {
    if (!sharded) return numel;
    return std::min(static_cast<int64_t>(rank + 1) * shard_numel, numel);
}

namespace {

// Appends the decay runs of [begin, end) (flat offsets) taken from the sorted spans of one run,
// relative to `origin`, merging neighbours with the same setting.
void append_decay_runs(std::vector<DecayRun>& out, std::span<const ParamSpan> run_spans,
                       int64_t begin, int64_t end, int64_t origin) {
    for (const ParamSpan& s : run_spans) {
        const int64_t lo = std::max(begin, s.offset);
        const int64_t hi = std::min(end, s.offset + s.numel);
        if (lo >= hi) continue;
        if (!out.empty() && out.back().weight_decay == s.weight_decay &&
            out.back().offset + out.back().numel == lo - origin) {
            out.back().numel += hi - lo;
        } else {
            out.push_back({lo - origin, hi - lo, s.weight_decay});
        }
    }
}

}  // namespace

GradBuckets::GradBuckets(std::span<const ParamSpan> spans, int64_t num_params,
                         const BucketOptions& options)
    : options_(options), num_params_(num_params) {
    MT_CHECK(options.bucket_numel >= 1, "[grad_buckets] bucket size must be >= 1 float, got {}",
             options.bucket_numel);
    MT_CHECK(options.dp_size >= 1 && options.edp_size >= 1,
             "[grad_buckets] group sizes must be >= 1, got dp {} edp {}", options.dp_size,
             options.edp_size);
    std::vector<ParamSpan> sorted(spans.begin(), spans.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamSpan& a, const ParamSpan& b) { return a.offset < b.offset; });
    for (size_t i = 0; i < sorted.size(); ++i) {
        const ParamSpan& s = sorted[i];
        MT_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= num_params,
                 "[grad_buckets] span [{}, {}) lies outside the {}-float buffer", s.offset,
                 s.offset + s.numel, num_params);
        MT_CHECK(i == 0 || sorted[i - 1].offset + sorted[i - 1].numel <= s.offset,
                 "[grad_buckets] span [{}, {}) overlaps the one before it", s.offset,
                 s.offset + s.numel);
    }

    // Runs: maximal sequences of adjacent trainable spans of one group.
    size_t i = 0;
    while (i < sorted.size()) {
        if (!sorted[i].trainable || sorted[i].numel == 0) {
            ++i;
            continue;
        }
        size_t j = i + 1;
        while (j < sorted.size() && sorted[j].trainable && sorted[j].group == sorted[i].group &&
               sorted[j].copies_outside_group == sorted[i].copies_outside_group &&
               !sorted[j].own_run && !sorted[i].own_run &&
               sorted[j - 1].offset + sorted[j - 1].numel == sorted[j].offset)
            ++j;
        const std::span<const ParamSpan> run(sorted.data() + i, j - i);
        const ReplicaGroup group = sorted[i].group;
        const int64_t run_begin = sorted[i].offset;
        const int64_t run_end = sorted[j - 1].offset + sorted[j - 1].numel;
        const bool sharded = options.zero1;
        const int group_size =
            group == ReplicaGroup::data_parallel ? options.dp_size : options.edp_size;
        // Cuts inside a sharded run on multiples of the group size: only the last bucket pads.
        const int64_t cap =
            sharded ? std::max<int64_t>(group_size, options.bucket_numel / group_size * group_size)
                    : options.bucket_numel;
        for (int64_t begin = run_begin; begin < run_end; begin += cap) {
            GradBucket b;
            b.offset = begin;
            b.numel = std::min(cap, run_end - begin);
            b.group = group;
            b.sharded = sharded;
            b.group_size = group_size;
            b.copies_outside_group = sorted[i].copies_outside_group;
            if (sharded) {
                b.shard_numel = (b.numel + group_size - 1) / group_size;
                b.shard_offset = shard_buffer_numel_;
                shard_buffer_numel_ += b.shard_numel;
            }
            append_decay_runs(b.decay_runs, run, begin, begin + b.numel, begin);
            covered_numel_ += b.numel;
            buckets_.push_back(std::move(b));
        }
        i = j;
    }
}

size_t GradBuckets::first_bucket_ending_after(int64_t offset) const {
    const auto it = std::upper_bound(
        buckets_.begin(), buckets_.end(), offset,
        [](int64_t value, const GradBucket& b) { return value < b.offset + b.numel; });
    return static_cast<size_t>(it - buckets_.begin());
}

std::vector<DecayRun> GradBuckets::owned_decay_runs(const GradBucket& bucket, int rank) {
    const int64_t begin = bucket.owned_begin(rank), end = bucket.owned_end(rank);
    std::vector<DecayRun> out;
    for (const DecayRun& r : bucket.decay_runs) {
        const int64_t lo = std::max(begin, r.offset);
        const int64_t hi = std::min(end, r.offset + r.numel);
        if (lo < hi) out.push_back({lo - begin, hi - lo, r.weight_decay});
    }
    return out;
}

}  // namespace moetron::parallel
