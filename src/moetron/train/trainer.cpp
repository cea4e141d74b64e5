#include "moetron/train/trainer.h"

#include <sys/resource.h>

#include <array>
#include <climits>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/backend.h"
#include "moetron/model/flops.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/pipeline_layout.h"
#include "moetron/parallel/local_communicator.h"
#include "moetron/train/checkpoint.h"

namespace moetron {

namespace {

// Where the model sits in the job: this rank's pipeline chunks and their activation sets, its
// groups, the plan's MoE settings.
ModelParallel model_parallel(parallel::ParallelGroups& groups, parallel::Communicator& world,
                             const RunPlan& plan) {
    ModelParallel mp;
    if (plan.pipelined()) {
        const int stage = groups.pp->rank();
        mp.pipeline_chunks = plan.stage_chunks(stage);
        mp.pipeline_in_flight = plan.stage_in_flight(stage);
    }
    mp.ep = groups.ep.get();
    mp.tp = groups.tp.get();
    mp.load = &world;  // every rank routes tokens of its own (TP ranks: their share of them)
    mp.moe = plan.moe;
    mp.ep_rail = groups.ep_rail.get();
    mp.ep_domain = groups.ep_domain.get();
    return mp;
}

std::unique_ptr<Model> make_model(const ModelConfig& model_config, const TrainConfig& config,
                                  const RunPlan& plan, const ModelParallel& parallel,
                                  Backend& backend, SplitBackwardBackend* split) {
    ModelRuntime runtime;
    runtime.batch_size = plan.rank_rows;
    runtime.seq_len = config.seq_len;
    // zb-h1: the model's ops split their backwards, but for the GEMMs that stay whole.
    runtime.backend = split != nullptr ? static_cast<Backend*>(split) : &backend;
    runtime.whole_backward = &backend;
    runtime.precision = plan.precision;
    LossWeights weights;
    weights.mtp_lambda = static_cast<float>(config.mtp_lambda);
    weights.balance_alpha = static_cast<float>(config.balance_loss_alpha);
    auto model = std::make_unique<Model>(model_config, runtime, weights, parallel);
    model->init_parameters(config.seed);
    return model;
}

AdamWConfig adamw_config(const TrainConfig& c, const RunPlan& plan) {
    AdamWConfig a;
    a.beta1 = c.beta1;
    a.beta2 = c.beta2;
    a.eps = c.eps;
    a.weight_decay = c.weight_decay;
    a.grad_clip = c.grad_clip;
    a.grad_sync.bucket_bytes = plan.bucket_bytes;
    a.grad_sync.zero1 = plan.zero1;
    a.grad_sync.overlap = plan.overlap_dp_grad;
    return a;
}

// zb-h1 splits each backward in two: the model then runs on a SplitBackwardBackend over backend.
std::unique_ptr<SplitBackwardBackend> split_backward_for(const RunPlan& plan, Backend& backend) {
    if (!plan.split_backward) return nullptr;
    return std::make_unique<SplitBackwardBackend>(backend);
}

// The job's groups, each wrapped so that its collectives are timed and traced.
parallel::ParallelGroups make_traced_groups(parallel::Communicator& world,
                                            const parallel::Topology& topology,
                                            parallel::CommWaitTotals* totals,
                                            TraceRecorder* recorder) {
    parallel::ParallelGroups groups = parallel::build_groups(world, topology);
    parallel::trace_groups(groups, totals, recorder);
    return groups;
}

// The dispatcher's bytes per tier and domains per token, for the step's record.
void record_dispatch_stats(StepRecord& r, const parallel::DispatchStats& s) {
    r.dispatch_intra_domain_bytes = static_cast<double>(s.bytes.intra_domain);
    r.dispatch_inter_domain_bytes = static_cast<double>(s.bytes.inter_domain);
    if (s.spread.num_tokens > 0)
        r.domains_per_token_mean =
            static_cast<double>(s.spread.domain_sum) / static_cast<double>(s.spread.num_tokens);
    r.domains_per_token_max = static_cast<double>(s.spread.domain_max);
    r.moe_overflowed_layers = s.overflowed_plans;
    r.moe_extra_rounds = s.extra_rounds;
}

// Sums a few doubles over the data-parallel group, and over the pipeline stages (each holds its
// blocks' share: the losses on the last, the balance losses where the MoE layers are).
template <size_t N>
void sum_over_ranks(parallel::ParallelGroups& groups, std::array<double, N>& values) {
    groups.dp->all_reduce_sum(std::span<double>(values), kHostStream);
    if (groups.pp->size() > 1) groups.pp->all_reduce_sum(std::span<double>(values), kHostStream);
}

// The world a trainer runs in: the job's, or (one process) a world of one that it owns.
std::unique_ptr<parallel::Communicator> own_world_unless_given(parallel::Communicator* world) {
    if (world != nullptr) return nullptr;
    return std::make_unique<parallel::LocalCommunicator>("world");
}

}  // namespace

Trainer::Trainer(const ModelConfig& model_config, const TrainConfig& config, DataLoader loader)
    : Trainer(model_config, config, std::move(loader), plan_run(model_config, config, {}, 1)) {}

Trainer::Trainer(const ModelConfig& model_config, const TrainConfig& config, DataLoader loader,
                 const RunPlan& plan, parallel::Communicator* world, Backend& backend)
    : config_(config),
      plan_(plan),
      own_world_(own_world_unless_given(world)),
      world_(world != nullptr ? world : own_world_.get()),
      groups_(make_traced_groups(*world_, plan_.topology, &comm_wait_, &trace_)),
      loader_(std::move(loader)),
      split_backward_(split_backward_for(plan_, backend)),
      model_(make_model(model_config, config, plan_, model_parallel(groups_, *world_, plan_),
                        backend, split_backward_.get())),
      schedule_(config.lr, config.min_lr, config.warmup_steps, config.steps),
      tokens_(static_cast<size_t>(config.grad_accum * config.batch_size * config.seq_len)),
      targets_(tokens_.size()) {
    MT_CHECK(world_->size() == plan_.topology.world_size && plan_.grad_accum == config.grad_accum &&
                 plan_.rank_rows * plan_.topology.dp == config.batch_size,
             "[train] the plan ({} ranks, {} x {} sequences) is not this run's ({} ranks, {} x {})",
             plan_.topology.world_size, plan_.grad_accum, plan_.rank_rows * plan_.topology.dp,
             world_->size(), config.grad_accum, config.batch_size);
    MT_CHECK(loader_.seq_len() == config.seq_len,
             "[train] the data loader cuts windows of {} tokens, the run wants seq_len {}",
             loader_.seq_len(), config.seq_len);
    rank_rows_ = plan_.rank_rows;
    first_rank_row_ = groups_.dp->rank() * rank_rows_;
    const std::vector<parallel::ParamSpan> spans = model_->param_spans();
    optimizer_ = std::make_unique<AdamW>(spans, model_->num_params(), model_->grads(),
                                         AdamWGroups{*world_, *groups_.dp, *groups_.edp},
                                         adamw_config(config, plan_), backend);
    model_->set_grad_ready_callback([sync = &optimizer_->grad_sync()](int64_t begin, int64_t end) {
        sync->grads_ready(begin, end);
    });
    if (model_config.n_routed_experts > 0 && groups_.ep->size() > 1)
        balancer_ = std::make_unique<ExpertBalancer>(*model_, *optimizer_, *groups_.ep,
                                                     *groups_.edp, plan_.moe.rebalance_every);
    if (plan_.pipelined())
        pipeline_ = std::make_unique<PipelineRunner>(*model_, *groups_.pp, plan_.schedule,
                                                     config.grad_accum, rank_rows_, config.seq_len,
                                                     &trace_, split_backward_.get());
    const bool has_mtp = model_config.num_nextn_predict_layers > 0;
    model_flops_per_step_ = flops_per_token(model_config, config.seq_len, has_mtp).total *
                            static_cast<double>(config.tokens_per_step());
    run_id_ = new_run_id();
    world_->broadcast(run_id_.data(), run_id_.size(), DType::u8, 0,
                      kHostStream);  // one run: rank 0's id
}

int64_t Trainer::optimizer_state_numel() const {
    return optimizer_->state_numel();
}

parallel::GradSyncStats Trainer::last_sync_stats() const {
    return optimizer_->grad_sync().last_stats();
}

// One optimizer step, as a story: the batch, every micro-batch's forward and backward, the
// gradient sync, the losses, clipping, the update, and what follows an update (router bias,
// parameter gathers, expert rebalance); the diagnostics of the record come after it.
StepRecord Trainer::step() {
    StepRecord r;
    Timer timer;
    begin_step();
    const LossDenominators den = load_step_batch();
    std::array<double, 3> losses = forward_backward_all(den);  // this rank's lm, mtp, balance
    optimizer_->grad_sync().finish();
    const double expert_compute_s = model_->take_expert_compute_s();  // this step's
    if (const parallel::ExpertDispatcher* d = model_->expert_dispatcher())
        record_dispatch_stats(r, d->stats());
    sum_over_ranks(groups_, losses);
    r.loss = losses[0];
    r.mtp_loss = losses[1];
    r.balance_loss = losses[2];

    r.step = steps_done_ + 1;
    if (grad_hook_) grad_hook_(r.step, model_->grads());
    r.grad_norm = optimizer_->clip_gradients(model_->grads());
    r.lr = schedule_.lr_at(steps_done_);
    last_loss_ = r.loss;
    if (skip_unless_finite(r)) {
        r.step_s = timer.elapsed_s();
        return r;
    }
    update_parameters(r.lr);
    double compute_s = timer.elapsed_s();

    // The loads must be read before the bias update resets them; expert_load() allocates, so it
    // stays outside the timed part.
    const ExpertLoadStats load = model_->expert_load();
    r.expert_load_max_over_mean = load.max_over_mean;
    r.expert_load_min_over_mean = load.min_over_mean;
    if (pipeline_ != nullptr) record_stage_times(r);
    timer.reset();
    after_update(r, load, expert_compute_s);
    compute_s += timer.elapsed_s();
    record_time_and_throughput(r, compute_s);
    return r;
}

void Trainer::begin_step() {
    comm_wait_ = {};
    parallel::reset_group_counters(groups_);
    model_->zero_grads();
    model_->take_expert_compute_s();  // from here: this step's (not an evaluation's)
    if (parallel::ExpertDispatcher* d = model_->expert_dispatcher()) d->reset_stats();
}

// The whole step's batch first: its counts normalize every micro-batch, so the step's loss is the
// mean over all its valid tokens however it is split over micro-batches and ranks.
LossDenominators Trainer::load_step_batch() {
    const int64_t B = config_.batch_size, S = config_.seq_len, micro_tokens = B * S;
    {
        const TraceScope scope(&trace_, "load batch");
        for (int64_t micro = 0; micro < config_.grad_accum; ++micro)
            loader_.next_train_batch(tokens_.data() + micro * micro_tokens,
                                     targets_.data() + micro * micro_tokens, B);
    }
    return count_loss_denominators(model_->config(), targets_.data(), config_.grad_accum * B, S);
}

// Every micro-batch's forward and backward (through the pipeline's schedule when there is one),
// the gradient sync armed for the last backward. Returns this rank's shares of the losses.
std::array<double, 3> Trainer::forward_backward_all(const LossDenominators& den) {
    const int64_t S = config_.seq_len, micro_tokens = config_.batch_size * S;
    if (pipeline_ != nullptr) {
        const int64_t first = first_rank_row_ * S;
        return pipeline_->train_step(tokens_.data() + first, targets_.data() + first, micro_tokens,
                                     den, [this] { optimizer_->grad_sync().arm(); });
    }
    std::array<double, 3> losses{};
    for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
        if (micro + 1 == config_.grad_accum) {
            optimizer_->grad_sync().arm();
            model_->arm_replica_gradient_sum();  // redundant experts: replicas sum their parts
        }
        const int64_t first = micro * micro_tokens + first_rank_row_ * S;
        const TraceScope scope(&trace_, "forward + backward");
        const MicroBatchLosses l = model_->forward_backward(
            tokens_.data() + first, targets_.data() + first, rank_rows_, S, 1.0f, den);
        losses[0] += l.lm_loss;
        losses[1] += l.mtp_loss;
        losses[2] += l.balance_loss;
    }
    return losses;
}

// A non-finite loss or norm skips the update: parameters, moments and router bias stay those of
// the last good step, while the data and the schedule move on (the step is counted). Every rank
// sees the same summed loss and global norm, so they all skip together.
bool Trainer::skip_unless_finite(const StepRecord& r) {
    last_step_skipped_ = !(std::isfinite(r.loss) && std::isfinite(r.grad_norm));
    if (!last_step_skipped_) {
        consecutive_skipped_ = 0;
        return false;
    }
    ++skipped_steps_;
    ++consecutive_skipped_;
    ++steps_done_;
    // gamma 0 resets the load counts (a collective when distributed) and moves no bias.
    model_->update_router_bias(0.0f);
    MT_CHECK(consecutive_skipped_ < max_skipped_steps_,
             "[train] step {}: {} steps in a row had a non-finite loss or gradient norm (loss {}, "
             "gradient norm {}); stopping. Last good checkpoint: {}. Try a lower --lr or a "
             "smaller grad_clip",
             r.step, consecutive_skipped_, r.loss, r.grad_norm,
             last_checkpoint_.empty() ? std::string("none") : last_checkpoint_);
    return true;
}

void Trainer::update_parameters(double lr) {
    {
        const TraceScope scope(&trace_, "optimizer");
        // Returns with the parameter all-gathers in flight; they are waited for at the end of
        // the step (after_update), so no parameter is read before they land.
        optimizer_->post_step(model_->params(), model_->grads(), lr);
    }
    ++steps_done_;
    // The loads of every rank, so that the logged balance is the job's.
    model_->sum_expert_load_over_ranks();
}

void Trainer::after_update(StepRecord& r, const ExpertLoadStats& load, double expert_compute_s) {
    model_->update_router_bias(static_cast<float>(config_.bias_update_speed));
    {
        // The router bias is not trainable, so no gather writes it; the parameters are whole
        // again before step() returns (the next forward, an evaluation or a checkpoint).
        const TraceScope scope(&trace_, "parameter all-gather wait");
        optimizer_->finish_param_gathers();
    }
    if (!balancer_) return;
    // After the gathers: a rebalance rewrites expert slots' weights and moments. Timed with the
    // step: its gathers of the loads are blocked time of the step (comm_wait_), and a step record
    // whose waits outran its time read negative compute (CI, 4 ranks).
    const TraceScope scope(&trace_, "expert rebalance");
    BalanceRecord b = balancer_->after_step(steps_done_, load, expert_compute_s);
    r.rank_load_max_over_mean = b.rank_load_max_over_mean;
    r.expert_compute_max_s = b.expert_compute_max_s;
    r.expert_compute_mean_s = b.expert_compute_mean_s;
    r.rebalanced = b.rebalanced;
    r.rebalance_migration_s = b.migration_s;
    r.rebalance_migrated_slots = b.migrated_slots;
    r.rebalance_before = b.average_max_over_mean_before;
    r.rebalance_after = b.average_max_over_mean_after;
    r.average_expert_load = std::move(b.average_expert_load);
}

// Where the step's time went on this rank (blocked time from the traced groups), and the
// throughput of the whole job; model FLOP/s and MFU per rank (per GPU, DESIGN.md sec. 1).
void Trainer::record_time_and_throughput(StepRecord& r, double compute_s) {
    using parallel::TrafficClass;
    r.expert_comm_s = comm_wait_[TrafficClass::expert_dispatch];
    r.tp_comm_s = comm_wait_[TrafficClass::tensor_parallel];
    r.dp_comm_s = comm_wait_[TrafficClass::data_parallel];
    r.compute_only_s = compute_s - comm_wait_.total_s();
    r.grad_sync_exposed_s = optimizer_->grad_sync().last_stats().exposed_s();
    static_assert(std::tuple_size_v<decltype(r.payload_bytes)> == parallel::kNumCollectiveKinds);
    r.payload_bytes = parallel::payload_bytes_by_kind(groups_);
    const auto ranks = static_cast<double>(world_size());
    r.step_s = compute_s;
    r.tokens_per_s = static_cast<double>(config_.tokens_per_step()) / compute_s;
    r.model_tflops = model_flops_per_step_ / ranks / compute_s / 1e12;
    r.mfu = gemm_peak_gflops_ > 0
                ? model_flops_per_step_ / ranks / compute_s / (gemm_peak_gflops_ * 1e9)
                : 0.0;
}

// Every stage's busy and idle time, gathered over rank's pipeline (outside the step's timing:
// the record's vectors allocate).
void Trainer::record_stage_times(StepRecord& r) {
    const PipelineStageTimes mine = pipeline_->last_step_times();
    const std::array<double, 2> own{mine.busy_s, mine.idle_s};
    std::vector<double> all(2 * static_cast<size_t>(groups_.pp->size()));
    groups_.pp->all_gather(all.data(), own.data(), 2, DType::f64, kHostStream);
    for (size_t s = 0; s < all.size(); s += 2) {
        r.stage_busy_s.push_back(all[s]);
        r.stage_idle_s.push_back(all[s + 1]);
    }
}

double Trainer::evaluate() {
    std::array<double, 2> sums{};  // loss sum, valid tokens
    const int64_t B = config_.batch_size, S = config_.seq_len;
    for (int64_t i = 0; i < config_.eval_batches; ++i) {
        loader_.val_batch(tokens_.data(), targets_.data(), B, i);
        const int64_t first = first_rank_row_ * S;
        const MicroBatchLosses l =
            pipeline_ != nullptr
                ? pipeline_->forward_only(tokens_.data() + first, targets_.data() + first)
                : model_->forward(tokens_.data() + first, targets_.data() + first, rank_rows_, S);
        sums[0] += l.lm_loss * static_cast<double>(l.num_tokens);
        sums[1] += static_cast<double>(l.num_tokens);
    }
    sum_over_ranks(groups_, sums);
    return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

void Trainer::check_safe_to_save(std::string_view what) const {
    MT_CHECK(std::isfinite(last_loss_),
             "[train] step {}'s loss was {}: refusing to save the parameters that produced it as "
             "{}. Last good checkpoint: {}. Try a lower --lr or weight_decay",
             steps_done_, last_loss_, what,
             last_checkpoint_.empty() ? std::string("none") : last_checkpoint_);
    const float* params = model_->params();
    for (const ParamEntry& e : model_->param_entries()) {
        const float* p = params + e.offset;
        for (int64_t i = 0; i < e.numel; ++i) {
            if (std::isfinite(p[i])) [[likely]]
                continue;
            MT_THROW(
                "[train] after step {}, parameter '{}' holds {} at element {}: the update "
                "overflowed; refusing to save it as {}. Last good checkpoint: {}. Try a lower "
                "--lr or weight_decay",
                steps_done_, e.name, p[i], i, what,
                last_checkpoint_.empty() ? std::string("none") : last_checkpoint_);
        }
    }
}

TrainSummary Trainer::run(MetricsLog& log) {
    TrainSummary s;
    const int64_t first_step = steps_done();
    while (steps_done() < config_.steps) {
        const bool traced = trace_step_ == steps_done() - first_step + 1;
        if (traced) {
            // Ranks line up here so that their timelines share an origin.
            world_->barrier();
            trace_.begin(Timer::now_s());
        }
        StepRecord r = step();
        if (traced) {
            trace_.end();
            write_trace();
        }
        const bool last = r.step == config_.steps;
        if (last || (config_.eval_every > 0 && r.step % config_.eval_every == 0)) {
            if (profiler_ != nullptr) profiler_->set_paused(true);
            r.val_loss = evaluate();
            if (profiler_ != nullptr) profiler_->set_paused(false);
            s.last_val_loss = r.val_loss;
        }
        if (r.step == first_step + 1) s.first_loss = r.loss;
        s.last_loss = r.loss;
        s.train_s += r.step_s;
        log.log_step(r);
        if (last_step_skipped_) {
            ++s.skipped_steps;
            if (rank() == 0)
                std::fprintf(stderr,
                             "moetron: step %lld skipped: loss %g, gradient norm %g (%lld in a "
                             "row, %lld in all)\n",
                             static_cast<long long>(r.step), r.loss, r.grad_norm,
                             static_cast<long long>(consecutive_skipped_),
                             static_cast<long long>(skipped_steps_));
        }
        if (run_control_ != nullptr && run_control_->after_step(*this, r)) {
            s.stopped_by_signal = true;
            break;
        }
    }
    log.finish();
    s.steps = steps_done() - first_step;
    if (s.train_s > 0) {
        const auto steps = static_cast<double>(s.steps);
        s.tokens_per_s = steps * static_cast<double>(config_.tokens_per_step()) / s.train_s;
        s.model_tflops =
            steps * model_flops_per_step_ / static_cast<double>(world_size()) / s.train_s / 1e12;
    }
    return s;
}

void Trainer::set_trace(std::string path, int64_t step) {
    MT_CHECK(step >= 0, "[train] the traced step must be >= 0, got {}", step);
    MT_CHECK(step == 0 || !path.empty(), "[train] a trace needs a file path");
    trace_path_ = std::move(path);
    trace_step_ = step;
}

// Gathers every rank's events on rank 0 (sizes, then one all_to_all_v of the text to rank 0)
// and writes one trace file there, through a temporary file and a rename.
void Trainer::write_trace() {
    std::string mine = trace_.events_json(rank());
    const int n = world_->size();
    int64_t my_size = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(static_cast<size_t>(n));
    world_->all_gather(sizes.data(), &my_size, 1, DType::i64, kHostStream);
    std::vector<int> send_counts(n, 0), send_displs(n, 0), recv_counts(n, 0), recv_displs(n, 0);
    send_counts[0] = static_cast<int>(my_size);
    std::string all;
    if (world_->rank() == 0) {
        int64_t offset = 0;
        for (int p = 0; p < n; ++p) {
            MT_CHECK(offset + sizes[p] <= INT32_MAX, "[train] the trace is too large to gather");
            recv_counts[p] = static_cast<int>(sizes[p]);
            recv_displs[p] = static_cast<int>(offset);
            offset += sizes[p];
        }
        all.resize(static_cast<size_t>(offset));
    }
    world_->all_to_all_v(all.data(), recv_counts, recv_displs, mine.data(), send_counts,
                         send_displs, DType::u8, kHostStream);
    if (rank() != 0) return;
    std::vector<std::string> fragments;
    for (int p = 0; p < n; ++p)
        fragments.push_back(
            all.substr(static_cast<size_t>(recv_displs[p]), static_cast<size_t>(recv_counts[p])));
    const std::string document = chrome_trace_document(fragments);
    replace_file_durably(trace_path_, document, this_process_writer());
    std::fprintf(stderr, "moetron: wrote the timeline of step %lld (%d rank(s)) to %s%s\n",
                 static_cast<long long>(steps_done_), world_size(), trace_path_.c_str(),
                 trace_.dropped() > 0 ? " (some events dropped: buffer full)" : "");
}

int64_t peak_rss_bytes() {
    rusage usage{};
    MT_CHECK(getrusage(RUSAGE_SELF, &usage) == 0, "[train] getrusage failed: {}",
             detail::errno_message());
    return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace moetron
