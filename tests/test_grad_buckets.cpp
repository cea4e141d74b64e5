// Single-process pieces of distributed training: the gradient bucket layout (grad_buckets.h),
// GradSync and AdamW (train/optimizer.h) over one-rank groups, the model's gradient-readiness
// notifications and its loss denominators (the normalization that makes N ranks' gradients add up
// to one rank's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/model/model.h"
#include "moetron/parallel/grad_buckets.h"
#include "moetron/parallel/grad_sync.h"
#include "moetron/parallel/local_communicator.h"
#include "moetron/train/optimizer.h"
#include "testing.h"

namespace moetron {
namespace {

using parallel::BucketOptions;
using parallel::GradBucket;
using parallel::GradBuckets;
using parallel::ParamSpan;
using parallel::ReplicaGroup;

constexpr ReplicaGroup kDp = ReplicaGroup::data_parallel;
constexpr ReplicaGroup kEdp = ReplicaGroup::expert_data_parallel;

// A small buffer of 100 floats: dp [0,10) decayed, dp [10,14) not decayed (a norm), a frozen
// bias [14,16), edp [16,56) (experts), dp [56,100).
std::vector<ParamSpan> toy_spans() {
    return {{0, 10, kDp, true, true},   {10, 4, kDp, true, false},  {14, 2, kDp, false, false},
            {16, 20, kEdp, true, true}, {36, 20, kEdp, true, true}, {56, 44, kDp, true, true}};
}

// Every trainable float lies in exactly one bucket, of its span's group, and buckets respect the
// size cap.
void expect_tiles_trainable_floats(const GradBuckets& layout, const std::vector<ParamSpan>& spans,
                                   int64_t cap) {
    std::vector<int> cover(static_cast<size_t>(layout.num_params()), 0);
    for (const GradBucket& b : layout.buckets()) {
        EXPECT_LE(b.numel, cap);
        EXPECT_GT(b.numel, 0);
        for (int64_t i = b.offset; i < b.offset + b.numel; ++i) ++cover[static_cast<size_t>(i)];
        int64_t decay_numel = 0;
        for (const parallel::DecayRun& r : b.decay_runs) decay_numel += r.numel;
        EXPECT_EQ(decay_numel, b.numel);
    }
    for (const ParamSpan& s : spans) {
        for (int64_t i = s.offset; i < s.offset + s.numel; ++i)
            EXPECT_EQ(cover[static_cast<size_t>(i)], s.trainable ? 1 : 0) << "float " << i;
    }
    for (const GradBucket& b : layout.buckets()) {
        for (const ParamSpan& s : spans) {
            if (s.offset < b.offset + b.numel && b.offset < s.offset + s.numel) {
                EXPECT_EQ(s.group, b.group) << "bucket at " << b.offset;
            }
        }
    }
}

TEST(GradBuckets, RunsSplitAtGroupAndFrozenBoundariesAndAtTheCap) {
    const auto spans = toy_spans();
    BucketOptions o;
    o.bucket_numel = 16;
    const GradBuckets layout(spans, 100, o);
    expect_tiles_trainable_floats(layout, spans, 16);
    // dp [0,14) in one bucket; edp [16,56) in 16+16+8; dp [56,100) in 16+16+12.
    std::vector<int64_t> offsets;
    for (const GradBucket& b : layout.buckets()) offsets.push_back(b.offset);
    EXPECT_EQ(offsets, (std::vector<int64_t>{0, 16, 32, 48, 56, 72, 88}));
    const GradBucket& first = layout.buckets()[0];
    EXPECT_EQ(first.numel, 14);
    ASSERT_EQ(first.decay_runs.size(), 2u);
    EXPECT_TRUE(first.decay_runs[0].weight_decay);
    EXPECT_EQ(first.decay_runs[1].offset, 10);
    EXPECT_FALSE(first.decay_runs[1].weight_decay);
    EXPECT_EQ(layout.covered_numel(), 98);
    EXPECT_EQ(layout.shard_buffer_numel(), 0);
    // The lookup the readiness tracking uses.
    EXPECT_EQ(layout.first_bucket_ending_after(0), 0u);
    EXPECT_EQ(layout.first_bucket_ending_after(14), 1u);  // the frozen bias: next bucket
    EXPECT_EQ(layout.first_bucket_ending_after(55), 3u);
    EXPECT_EQ(layout.first_bucket_ending_after(100), layout.buckets().size());
}

// ZeRO-1 shards both groups: the data-parallel buckets over dp, the expert buckets over edp.
TEST(GradBuckets, ShardedBucketsCutOnMultiplesOfTheGroupAndOwnDisjointParts) {
    const auto spans = toy_spans();
    BucketOptions o;
    o.bucket_numel = 10;  // rounded down to 9 for dp 3, kept at 10 for edp 2
    o.zero1 = true;
    o.dp_size = 3;
    o.edp_size = 2;
    const GradBuckets layout(spans, 100, o);
    expect_tiles_trainable_floats(layout, spans, 10);
    int64_t shard_offset = 0, edp_shard_numel = 0;
    for (const GradBucket& b : layout.buckets()) {
        const int g = b.group == kDp ? 3 : 2;
        ASSERT_TRUE(b.sharded);
        EXPECT_EQ(b.group_size, g);
        EXPECT_EQ(b.shard_offset, shard_offset);
        shard_offset += b.shard_numel;
        if (b.group == kEdp) edp_shard_numel += b.shard_numel;
        EXPECT_EQ(b.shard_numel, (b.numel + g - 1) / g);
        const int64_t end = b.offset + b.numel;
        const bool last_of_run = end == 14 || end == 56 || end == 100;
        if (!last_of_run) {
            EXPECT_EQ(b.numel % g, 0) << "bucket at " << b.offset;
        }
        // The owned parts tile the bucket, in rank order; their decay runs tile the owned part.
        int64_t next = 0;
        for (int r = 0; r < g; ++r) {
            EXPECT_EQ(b.owned_begin(r), std::min(next, b.numel));
            next = b.owned_end(r);
            int64_t owned = 0;
            for (const parallel::DecayRun& run : GradBuckets::owned_decay_runs(b, r)) {
                EXPECT_EQ(run.offset, owned);
                owned += run.numel;
            }
            EXPECT_EQ(owned, b.owned_end(r) - b.owned_begin(r));
        }
        EXPECT_EQ(next, b.numel);
    }
    EXPECT_EQ(layout.shard_buffer_numel(), shard_offset);
    // The 40 expert floats: 20 per edp rank, half of the replicated 40.
    EXPECT_EQ(edp_shard_numel, 20);
    // dp run [0,14): buckets of 9 and 5 (5 pads to 6); dp run [56,100): 9*4 + 8 (pads to 9).
    const GradBucket& tail = layout.buckets()[1];
    EXPECT_EQ(tail.numel, 5);
    EXPECT_TRUE(tail.padded());
    // Shard size 2: rank 2 owns [4,5) of it, one float of the undecayed norm.
    EXPECT_EQ(tail.owned_begin(2), 4);
    EXPECT_EQ(tail.owned_end(2), 5);
    const auto runs = GradBuckets::owned_decay_runs(tail, 2);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].numel, 1);
    EXPECT_FALSE(runs[0].weight_decay);
}

// A tensor-parallel model mixes TP-split spans (one copy each) and TP-replicated ones (tp
// copies): a bucket never mixes the two, so the global norm can count each copy once.
TEST(GradBuckets, CutWhereTheCopiesOutsideTheGroupChange) {
    const std::vector<ParamSpan> spans{
        {0, 10, kDp, true, true, 2}, {10, 6, kDp, true, true, 1}, {16, 4, kDp, true, false, 1}};
    BucketOptions o;
    o.dp_size = 2;
    o.zero1 = true;
    const GradBuckets layout(spans, 20, o);
    ASSERT_EQ(layout.buckets().size(), 2u);
    EXPECT_EQ(layout.buckets()[0].numel, 10);
    EXPECT_EQ(layout.buckets()[0].copies_outside_group, 2);
    EXPECT_EQ(layout.buckets()[1].offset, 10);
    EXPECT_EQ(layout.buckets()[1].numel, 10);
    EXPECT_EQ(layout.buckets()[1].copies_outside_group, 1);
}

TEST(GradBuckets, BadSpansAreNamed) {
    BucketOptions o;
    const std::vector<ParamSpan> overlapping{{0, 10, kDp, true, true}, {5, 10, kDp, true, true}};
    EXPECT_THROW(GradBuckets(overlapping, 20, o), Error);
    const std::vector<ParamSpan> outside{{15, 10, kDp, true, true}};
    EXPECT_THROW(GradBuckets(outside, 20, o), Error);
    o.bucket_numel = 0;
    EXPECT_THROW(GradBuckets(std::vector<ParamSpan>{}, 0, o), Error);
}

// ---- GradSync and AdamW on groups of one rank ----

TEST(GradSync, PostsABucketOnceItsLastFloatIsReady) {
    const auto spans = toy_spans();
    std::vector<float> grads = testing::random_floats(100, 1);
    parallel::LocalCommunicator dp("dp"), edp("edp");
    parallel::GradSyncOptions o;
    o.bucket_bytes = 16 * sizeof(float);
    o.zero1 = true;
    parallel::GradSync sync(spans, 100, grads.data(), dp, edp, o, cpu_backend());

    sync.grads_ready(0, 100);  // not armed: ignored
    sync.arm();
    sync.grads_ready(56, 80);  // completes the bucket [56,72) only
    EXPECT_EQ(sync.last_stats().buckets_posted_in_backward, 1);
    sync.grads_ready(80, 100);
    sync.grads_ready(0, 56);
    EXPECT_EQ(sync.last_stats().buckets_posted_in_backward, 7);
    EXPECT_THROW(sync.grads_ready(3, 4), Error);  // reported twice
    sync.finish();
    // One rank: the shards are the gradients.
    for (const GradBucket& b : sync.buckets().buckets()) {
        if (!b.sharded) continue;
        for (int64_t i = 0; i < b.numel; ++i)
            EXPECT_EQ(sync.shard_grads()[b.shard_offset + i], grads[b.offset + i]);
    }

    parallel::GradSyncOptions no_overlap = o;
    no_overlap.overlap = false;
    parallel::GradSync late(spans, 100, grads.data(), dp, edp, no_overlap, cpu_backend());
    late.arm();
    late.grads_ready(0, 100);
    EXPECT_EQ(late.last_stats().buckets_posted_in_backward, 0);
    late.finish();
    EXPECT_EQ(late.last_stats().num_buckets, 7);
}

// The reference: the clipping and AdamW step, tensor by tensor. Returns the
// norm before clipping.
double reference_adamw_step(std::vector<float>& params, std::vector<float>& m,
                            std::vector<float>& v, std::vector<float>& grads,
                            const std::vector<ParamSpan>& spans, const AdamWConfig& c, double lr,
                            int64_t step) {
    double sum = 0;
    for (const ParamSpan& s : spans)
        if (s.trainable) sum += cpu::sum_squares(grads.data() + s.offset, s.numel);
    const double norm = std::sqrt(sum);
    const float factor = cpu::clip_factor(norm, static_cast<float>(c.grad_clip));
    for (const ParamSpan& s : spans) {
        if (!s.trainable) continue;
        cpu::scale_inplace(grads.data() + s.offset, s.numel, factor);
        const cpu::AdamWParams hp{static_cast<float>(lr),
                                  static_cast<float>(c.beta1),
                                  static_cast<float>(c.beta2),
                                  static_cast<float>(c.eps),
                                  s.weight_decay ? static_cast<float>(c.weight_decay) : 0.0f,
                                  step};
        cpu::adamw_update(params.data() + s.offset, m.data() + s.offset, v.data() + s.offset,
                          grads.data() + s.offset, s.numel, hp);
    }
    return norm;
}

TEST(AdamW, OneRankMatchesThePerTensorReferenceShardedOrNot) {
    const auto spans = toy_spans();
    AdamWConfig config;
    config.grad_clip = 0.5;  // the random gradients have norm ~10: clipping is active
    config.grad_sync.bucket_bytes = 12 * sizeof(float);
    for (const bool sharded : {false, true}) {
        parallel::LocalCommunicator world("world"), dp("dp"), edp("edp");
        std::vector<float> params = testing::random_floats(100, 2);
        std::vector<float> ref_params = params, m(100, 0.0f), v(100, 0.0f);
        std::vector<float> grads(100);
        config.grad_sync.zero1 = sharded;
        AdamW opt(spans, 100, grads.data(), {world, dp, edp}, config);
        parallel::GradSync& sync = opt.grad_sync();
        for (int64_t step = 1; step <= 3; ++step) {
            // Copy into the buffer GradSync holds (assigning a new vector would free it).
            const std::vector<float> fresh =
                testing::random_floats(100, 10 + static_cast<uint64_t>(step));
            std::copy(fresh.begin(), fresh.end(), grads.begin());
            std::vector<float> ref_grads = grads;
            sync.arm();
            sync.finish();
            const double norm = opt.clip_gradients(grads.data());
            opt.step(params.data(), grads.data(), 1e-2);
            const double ref_norm =
                reference_adamw_step(ref_params, m, v, ref_grads, spans, config, 1e-2, step);
            EXPECT_NEAR(norm, ref_norm, 1e-9 * ref_norm);
            EXPECT_GT(norm, 2 * config.grad_clip);
        }
        testing::expect_close("adamw", sharded ? "zero1 one rank" : "replicated",
                              testing::compare(params.data(), ref_params.data(), 100), 1e-6);
        EXPECT_EQ(params[14], ref_params[14]);                    // the frozen bias is untouched
        EXPECT_NE(params[0], testing::random_floats(100, 2)[0]);  // and the rest moved
    }
}

// post_step() leaves the parameter all-gathers in flight: until finish_param_gathers(), whatever
// would read the parameters (the optimizer's own calls) refuses; afterwards the result is step()'s.
TEST(AdamW, NothingReadsTheParametersWhileTheirGathersAreInFlight) {
    const auto spans = toy_spans();
    parallel::LocalCommunicator world("world"), dp("dp"), edp("edp");
    std::vector<float> grads = testing::random_floats(100, 3);
    const std::vector<float> start = testing::random_floats(100, 4);
    AdamWConfig config;
    config.grad_sync.bucket_bytes = 12 * sizeof(float);
    config.grad_sync.zero1 = true;
    AdamW posted(spans, 100, grads.data(), {world, dp, edp}, config);
    AdamW whole(spans, 100, grads.data(), {world, dp, edp}, config);
    std::vector<float> a = start, b = start;
    for (AdamW* opt : {&posted, &whole}) {
        opt->grad_sync().arm();
        opt->grad_sync().finish();
    }
    whole.step(b.data(), grads.data(), 1e-2);
    EXPECT_FALSE(whole.params_in_flight());
    posted.post_step(a.data(), grads.data(), 1e-2);
    EXPECT_TRUE(posted.params_in_flight());
    EXPECT_THROW(posted.clip_gradients(grads.data()), Error);
    EXPECT_THROW(posted.post_step(a.data(), grads.data(), 1e-2), Error);
    EXPECT_THROW(posted.moment_ranges(), Error);
    posted.finish_param_gathers();
    EXPECT_FALSE(posted.params_in_flight());
    posted.finish_param_gathers();  // nothing in flight: a no-op
    EXPECT_EQ(a, b);
    EXPECT_EQ(posted.step_count(), 1);
}

// ---- the model's side: readiness notifications and loss denominators ----

ModelConfig tiny_config() {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
}

constexpr int64_t kBatch = 4;
constexpr int64_t kSeq = 16;

struct Batch {
    std::vector<int32_t> tokens, targets;
};

// Next-token targets with -1 at each sequence end and a few more in the first sequences only, so
// that the micro-batches of a split have different valid counts.
Batch make_batch(const ModelConfig& c, uint64_t seed) {
    Batch b;
    RngStream rng(seed, 3);
    b.tokens.resize(kBatch * kSeq);
    for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng.next_below(c.vocab_size));
    b.targets.assign(b.tokens.size(), -1);
    for (int64_t s = 0; s < kBatch; ++s)
        for (int64_t t = 0; t + 1 < kSeq; ++t) b.targets[s * kSeq + t] = b.tokens[s * kSeq + t + 1];
    for (int i : {2, 5, 6, 9, 20}) b.targets[i] = -1;
    return b;
}

TEST(ModelGradReady, RangesTileTheBufferInBackwardOrderAndAreFinal) {
    const ModelConfig c = tiny_config();
    Model model(c, {kBatch, kSeq}, {0.3f, 1e-4f});
    model.init_parameters(5);
    const Batch b = make_batch(c, 1);
    struct Ready {
        int64_t begin, end;
        std::vector<float> snapshot;
    };
    std::vector<Ready> ready;
    model.set_grad_ready_callback([&](int64_t begin, int64_t end) {
        ready.push_back({begin, end, {model.grads() + begin, model.grads() + end}});
    });
    model.zero_grads();
    model.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, 1.0f);

    const int64_t head = model.param("head").ptr<float>() - model.params();
    ASSERT_GE(ready.size(), 4u);
    EXPECT_LE(ready.front().begin, head);  // the head first ...
    EXPECT_GT(ready.front().end, head);
    EXPECT_EQ(ready.back().begin, 0);  // ... the embedding last
    std::vector<int> cover(static_cast<size_t>(model.num_params()), 0);
    for (const Ready& r : ready) {
        for (int64_t i = r.begin; i < r.end; ++i) ++cover[static_cast<size_t>(i)];
        // Nothing wrote these gradients after they were announced.
        EXPECT_TRUE(std::equal(r.snapshot.begin(), r.snapshot.end(), model.grads() + r.begin))
            << "range [" << r.begin << ", " << r.end << ")";
    }
    EXPECT_TRUE(std::all_of(cover.begin(), cover.end(), [](int x) { return x == 1; }));

    ready.clear();
    model.forward(b.tokens.data(), b.targets.data(), kBatch, kSeq);
    EXPECT_TRUE(ready.empty());
    model.set_grad_ready_callback(nullptr);
    model.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, 1.0f);
    EXPECT_TRUE(ready.empty());
}

TEST(ModelLossDenominators, SlicesNormalizedByTheWholeBatchAddUpToIt) {
    const ModelConfig c = tiny_config();
    const LossWeights weights{0.3f, 0.01f};  // a balance weight large enough to matter
    Model whole(c, {kBatch, kSeq}, weights), sliced(c, {kBatch, kSeq}, weights);
    whole.init_parameters(7);
    sliced.init_parameters(7);
    const Batch b = make_batch(c, 2);

    whole.zero_grads();
    const MicroBatchLosses full =
        whole.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, 1.0f);
    const LossDenominators den = count_loss_denominators(c, b.targets.data(), kBatch, kSeq);
    EXPECT_EQ(den.lm_tokens, full.num_tokens);
    EXPECT_EQ(den.sequences, kBatch);

    // Uneven slices: 1 and 3 sequences, the first holding most of the masked targets.
    sliced.zero_grads();
    MicroBatchLosses sum;
    LossDenominators counted;
    int64_t first = 0;
    for (const int64_t rows : {int64_t{1}, int64_t{3}}) {
        const int32_t* tokens = b.tokens.data() + first * kSeq;
        const int32_t* targets = b.targets.data() + first * kSeq;
        const MicroBatchLosses part =
            sliced.forward_backward(tokens, targets, rows, kSeq, 1.0f, den);
        sum.lm_loss += part.lm_loss;
        sum.mtp_loss += part.mtp_loss;
        sum.balance_loss += part.balance_loss;
        counted += count_loss_denominators(c, targets, rows, kSeq);
        first += rows;
    }
    EXPECT_EQ(counted.lm_tokens, den.lm_tokens);
    EXPECT_EQ(counted.mtp_tokens, den.mtp_tokens);
    EXPECT_NEAR(sum.lm_loss, full.lm_loss, 1e-6 * full.lm_loss);
    EXPECT_NEAR(sum.mtp_loss, full.mtp_loss, 1e-6 * full.mtp_loss);
    EXPECT_NEAR(sum.balance_loss, full.balance_loss, 1e-6 * full.balance_loss);
    testing::expect_close("loss_denominators", "sliced gradients vs whole batch",
                          testing::compare(sliced.grads(), whole.grads(),
                                           static_cast<size_t>(whole.num_params()), 1e-3),
                          1e-4);

    // Denominators smaller than the micro-batch's own counts are a mistake, named.
    LossDenominators too_small = den;
    too_small.lm_tokens = 1;
    EXPECT_THROW(
        sliced.forward_backward(b.tokens.data(), b.targets.data(), kBatch, kSeq, 1.0f, too_small),
        Error);
}

TEST(ModelParamSpans, ExpertsAreExpertDataParallelAndTheBiasFrozen) {
    const ModelConfig c = tiny_config();
    Model model(c, {1, 8}, {});
    const std::vector<ParamSpan> spans = model.param_spans();
    ASSERT_EQ(spans.size(), model.param_entries().size());
    int experts = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
        const ParamEntry& e = model.param_entries()[i];
        EXPECT_EQ(spans[i].offset, e.offset);
        EXPECT_EQ(spans[i].trainable, e.trainable);
        const bool expert = e.name.find(".experts.") != std::string::npos;
        experts += expert;
        EXPECT_EQ(spans[i].group, expert ? kEdp : kDp) << e.name;
    }
    EXPECT_EQ(experts, 2 * 3);  // gate_up and down of layers 1, 2 and the MTP block
    EXPECT_EQ(model.expert_shard().local_experts(c.n_routed_experts), c.n_routed_experts);
}

}  // namespace
}  // namespace moetron
