// moetron train: training of a model preset on a token file, a text file or the built-in
// synthetic dataset. With no arguments it trains the tiny preset on synthetic text on one process.
// Under an MPI launcher, or with --layout, every rank of the job trains its part of the same run:
//   mpirun -np 4 moetron train --layout dp4.ep2
// (batch_size and grad_accum stay those of the whole job; see train/trainer.h). Only rank 0
// prints; an error on any rank ends the whole job.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/output_paths.h"
#include "moetron/checkpoint/train_config.h"
#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/parallel/communicator.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/compute_stack.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/metrics.h"
#include "moetron/train/preset_path.h"
#include "moetron/train/run_plan.h"
#include "moetron/train/threads.h"
#include "moetron/train/token_shard.h"
#include "moetron/train/trainer.h"

namespace moetron::cli {

namespace {

// --router-skew B: each MoE layer's correction bias (selection only) starts at B for its first K
// experts, so that the router favours them from the first step.
void skew_router_bias(Model& model, float bias) {
    const int64_t K = model.config().num_experts_per_tok;
    for (const ParamEntry& e : model.param_entries()) {
        if (!e.name.ends_with("router_bias")) continue;
        auto* b = static_cast<float*>(model.param(e.name).data);
        for (int64_t i = 0; i < K; ++i) b[i] = bias;
    }
}

struct TrainOptions {
    std::string config_path;
    std::string data_path;
    std::string text_path;
    std::string log_jsonl_path;
    std::string save_final_path;
    // Checkpoints (train/checkpoint.h).
    std::string save_dir;
    std::string resume_dir;
    int64_t save_every = 0;
    int64_t keep = 0;
    bool share_save_root = false;
    int64_t max_skipped_steps = 5;
    int threads = 0;
    std::string trace_path;
    int64_t trace_step = 2;
    // Distributed runs.
    std::string layout;
    int domain_size = 0;
    std::string dispatch = "flat";
    std::string moe_overlap = "off";
    std::string pp_schedule = "1f1b";
    std::string pp_layout;
    double moe_capacity_factor = parallel::kDefaultMoeCapacityFactor;
    int64_t redundant_experts = 0;
    int64_t rebalance_every = 0;
    double router_skew = 0;
    double comm_timeout_s = 300.0;
    double bucket_mb = 4.0;
    bool no_zero1 = false;
    bool no_overlap_dp_grad = false;
    bool profile_ops = false;
    std::string precision = "fp32";
    parallel::DispatchPayload dispatch_payload = parallel::DispatchPayload::recipe;
    CLI::Option* layout_opt = nullptr;
    // Overrides of the preset's [train] table; applied only when given (count() > 0).
    int64_t steps = 0, batch_size = 0, seq_len = 0, grad_accum = 0, eval_every = 0;
    double lr = 0;
    uint64_t seed = 0;
    CLI::Option *steps_opt = nullptr, *batch_size_opt = nullptr, *seq_len_opt = nullptr,
                *grad_accum_opt = nullptr, *eval_every_opt = nullptr, *lr_opt = nullptr,
                *seed_opt = nullptr;
};

// Bounds of the distributed options: generous, only there to keep absurd values out of the
// arithmetic (a bucket of 1e300 MiB is no bucket size).
constexpr int64_t kMaxDomainSize = int64_t{1} << 20;
constexpr double kMaxCommTimeoutS = 7 * 24 * 3600.0;
constexpr double kMaxBucketMiB = 65536.0;

double to_mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

// Where the run's output goes: stdout on rank 0 (or one process), nowhere on the other ranks.
class RankOutput {
  public:
    explicit RankOutput(bool root) : out_(root ? stdout : std::fopen("/dev/null", "w")) {
        MT_CHECK(out_ != nullptr, "[train] cannot open /dev/null: {}", detail::errno_message());
    }
    ~RankOutput() {
        if (out_ != stdout) std::fclose(out_);
    }
    RankOutput(const RankOutput&) = delete;
    RankOutput& operator=(const RankOutput&) = delete;
    std::FILE* get() const { return out_; }

  private:
    std::FILE* out_;
};

// Every file the run will write (rank 0 writes them) can be written, and none is an input or
// another output: checked before anything is loaded, so that no compute is lost to a bad path.
// The --save root is claimed once the run's identity is known (after --resume).
void check_output_files(const TrainOptions& o, const std::string& config_path) {
    const std::vector<PathOption> inputs = {
        {"--config", config_path}, {"--data", o.data_path}, {"--text", o.text_path}};
    const std::vector<PathOption> outputs = {{"--log-jsonl", o.log_jsonl_path},
                                             {"--trace", o.trace_path}};
    for (size_t i = 0; i < outputs.size(); ++i) {
        if (outputs[i].path.empty()) continue;
        check_output_file(outputs[i]);
        refuse_output_in_checkpoint(outputs[i]);
        refuse_same_file(outputs[i], inputs);
        refuse_same_file(outputs[i],
                         {outputs.begin() + static_cast<std::ptrdiff_t>(i) + 1, outputs.end()});
    }
}

// The command line's overrides of the run's [train] settings (a preset's or a checkpoint's).
void apply_overrides(const TrainOptions& o, TrainConfig& config) {
    if (o.steps_opt->count()) config.steps = o.steps;
    if (o.batch_size_opt->count()) config.batch_size = o.batch_size;
    if (o.seq_len_opt->count()) config.seq_len = o.seq_len;
    if (o.grad_accum_opt->count()) config.grad_accum = o.grad_accum;
    if (o.eval_every_opt->count()) config.eval_every = o.eval_every;
    if (o.lr_opt->count()) {
        // Keep the preset's floor-to-peak ratio when only the peak is given.
        config.min_lr = config.min_lr / config.lr * o.lr;
        config.lr = o.lr;
    }
    if (o.seed_opt->count()) config.seed = o.seed;
}

// The training tokens: --data or --text when given; on a resume without them, the checkpoint's
// run's data (a token file told from a text file by its magic); else the synthetic dataset.
TokenData load_training_data(const TrainOptions& o, const std::optional<CheckpointRun>& resumed,
                             int64_t vocab_size, uint64_t seed, std::FILE* out) {
    if (!o.data_path.empty()) return load_token_file_data(o.data_path, vocab_size);
    if (!o.text_path.empty()) return load_text_file_data(o.text_path, vocab_size);
    if (!resumed || resumed->data_source == "synthetic")
        return make_synthetic_data(vocab_size, seed);
    const std::string& source = resumed->data_source;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(source, ec)) {
        // An imported checkpoint has no data of its own; a moved file cannot be guessed.
        MT_USER_CHECK(source.rfind("imported from ", 0) == 0,
                      "the checkpoint's run trained on '{}', which is not a file here; pass the "
                      "data with --data or --text",
                      source);
        std::fprintf(out,
                     "note    the checkpoint was %s; training on the synthetic dataset "
                     "(pass --data or --text for your own)\n",
                     source.c_str());
        return make_synthetic_data(vocab_size, seed);
    }
    return is_token_file(source) ? load_token_file_data(source, vocab_size)
                                 : load_text_file_data(source, vocab_size);
}

// The run as the command line and a resumed checkpoint define it. A resumed run continues as its
// checkpoint was configured (model, [train] settings, data); only what the command line gives
// changes, and the run says what that was.
struct ResolvedRun {
    std::optional<CheckpointRun> resumed;
    std::string config_path;  // empty: the checkpoint's model
    ModelConfig model;
    TrainConfig config;
    // An imported checkpoint (moetron import) has weights but no run: its [train] settings are
    // --config's, as for a fresh run.
    bool imported = false;
};

ResolvedRun resolve_run(const TrainOptions& o, bool root) {
    ResolvedRun run;
    if (!o.resume_dir.empty()) run.resumed = read_checkpoint_run(o.resume_dir);
    run.config_path = !o.config_path.empty() ? model_config_path(o.config_path)
                      : run.resumed          ? std::string()
                                             : find_preset("tiny");
    if (root) check_output_files(o, run.config_path);
    run.model = run.config_path.empty() ? run.resumed->model : load_model_config(run.config_path);
    run.imported = run.resumed && run.resumed->data_source.rfind("imported from ", 0) == 0;
    run.config = run.resumed && (!run.imported || run.config_path.empty())
                     ? run.resumed->train
                     : load_train_config(run.config_path);
    apply_overrides(o, run.config);
    validate_train_config(run.config);
    return run;
}

// The flags of the run's plan (train/run_plan.h).
RunSettings run_settings(const TrainOptions& o) {
    RunSettings s;
    s.layout = o.layout;
    s.domain_size = o.domain_size;
    s.moe.dispatch = parallel::parse_dispatch_kind(o.dispatch);
    s.moe.overlap = parse_moe_overlap(o.moe_overlap);
    s.moe.capacity_factor = o.moe_capacity_factor;
    s.moe.redundant_experts = o.redundant_experts;
    s.moe.rebalance_every = o.rebalance_every;
    s.precision = parse_precision(o.precision);
    s.dispatch_payload = o.dispatch_payload;
    s.bucket_mb = o.bucket_mb;
    s.zero1 = !o.no_zero1;
    s.overlap_dp_grad = !o.no_overlap_dp_grad;
    s.pp_schedule = o.pp_schedule;
    s.pp_layout = o.pp_layout;
    return s;
}

// The training tokens, and the header's lines about them.
DataLoader load_data(const TrainOptions& o, const ResolvedRun& run, std::FILE* out,
                     double* entropy_floor) {
    TokenData data = load_training_data(o, run.resumed, run.model.vocab_size, run.config.seed, out);
    if (run.resumed && !run.imported && data.source != run.resumed->data_source)
        std::fprintf(out,
                     "note    the checkpoint's run trained on '%s'; this run continues on '%s'\n",
                     run.resumed->data_source.c_str(), data.source.c_str());
    *entropy_floor = data.entropy_nats_per_token;
    const std::string description = data.description;
    DataLoader loader(std::move(data.tokens), data.source, run.model.vocab_size, run.config.seq_len,
                      run.config.val_fraction, run.config.seed);
    if (run.config_path.empty())
        std::fprintf(out, "moetron train: the model of checkpoint %s\n",
                     run.resumed->dir.string().c_str());
    else
        std::fprintf(out, "moetron train: %s\n", run.config_path.c_str());
    std::fprintf(out, "model   %s\n", describe_model_config(run.model).c_str());
    std::fprintf(out, "data    %s\n", description.c_str());
    std::fprintf(out, "        %lld training tokens, %lld held out (%lld validation windows)\n",
                 static_cast<long long>(loader.num_train_tokens()),
                 static_cast<long long>(loader.num_val_tokens()),
                 static_cast<long long>(loader.num_val_windows()));
    return loader;
}

// The run's state from --resume, and what the command line changed of its settings.
void resume(Trainer& trainer, const TrainOptions& o, const ResolvedRun& run, std::FILE* out) {
    const auto dir = load_checkpoint(trainer, o.resume_dir);
    std::fprintf(out, "resumed from %s at step %lld\n", dir.c_str(),
                 static_cast<long long>(trainer.steps_done()));
    if (run.imported) return;  // an import's settings are --config's: nothing to compare
    for (const std::string& line : train_config_differences(dir, run.config))
        std::fprintf(out, "note    overridden on the command line: %s\n", line.c_str());
    if (!run.config_path.empty())
        std::fprintf(out,
                     "note    --config names the model; the [train] settings are the "
                     "checkpoint's run's (flags override them)\n");
}

// --save and --save-final: checkpoint roots of this run, claimed before any work by the one
// writer (rank 0; the others only read them), and the final state for `moetron sample` and
// `export`.
class SaveRoots {
  public:
    SaveRoots(const TrainOptions& o, Trainer& trainer, bool root, std::FILE* out)
        : o_(o), trainer_(trainer), root_(root), out_(out) {}

    void claim(const std::string& path, const char* flag) const {
        if (path.empty() || !root_) return;
        SaveRootRequest request;
        request.run_id = trainer_.run_id();
        request.start_step = trainer_.steps_done();
        request.share = o_.share_save_root;
        request.flag = flag;
        request.override_flag = "--share-save-root";
        claim_save_root(path, request);
    }
    // A checkpoint like any other (every rank writes its shard), saved after the run, or at once
    // when there is nothing to train. A root that already holds this run's checkpoint of the
    // step (--save-final the --save root, or the root a finished run resumed from) keeps it.
    void save_final() const {
        if (o_.save_final_path.empty()) return;
        const std::filesystem::path dir =
            std::filesystem::path(o_.save_final_path) /
            checkpoint_dir_name(static_cast<uint64_t>(trainer_.steps_done()));
        const bool saved =
            std::filesystem::exists(dir) && checkpoint_run_id(dir) == trainer_.run_id();
        if (!saved) save_checkpoint(trainer_, o_.save_final_path, /*keep=*/1);
        std::fprintf(out_,
                     "saved   weights to %s (sample with: moetron sample --weights %s --prompt "
                     "TEXT)\n",
                     dir.c_str(), o_.save_final_path.c_str());
    }

  private:
    const TrainOptions& o_;
    Trainer& trainer_;
    bool root_;
    std::FILE* out_;
};

void flush_output(std::FILE* out) {
    MT_CHECK(std::fflush(out) == 0, "[train] writing to stdout failed: {}",
             detail::errno_message());
}

// The header's lines about the model's arenas, the ranks (the plan's lines and what this rank's
// trainer built: the weight-gradient stash, the dispatcher), the schedule and the compute.
void print_run_header(std::FILE* out, Trainer& trainer, const ComputeStack& compute,
                      const ThreadChoice& threads, double peak_gflops) {
    const RunPlan& plan = trainer.plan();
    const TrainConfig& config = trainer.config();
    std::fprintf(out, "params  %.3fM (main model and MTP%s%s); model arenas %.1f MiB\n",
                 static_cast<double>(trainer.model().num_params()) / 1e6,
                 plan.topology.pp > 1 ? ", this rank's pipeline stage" : "",
                 plan.topology.ep > 1 ? ", this rank's experts" : "",
                 to_mib(static_cast<double>(trainer.model().planned_bytes())));
    for (const std::string& line : describe_run_plan(plan, config))
        std::fprintf(out, "%s\n", line.c_str());
    if (const PipelineRunner* pipeline = trainer.pipeline(); pipeline && pipeline->stash_bytes())
        std::fprintf(out,
                     "        zb-h1: up to %lld micro-batches' weight gradients queued, their GEMM "
                     "operands in a stash of %.1f MiB\n",
                     static_cast<long long>(max_weight_gradients_pending(pipeline->order())),
                     to_mib(static_cast<double>(pipeline->stash_bytes())));
    const parallel::ExpertDispatcher* d = trainer.model().expert_dispatcher();
    if (d != nullptr && trainer.world_size() > 1)
        std::fprintf(out,
                     "        experts: %s; tokens travel as %s; MoE overlap %s; expert-side "
                     "buffers of %lld rows per layer (capacity factor %g)\n",
                     d->description().c_str(),
                     std::string(precision_name(d->planned_token_format())).c_str(),
                     std::string(moe_overlap_name(plan.moe.overlap)).c_str(),
                     static_cast<long long>(d->capacity_rows()), plan.moe.capacity_factor);
    std::fprintf(
        out,
        "train   %lld steps x %lld micro-batch(es) of %lld x %lld tokens = %lld tokens/step; lr "
        "%.2e -> %.2e (warmup %lld), wd %.2g, clip %.2g, seed %llu\n",
        static_cast<long long>(config.steps), static_cast<long long>(config.grad_accum),
        static_cast<long long>(config.batch_size), static_cast<long long>(config.seq_len),
        static_cast<long long>(config.tokens_per_step()), config.lr, config.min_lr,
        static_cast<long long>(config.warmup_steps), config.weight_decay, config.grad_clip,
        static_cast<unsigned long long>(config.seed));
    std::fprintf(out,
                 "compute %d thread(s) (%s); measured sgemm peak %.1f GFLOP/s; %.3f model "
                 "GFLOP/step\n",
                 threads.num_threads, threads.reason, peak_gflops,
                 trainer.model_flops_per_step() / 1e9);
    std::fprintf(out, "backend %s\n", compute.describe(plan.precision).c_str());
}

// The run's closing lines: losses, speed, memory, and with --profile-ops where the time went.
void print_run_summary(std::FILE* out, Trainer& trainer, const TrainSummary& s,
                       ComputeStack& compute, double initial_val, double entropy_floor,
                       double peak_gflops, double wall_s) {
    if (s.skipped_steps > 0)
        std::fprintf(out, "skipped %lld step(s) with a non-finite loss or gradient norm\n",
                     static_cast<long long>(s.skipped_steps));
    if (s.steps == 0) {  // stopped before its first step: no losses to report
        std::fprintf(out, "done    no steps run (%.1f s wall); val %.4f", wall_s, initial_val);
    } else {
        std::fprintf(out,
                     "done    %lld steps in %.1f s of compute (%.1f s wall); train loss %.4f -> "
                     "%.4f; val %.4f -> %.4f",
                     static_cast<long long>(s.steps), s.train_s, wall_s, s.first_loss, s.last_loss,
                     initial_val, s.last_val_loss);
    }
    if (std::isfinite(entropy_floor)) std::fprintf(out, " (data entropy %.4f)", entropy_floor);
    std::fprintf(out,
                 "\nspeed   %.0f tokens/s, %.4f model TFLOP/s%s, MFU %.1f%% of the sgemm peak\n",
                 s.tokens_per_s, s.model_tflops, trainer.world_size() > 1 ? " per rank" : "",
                 peak_gflops > 0 ? 100.0 * s.model_tflops * 1e3 / peak_gflops : 0.0);
    const double moments_bytes = 4.0 * static_cast<double>(trainer.optimizer_state_numel());
    std::fprintf(out,
                 "memory  peak RSS %.1f MiB; planned: model arenas %.1f MiB + AdamW state %.1f "
                 "MiB\n",
                 to_mib(static_cast<double>(peak_rss_bytes())),
                 to_mib(static_cast<double>(trainer.model().planned_bytes())),
                 to_mib(moments_bytes));
    if (compute.profiler() != nullptr && s.steps > 0) {
        std::fprintf(out,
                     "ops     per step of this rank, over the steps' time (validations not "
                     "counted):\n%s",
                     format_op_profile(*compute.profiler(), s.steps, s.train_s).c_str());
    }
}

// world: every rank of the job, or null for one process.
void run_train(const TrainOptions& o, parallel::Communicator* world) {
    const Timer wall;
    MT_USER_CHECK(!o.share_save_root || !o.save_dir.empty() || !o.save_final_path.empty(),
                  "--share-save-root requires --save or --save-final");
    const bool root = world == nullptr || world->rank() == 0;
    const RankOutput rank_output(root);
    std::FILE* out = rank_output.get();
    const ResolvedRun run = resolve_run(o, root);
    const TrainConfig& config = run.config;
    const bool has_mtp = run.model.num_nextn_predict_layers > 0;
    const ThreadChoice threads = choose_and_set_threads(
        o.threads, flops_per_token(run.model, config.seq_len, has_mtp).total *
                       static_cast<double>(config.tokens_per_step()));
    double entropy_floor = 0;
    DataLoader loader = load_data(o, run, out, &entropy_floor);

    const RunPlan plan =
        plan_run(run.model, config, run_settings(o), world != nullptr ? world->size() : 1);
    ComputeStack compute(o.profile_ops);
    Trainer trainer(run.model, config, std::move(loader), plan, world, compute.ops());
    trainer.set_profiler(compute.profiler());
    trainer.set_max_skipped_steps(o.max_skipped_steps);
    if (o.router_skew != 0) skew_router_bias(trainer.model(), static_cast<float>(o.router_skew));
    if (!o.trace_path.empty())
        trainer.set_trace(o.trace_path, std::min(o.trace_step, config.steps));
    if (!o.resume_dir.empty()) resume(trainer, o, run, out);
    const SaveRoots roots(o, trainer, root, out);
    roots.claim(o.save_final_path, "--save-final");
    if (trainer.steps_done() >= config.steps) {
        std::fprintf(out,
                     "done    nothing to train: the checkpoint's run is finished (step %lld of "
                     "%lld); to train on, pass --steps with more than %lld\n",
                     static_cast<long long>(trainer.steps_done()),
                     static_cast<long long>(config.steps),
                     static_cast<long long>(trainer.steps_done()));
        roots.save_final();
        flush_output(out);
        return;
    }
    roots.claim(o.save_dir, "--save");
    RunControl control({o.save_dir, o.save_every, static_cast<size_t>(o.keep), out});
    install_stop_signal_handlers();
    trainer.set_run_control(&control);
    const double peak_gflops = measure_gemm_peak_gflops();
    trainer.set_gemm_peak_gflops(peak_gflops);
    print_run_header(out, trainer, compute, threads, peak_gflops);

    const double initial_val = trainer.evaluate();
    std::fprintf(out, "step %lld | val %.4f (uniform guess: ln %lld = %.4f)\n",
                 static_cast<long long>(trainer.steps_done()), initial_val,
                 static_cast<long long>(run.model.vocab_size),
                 std::log(static_cast<double>(run.model.vocab_size)));
    flush_output(out);
    const int64_t print_every = std::max<int64_t>(1, config.steps / 25);
    MetricsLog log(config.steps, print_every, root ? o.log_jsonl_path : std::string(),
                   // mpirun forwards stdout through a pseudo-terminal: plain lines read better
                   world == nullptr && isatty(fileno(stdout)) == 1, out,
                   std::max<int64_t>(run.model.n_routed_experts, trainer.topology().pp));
    // The initialization's and the first validation's ops are not the run's.
    if (compute.profiler() != nullptr) compute.profiler()->reset();
    const TrainSummary s = trainer.run(log);
    print_run_summary(out, trainer, s, compute, initial_val, entropy_floor, peak_gflops,
                      wall.elapsed_s());
    roots.save_final();
    flush_output(out);
}

// The MPI job around run_train: one MpiSession, the world communicator, and MPI_Abort of every
// rank when any rank fails (the others would otherwise wait in a collective until the timeout).
void run_train_mpi(const TrainOptions& o) {
    parallel::MpiSession session(nullptr, nullptr);
    int rank = -1;
    try {
        parallel::CommunicatorOptions options;
        options.timeout_s = o.comm_timeout_s;
        std::unique_ptr<parallel::Communicator> world = parallel::make_mpi_world(session, options);
        rank = world->rank();
        run_train(o, world.get());
        world->barrier();  // no rank finalizes while another still needs it
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron: error on rank %d: %s\n", rank, e.what());
        std::fflush(stderr);
        parallel::MpiSession::abort_job(1);
    }
}

}  // namespace

void register_train(CLI::App& app) {
    auto o = std::make_shared<TrainOptions>();
    CLI::App* cmd = app.add_subcommand(
        "train",
        "Train a model in this process or, under mpirun, as every rank of the job (default: the "
        "tiny preset on built-in synthetic text)");
    cmd->add_option("--config", o->config_path,
                    "model: a preset name (tiny, small, dsv3-671b) or a TOML file with a [train] "
                    "table (default: tiny; with --resume: the checkpoint's)");
    CLI::Option* data = cmd->add_option(
        "--data", o->data_path, "token file: a moetron shard (moetron prepare) or an llm.c .bin");
    CLI::Option* text =
        cmd->add_option("--text", o->text_path, "text file, tokenized byte-level on the fly");
    data->excludes(text);
    o->steps_opt = cmd->add_option("--steps", o->steps, "optimizer steps")
                       ->check(whole_number(1, kMaxTrainSteps));
    o->batch_size_opt = cmd->add_option("--batch-size", o->batch_size, "sequences per micro-batch")
                            ->check(whole_number(1, kMaxBatchSize));
    o->seq_len_opt = cmd->add_option("--seq-len", o->seq_len, "tokens per sequence")
                         ->check(whole_number(2, kMaxSeqLen));
    o->grad_accum_opt =
        cmd->add_option("--grad-accum", o->grad_accum, "micro-batches per optimizer step")
            ->check(whole_number(1, kMaxGradAccum));
    o->lr_opt = cmd->add_option("--lr", o->lr, "peak learning rate (min_lr scales with it)")
                    ->check(positive_number(kMaxLearningRate));
    o->seed_opt = cmd->add_option("--seed", o->seed, "initialization and data-sampling seed");
    o->eval_every_opt = cmd->add_option("--eval-every", o->eval_every,
                                        "validate every N steps (0: only after the last)")
                            ->check(whole_number(0));
    cmd->add_option("--log-jsonl", o->log_jsonl_path, "write one JSON object per step here");
    CLI::Option* save =
        cmd->add_option("--save", o->save_dir,
                        "checkpoint root: step-XXXXXXXX directories and a `latest` pointer; saves "
                        "at the last step, every --save-every steps and on SIGTERM/SIGINT. It "
                        "belongs to this run: another run's root is refused");
    cmd->add_option("--save-every", o->save_every, "save a checkpoint every N steps (0: never)")
        ->check(whole_number(0))
        ->needs(save);
    cmd->add_option("--keep", o->keep,
                    "keep the newest K of this run's checkpoints (0: all); never deletes another "
                    "run's or a newer one")
        ->check(whole_number(0))
        ->needs(save);
    cmd->add_flag("--share-save-root", o->share_save_root,
                  "save into a --save or --save-final root that holds another run's "
                  "checkpoints, beside them (they are never deleted)");
    cmd->add_option("--resume", o->resume_dir,
                    "continue from a checkpoint directory, or a checkpoint root (its `latest`)");
    cmd->add_option("--max-skipped-steps", o->max_skipped_steps,
                    "stop after this many steps in a row with a non-finite loss or gradient norm "
                    "(such steps update nothing)")
        ->check(whole_number(1));
    cmd->add_option("--save-final", o->save_final_path,
                    "checkpoint root for the final state only (for moetron sample and export, "
                    "which read it as any checkpoint)");
    cmd->add_option("--threads", o->threads,
                    "compute threads (default: OMP_NUM_THREADS, else 1 for steps under 5 model "
                    "GFLOP, else all cores)")
        ->check(whole_number(1, kMaxThreads));
    o->layout_opt = cmd->add_option(
        "--layout", o->layout,
        "parallel layout of an MPI job, e.g. dp4, ep2, dp4.ep2, tp2.ep2, pp2.ep2 (dp: "
        "data-parallel ranks, ep: ranks the routed experts are split over, tp: tensor-parallel "
        "ranks, pp: pipeline stages, vpp: model chunks per stage). "
        "Given, or under an MPI launcher, the run is distributed (default: all data parallel)");
    add_pp_schedule_option(*cmd, o->pp_schedule, Side::engine,
                           "pipeline schedule with pp > 1: 1f1b (PipeDream-flush; with vpp > 1 "
                           "interleaved, as Megatron-LM's) or zb-h1 (zero bubble: weight "
                           "gradients split off to fill the cool-down; vpp 1); dualpipe is "
                           "simulate's and plan's only");
    cmd->add_option("--pp-layout", o->pp_layout,
                    "blocks per pipeline stage as Megatron-LM's layout, e.g. 'Et|tt|tL' "
                    "(E embedding, t layer, m MTP module, L head and loss; default: even, the "
                    "embedding and the head counted as one layer each)");
    cmd->add_option("--domain-size", o->domain_size,
                    "ranks per scale-up domain (0: the whole job is one domain)")
        ->check(whole_number(0, kMaxDomainSize));
    add_dispatch_option(*cmd, o->dispatch,
                        "how the MoE all-to-all crosses scale-up domains: flat (once per "
                        "destination rank) or two_tier (once per destination domain over the "
                        "rail, then inside the domain; needs ep a multiple of --domain-size)");
    add_precision_option(*cmd, o->precision, Side::engine,
                         "number format of the linear layers' and experts' GEMM inputs: fp32 "
                         "(default), bf16, mxfp8 (E4M3 in 32-element blocks with E8M0 scales, the "
                         "MXFP8 recipe) or fp8-blockwise (DeepSeek-V3's 1x128 / 128x128 FP8); the "
                         "output head's GEMMs are bf16 under bf16 (as Megatron-LM's --bf16) and "
                         "float32 under the FP8 recipes (as DeepSeek-V3); router, attention core, "
                         "embedding, norms and optimizer stay float32; nvfp4 is simulate's and "
                         "plan's only");
    add_dispatch_payload_option(
        *cmd, [o](parallel::DispatchPayload p) { o->dispatch_payload = p; },
        parallel::DispatchPayload::recipe,
        "what the tokens sent to the routed experts travel as: recipe (default: the "
        "--precision's own format, e.g. E4M3 plus E8M0 scales for mxfp8, which the experts "
        "consume as they arrive) or activation (float32, quantized at the GEMM); the combine and "
        "every gradient travel as float32");
    add_moe_overlap_option(
        *cmd, o->moe_overlap, Side::engine,
        "how each MoE layer hides its all-to-all: off, shared (the shared experts compute while "
        "the dispatch flies) or dual (also two half micro-batches, one half's all-to-all in "
        "flight while the other's experts compute); shared helps with two_tier");
    cmd->add_option("--redundant-experts", o->redundant_experts,
                    "spare expert slots over the expert-parallel group (R): each rank holds "
                    "(experts + R) / ep slots, and the spare ones replicate the busiest experts "
                    "so that the busiest rank carries less; needs ep > 1 (default 0)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--rebalance-every", o->rebalance_every,
                    "with --redundant-experts: every N steps, place the expert slots for the "
                    "moving average of the measured load and migrate their weights and optimizer "
                    "state (default 0: never)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--router-skew", o->router_skew,
                    "start every router's correction bias at B for its first top-k experts (a "
                    "deliberately skewed router, to check expert load balancing; with "
                    "bias_update_speed = 0 in the config it stays); default 0");
    cmd->add_option("--moe-capacity-factor", o->moe_capacity_factor,
                    "expert-side MoE buffers per rank, in units of the balanced load (tokens x "
                    "top-k per rank); a step whose routing exceeds them runs the layer in extra "
                    "rounds (dropless, counted in the log); 0: the worst case, one round always")
        ->capture_default_str()
        ->check(finite_number(0, 1e6));
    cmd->add_option("--comm-timeout-s", o->comm_timeout_s,
                    "a collective waiting longer than this ends the job with an error naming it")
        ->check(positive_number(kMaxCommTimeoutS));
    cmd->add_option("--bucket-mb", o->bucket_mb,
                    "gradient-sync bucket size in MiB (buckets are posted as their gradients are "
                    "final during the backward)")
        ->check(positive_number(kMaxBucketMiB));
    cmd->add_flag("--no-zero1", o->no_zero1,
                  "replicate the optimizer state on every data-parallel rank, and the experts' on "
                  "every expert-data-parallel rank (all-reduce), instead of sharding it over those "
                  "groups (ZeRO-1: reduce-scatter and all-gather)");
    cmd->add_flag("--no-overlap-dp-grad", o->no_overlap_dp_grad,
                  "post the data-parallel gradient sync after the backward instead of during it");
    cmd->add_flag("--profile-ops", o->profile_ops,
                  "time every op of the run and print, at the end, where a step's time goes (per "
                  "category and per op)");
    cmd->add_option("--trace", o->trace_path,
                    "write the timeline of one step (every rank: compute, communication, waiting) "
                    "as a Chrome/Perfetto trace JSON file here");
    cmd->add_option("--trace-step", o->trace_step,
                    "the step that --trace records (default 2: after the first step's warm-up)")
        ->check(whole_number(1));
    cmd->callback([o] {
        if (o->layout_opt->count() > 0 || parallel::launched_as_mpi_job())
            run_train_mpi(*o);
        else
            run_train(*o, nullptr);
    });
}

}  // namespace moetron::cli
