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

// This rank's pipeline chunks: pp_rank, pp_rank + pp, ... of the layout's pp * vpp (the default
// placement when none is given).
std::vector<PipelineChunk> pipeline_chunks_of(const ModelConfig& model, const TrainParallel& p,
                                              int64_t pp, int64_t vpp, int64_t pp_rank) {
    const int64_t mtp_modules = model.num_nextn_predict_layers;
    const std::string layout =
        p.pp_layout.empty() ? default_pipeline_layout(model, pp * vpp, mtp_modules) : p.pp_layout;
    const std::vector<PipelineChunk> all = pipeline_chunks(model, layout, pp * vpp, mtp_modules);
    std::vector<PipelineChunk> mine;
    for (int64_t c = 0; c < vpp; ++c) mine.push_back(all[static_cast<size_t>(c * pp + pp_rank)]);
    return mine;
}

PipelineScheduleKind schedule_of(const TrainParallel& p, const parallel::Topology& topology) {
    return schedule_for_chunks(parse_pipeline_schedule(p.pp_schedule), topology.vpp);
}

ModelParallel model_parallel(parallel::ParallelGroups& groups, parallel::Communicator& world,
                             const TrainParallel& p, const ModelConfig& model,
                             const TrainConfig& config, const parallel::Topology& topology) {
    ModelParallel mp;
    if (topology.pp > 1) {
        const int stage = groups.pp->rank();
        mp.pipeline_chunks = pipeline_chunks_of(model, p, topology.pp, topology.vpp, stage);
        mp.pipeline_in_flight = PipelineRunner::sets_needed(schedule_of(p, topology), topology.pp,
                                                            stage, config.grad_accum, topology.vpp);
    }
    mp.ep = groups.ep.get();
    mp.tp = groups.tp.get();
    mp.load = &world;  // every rank routes tokens of its own (TP ranks: their share of them)
    mp.moe = p.moe;
    mp.ep_rail = groups.ep_rail.get();
    mp.ep_domain = groups.ep_domain.get();
    return mp;
}

std::unique_ptr<Model> make_model(const ModelConfig& model_config, const TrainConfig& config,
                                  int64_t rank_rows, const ModelParallel& parallel,
                                  Backend& backend, SplitBackwardBackend* split,
                                  Precision precision) {
    validate_train_config(config);
    MT_CHECK(config.seq_len <= model_config.max_position_embeddings,
             "[train] seq_len {} is longer than the model's max_position_embeddings {}",
             config.seq_len, model_config.max_position_embeddings);
    ModelRuntime runtime;
    runtime.batch_size = rank_rows;
    runtime.seq_len = config.seq_len;
    // zb-h1: the model's ops split their backwards, but for the GEMMs that stay whole.
    runtime.backend = split != nullptr ? static_cast<Backend*>(split) : &backend;
    runtime.whole_backward = &backend;
    runtime.precision = precision;
    LossWeights weights;
    weights.mtp_lambda = static_cast<float>(config.mtp_lambda);
    weights.balance_alpha = static_cast<float>(config.balance_loss_alpha);
    auto model = std::make_unique<Model>(model_config, runtime, weights, parallel);
    model->init_parameters(config.seed);
    return model;
}

AdamWConfig adamw_config(const TrainConfig& c, const TrainParallel& p,
                         const parallel::Topology& topology) {
    AdamWConfig a;
    a.beta1 = c.beta1;
    a.beta2 = c.beta2;
    a.eps = c.eps;
    a.weight_decay = c.weight_decay;
    a.grad_clip = c.grad_clip;
    a.grad_sync.bucket_bytes = static_cast<int64_t>(p.bucket_mb * 1024.0 * 1024.0);
    // ZeRO-1 shards over the DP and EDP groups; when both are one rank (one process, or a job of
    // tensor parallelism only) it would only add copies of the whole state.
    a.grad_sync.zero1 = p.zero1 && (topology.dp > 1 || topology.edp > 1);
    a.grad_sync.overlap = p.overlap;
    return a;
}

// The run's topology, checked against the world, the model and the batch.
parallel::Topology make_train_topology(const ModelConfig& model, const TrainConfig& config,
                                       const TrainParallel& p,
                                       const parallel::Communicator& world) {
    const parallel::Topology t =
        parallel::make_topology(parallel::parse_layout(p.layout), world.size(), p.domain_size);
    validate_topology_for_model(t, model);
    MT_CHECK(config.batch_size % t.dp == 0,
             "[train] batch_size {} sequences do not split over the {} data-parallel ranks of "
             "layout '{}'; use a multiple of {}",
             config.batch_size, t.dp, p.layout, t.dp);
    MT_CHECK(p.bucket_mb > 0, "[train] --bucket-mb must be positive, got {}", p.bucket_mb);
    // A mistaken --pp-schedule or --pp-layout is refused on any layout, not only a pipelined one.
    schedule_for_chunks(parse_pipeline_schedule(p.pp_schedule), t.vpp);
    if (!p.pp_layout.empty())
        pipeline_chunks(model, p.pp_layout, static_cast<int64_t>(t.pp) * t.vpp,
                        model.num_nextn_predict_layers);
    return t;
}

// zb-h1 splits each backward in two: the model then runs on a SplitBackwardBackend over backend.
std::unique_ptr<SplitBackwardBackend> split_backward_for(const TrainParallel& p,
                                                         const parallel::Topology& topology,
                                                         Backend& backend) {
    if (topology.pp == 1 || schedule_of(p, topology) != PipelineScheduleKind::zero_bubble_h1)
        return nullptr;
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
std::unique_ptr<parallel::Communicator> own_world_unless_given(const TrainParallel& p) {
    if (p.world != nullptr) return nullptr;
    return std::make_unique<parallel::LocalCommunicator>("world");
}

}  // namespace

Trainer::Trainer(const ModelConfig& model_config, const TrainConfig& config, DataLoader loader,
                 const TrainParallel& parallel, Backend& backend)
    : config_(config),
      own_world_(own_world_unless_given(parallel)),
      world_(parallel.world != nullptr ? parallel.world : own_world_.get()),
      topology_(make_train_topology(model_config, config, parallel, *world_)),
      groups_(make_traced_groups(*world_, topology_, &comm_wait_, &trace_)),
      loader_(std::move(loader)),
      split_backward_(split_backward_for(parallel, topology_, backend)),
      model_(make_model(model_config, config, config.batch_size / topology_.dp,
                        model_parallel(groups_, *world_, parallel, model_config, config, topology_),
                        backend, split_backward_.get(), parallel.precision)),
      schedule_(config.lr, config.min_lr, config.warmup_steps, config.steps),
      tokens_(static_cast<size_t>(config.grad_accum * config.batch_size * config.seq_len)),
      targets_(tokens_.size()) {
    MT_CHECK(loader_.seq_len() == config.seq_len,
             "[train] the data loader cuts windows of {} tokens, the run wants seq_len {}",
             loader_.seq_len(), config.seq_len);
    rank_rows_ = config.batch_size / topology_.dp;
    first_rank_row_ = groups_.dp->rank() * rank_rows_;
    const std::vector<parallel::ParamSpan> spans = model_->param_spans();
    optimizer_ = std::make_unique<AdamW>(spans, model_->num_params(), model_->grads(),
                                         AdamWGroups{*world_, *groups_.dp, *groups_.edp},
                                         adamw_config(config, parallel, topology_), backend);
    model_->set_grad_ready_callback([sync = &optimizer_->grad_sync()](int64_t begin, int64_t end) {
        sync->grads_ready(begin, end);
    });
    if (model_config.n_routed_experts > 0 && groups_.ep->size() > 1)
        balancer_ = std::make_unique<ExpertBalancer>(*model_, *optimizer_, *groups_.ep,
                                                     *groups_.edp, parallel.moe.rebalance_every);
    else
        MT_USER_CHECK(parallel.moe.rebalance_every == 0,
                      "--rebalance-every needs expert parallelism (a layout with ep > 1) and "
                      "--redundant-experts");
    if (topology_.pp > 1)
        pipeline_ = std::make_unique<PipelineRunner>(
            *model_, *groups_.pp, schedule_of(parallel, topology_), config.grad_accum, rank_rows_,
            config.seq_len, &trace_, split_backward_.get());
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

StepRecord Trainer::step() {
    StepRecord r;
    comm_wait_ = {};
    parallel::reset_group_counters(groups_);
    Timer timer;
    model_->zero_grads();
    model_->take_expert_compute_s();  // from here: this step's (not an evaluation's)
    parallel::ExpertDispatcher* dispatcher = model_->expert_dispatcher();
    if (dispatcher != nullptr) dispatcher->reset_stats();
    // The whole step's batch first: its counts normalize every micro-batch, so the step's loss is
    // the mean over all its valid tokens however it is split over micro-batches and ranks.
    const int64_t B = config_.batch_size, S = config_.seq_len, micro_tokens = B * S;
    {
        const TraceScope scope(&trace_, "load batch");
        for (int64_t micro = 0; micro < config_.grad_accum; ++micro)
            loader_.next_train_batch(tokens_.data() + micro * micro_tokens,
                                     targets_.data() + micro * micro_tokens, B);
    }
    const LossDenominators den =
        count_loss_denominators(model_->config(), targets_.data(), config_.grad_accum * B, S);
    std::array<double, 3> losses{};  // this rank's shares of lm, mtp and balance loss
    if (pipeline_ != nullptr) {
        const int64_t first = first_rank_row_ * S;
        losses =
            pipeline_->train_step(tokens_.data() + first, targets_.data() + first, micro_tokens,
                                  den, [this] { optimizer_->grad_sync().arm(); });
    }
    for (int64_t micro = 0; pipeline_ == nullptr && micro < config_.grad_accum; ++micro) {
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
    optimizer_->grad_sync().finish();
    const double expert_compute_s = model_->take_expert_compute_s();  // this step's
    if (dispatcher != nullptr) record_dispatch_stats(r, dispatcher->stats());
    sum_over_ranks(groups_, losses);
    r.loss = losses[0];
    r.mtp_loss = losses[1];
    r.balance_loss = losses[2];

    r.step = steps_done_ + 1;
    if (grad_hook_) grad_hook_(r.step, model_->grads());
    r.grad_norm = optimizer_->clip_gradients(model_->grads());
    // A non-finite loss or norm skips the update: parameters, moments and router bias stay those
    // of the last good step, while the data and the schedule move on (the step is counted).
    // Every rank sees the same summed loss and global norm, so they all skip together.
    r.lr = schedule_.lr_at(steps_done_);
    last_loss_ = r.loss;
    last_step_skipped_ = !(std::isfinite(r.loss) && std::isfinite(r.grad_norm));
    if (last_step_skipped_) {
        ++skipped_steps_;
        ++consecutive_skipped_;
        ++steps_done_;
        // gamma 0 resets the load counts (a collective when distributed) and moves no bias.
        model_->update_router_bias(0.0f);
        MT_CHECK(consecutive_skipped_ < max_skipped_steps_,
                 "[train] step {}: {} steps in a row had a non-finite loss or gradient norm "
                 "(loss {}, gradient norm {}); stopping. Last good checkpoint: {}. Try a lower "
                 "--lr or a smaller grad_clip",
                 r.step, consecutive_skipped_, r.loss, r.grad_norm,
                 last_checkpoint_.empty() ? std::string("none") : last_checkpoint_);
        r.step_s = timer.elapsed_s();
        return r;
    }
    consecutive_skipped_ = 0;
    {
        const TraceScope scope(&trace_, "optimizer");
        // Returns with the parameter all-gathers in flight; they are waited for at the end of
        // the step (below), so no parameter is read before they land.
        optimizer_->post_step(model_->params(), model_->grads(), r.lr);
    }
    ++steps_done_;
    // The loads of every rank, so that the logged balance is the job's.
    model_->sum_expert_load_over_ranks();
    double compute_s = timer.elapsed_s();

    // The loads must be read before the bias update resets them; expert_load() allocates, so it
    // stays outside the timed part.
    const ExpertLoadStats load = model_->expert_load();
    r.expert_load_max_over_mean = load.max_over_mean;
    r.expert_load_min_over_mean = load.min_over_mean;
    if (pipeline_ != nullptr) record_stage_times(r);
    timer.reset();
    model_->update_router_bias(static_cast<float>(config_.bias_update_speed));
    {
        // The router bias is not trainable, so no gather writes it; the parameters are whole
        // again before step() returns (the next forward, an evaluation or a checkpoint).
        const TraceScope scope(&trace_, "parameter all-gather wait");
        optimizer_->finish_param_gathers();
    }
    if (balancer_) {
        // After the gathers: a rebalance rewrites expert slots' weights and moments. Timed with
        // the step: its gathers of the loads are blocked time of the step (comm_wait_), and a
        // step record whose waits outran its time read negative compute (CI, 4 ranks).
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
    compute_s += timer.elapsed_s();

    // Where the step's time went on this rank (blocked time from the traced groups).
    using parallel::TrafficClass;
    r.expert_comm_s = comm_wait_[TrafficClass::expert_dispatch];
    r.tp_comm_s = comm_wait_[TrafficClass::tensor_parallel];
    r.dp_comm_s = comm_wait_[TrafficClass::data_parallel];
    r.compute_only_s = compute_s - comm_wait_.total_s();
    r.grad_sync_exposed_s = optimizer_->grad_sync().last_stats().exposed_s();
    static_assert(std::tuple_size_v<decltype(r.payload_bytes)> == parallel::kNumCollectiveKinds);
    r.payload_bytes = parallel::payload_bytes_by_kind(groups_);

    // Throughput of the whole job; model FLOP/s and MFU per rank (per GPU, DESIGN.md sec. 1).
    const auto ranks = static_cast<double>(world_size());
    r.step_s = compute_s;
    r.tokens_per_s = static_cast<double>(config_.tokens_per_step()) / compute_s;
    r.model_tflops = model_flops_per_step_ / ranks / compute_s / 1e12;
    r.mfu = gemm_peak_gflops_ > 0
                ? model_flops_per_step_ / ranks / compute_s / (gemm_peak_gflops_ * 1e9)
                : 0.0;
    return r;
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
            r.val_loss = evaluate();
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
