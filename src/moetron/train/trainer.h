// The training loop, on one process or on every rank of an MPI job. One optimizer step:
//   zero the gradients once; draw the step's global batch (grad_accum micro-batches of batch_size
//   windows); run forward_backward on each micro-batch, normalized by the whole step's counts (so
//   the step's loss and gradient are means over all its valid tokens); clip the global gradient
//   norm; AdamW at the schedule's learning rate; then the aux-loss-free router bias update from
//   the loads the step counted.
// A step whose loss or gradient norm is not finite updates nothing (parameters, moments, router
// bias) and is counted; max_skipped_steps of them in a row end the run with an error. Checkpoints
// (train/checkpoint.h) save and restore the whole state; run() consults a RunControl after each
// step to save and to stop on SIGTERM/SIGINT.
// On N ranks (a world given): batch_size and grad_accum keep their meaning for the
// whole job, so N ranks train the same model as one process. Every rank draws the same global
// micro-batch and runs its slice of batch_size / dp sequences (the TP ranks of a data-parallel
// replica run the same slice, each with its share of the heads and MLP features, model.h's
// ModelParallel::tp); the routed experts are split over the EP group; gradients are summed over the
// data-parallel groups in buckets posted during the last micro-batch's backward
// (parallel/grad_sync.h) and the optimizer is ZeRO-1 by default (train/optimizer.h).
// With pipeline parallelism (pp > 1 in the layout) each rank runs one chunk of the model
// (RunPlan::chunks, model/pipeline_layout.h) and the step's micro-batches flow through the
// stages in the order of RunPlan::schedule (train/pipeline_runner.h); the losses are
// summed over the stages, the gradient norm over the world, so every stage clips and skips alike.
// One process is a world of one (no world given: the trainer makes a local communicator), so it
// takes the same path: the same optimizer, the same checkpoints. Losses, validation and expert
// loads are summed over the ranks. Everything a step touches (model arenas, optimizer moments,
// token buffers) is allocated in the constructor; only the expert-load statistics for the log
// allocate, outside the step's timing.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "moetron/checkpoint/train_config.h"
#include "moetron/core/trace.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/model/config.h"
#include "moetron/model/model.h"
#include "moetron/parallel/grad_sync.h"
#include "moetron/parallel/topology.h"
#include "moetron/parallel/traced_communicator.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/expert_balance.h"
#include "moetron/train/lr_schedule.h"
#include "moetron/train/metrics.h"
#include "moetron/train/optimizer.h"
#include "moetron/train/pipeline_runner.h"
#include "moetron/train/run_plan.h"

namespace moetron {

class RunControl;  // train/checkpoint.h

struct TrainSummary {
    int64_t steps = 0;
    double first_loss = 0;  // training loss of the first step of this run
    double last_loss = 0;   // training loss of the last step
    double last_val_loss = 0;
    double train_s = 0;       // sum of the steps' compute times
    double tokens_per_s = 0;  // over the whole run
    double model_tflops = 0;  // over the whole run
    // Steps of this run skipped for a non-finite loss or gradient norm.
    int64_t skipped_steps = 0;
    // A RunControl stopped the run early (SIGTERM/SIGINT).
    bool stopped_by_signal = false;
};

class Trainer {
  public:
    // Builds and initializes the model (seed from config), the optimizer and the buffers of
    // `plan` (plan_run: the layout already checked against the world, the model and the batch);
    // with a world, also the parallel groups (a collective over it). world: every rank of the job,
    // outliving the Trainer; null for one process (the trainer makes a local world of one). The
    // model and the optimizer run their ops on `backend` (a ProfilingBackend over the run's
    // backend to profile).
    Trainer(const ModelConfig& model_config, const TrainConfig& config, DataLoader loader,
            const RunPlan& plan, parallel::Communicator* world = nullptr,
            Backend& backend = cpu_backend());
    // One process, float32, every setting its default: plan_run(model, config, {}, 1).
    Trainer(const ModelConfig& model_config, const TrainConfig& config, DataLoader loader);

    // One optimizer step; returns its record (val_loss NaN).
    StepRecord step();
    // Mean next-token loss over the eval_batches fixed validation micro-batches (nats/token).
    double evaluate();
    // Steps until config.steps, validating every eval_every steps and after the last step,
    // logging each step.
    TrainSummary run(MetricsLog& log);

    // MFU is reported against this peak (GFLOP/s); 0 leaves MFU at 0.
    void set_gemm_peak_gflops(double peak) { gemm_peak_gflops_ = peak; }

    Model& model() { return *model_; }
    // The optimizer; checkpoints (train/checkpoint.h) read and restore its moments.
    // The expert load balancing (null without expert parallelism): checkpoints save and restore
    // its placements and moving averages.
    ExpertBalancer* expert_balancer() { return balancer_.get(); }
    AdamW& optimizer() { return *optimizer_; }
    const AdamW& optimizer() const { return *optimizer_; }
    // Checkpointing (train/checkpoint.h) restores these.
    void set_steps_done(int64_t steps) { steps_done_ = steps; }
    // Steps whose loss or gradient norm was not finite: they update nothing (no parameters,
    // moments or router bias). After max_skipped_steps in a row, step() throws naming
    // last_checkpoint (set by the checkpoint code).
    int64_t skipped_steps() const { return skipped_steps_; }
    void set_skipped_steps(int64_t n) { skipped_steps_ = n; }
    int64_t consecutive_skipped_steps() const { return consecutive_skipped_; }
    bool last_step_skipped() const { return last_step_skipped_; }
    void set_max_skipped_steps(int64_t n) { max_skipped_steps_ = n; }
    void set_last_checkpoint(std::string path) { last_checkpoint_ = std::move(path); }
    // The run's identity (train/checkpoint_root.h): drawn at construction (the same on every
    // rank), replaced by the checkpoint's when the run resumes.
    const std::string& run_id() const { return run_id_; }
    void set_run_id(std::string id) { run_id_ = std::move(id); }
    // Throws, naming `what` ("a checkpoint", "--save-final") and the last good checkpoint, when the
    // parameters are not fit to be saved as good: the last step's loss was not finite (the
    // parameters, though finite, produce NaN), or a parameter of this rank holds a NaN or an
    // infinity (a step with a finite loss can still overflow them in its update: a huge lr or
    // weight_decay). A skipped step whose loss was finite (one NaN gradient) keeps the parameters
    // of the last good step, and they may be saved.
    void check_safe_to_save(std::string_view what) const;
    // Test hook: sees the step's gradients after the backward, before clipping (e.g. to poison
    // one with a NaN). Null (the default) for none.
    void set_grad_hook(std::function<void(int64_t step, float* grads)> hook) {
        grad_hook_ = std::move(hook);
    }
    // The profiler the run's backend is (--profile-ops): run() pauses it during validations, so
    // that it counts the training steps' ops. Null (the default): none.
    void set_profiler(ProfilingBackend* profiler) { profiler_ = profiler; }
    // run() asks it after each step whether to save and whether to stop; null for neither.
    void set_run_control(RunControl* control) { run_control_ = control; }
    DataLoader& loader() { return loader_; }
    const TrainConfig& config() const { return config_; }
    int64_t steps_done() const { return steps_done_; }
    // Model FLOPs of one step of the whole job (all ranks).
    double model_flops_per_step() const { return model_flops_per_step_; }

    // Every rank of the job; a local world of one on one process. Checkpoints are collectives
    // over it.
    parallel::Communicator& world() const { return *world_; }
    int rank() const { return world_->rank(); }
    int world_size() const { return world_->size(); }
    const parallel::Topology& topology() const { return plan_.topology; }
    const RunPlan& plan() const { return plan_; }
    // Floats of optimizer state this rank keeps (moments; with ZeRO-1 also the fp32 shard).
    int64_t optimizer_state_numel() const;
    // The last step's gradient synchronization.
    parallel::GradSyncStats last_sync_stats() const;
    // This rank's pipeline stage runner; null without pipeline parallelism.
    const PipelineRunner* pipeline() const { return pipeline_.get(); }

    // Records the timeline of the run's step-th step (1-based, counted from where run() starts,
    // so also after a resume) and writes it,
    // all ranks in one Chrome/Perfetto trace (core/trace.h), to path from rank 0 after that step.
    // Every rank must get the same call. step 0: no trace.
    void set_trace(std::string path, int64_t step);

  private:
    // The parts of step(), in its order.
    void begin_step();
    LossDenominators load_step_batch();
    std::array<double, 3> forward_backward_all(const LossDenominators& den);
    bool skip_unless_finite(const StepRecord& r);  // true: the step updates nothing
    void update_parameters(double lr);
    void after_update(StepRecord& r, const ExpertLoadStats& load, double expert_compute_s);
    void record_time_and_throughput(StepRecord& r, double compute_s);
    void record_stage_times(StepRecord& r);
    void write_trace();

    TrainConfig config_;
    RunPlan plan_;
    std::unique_ptr<parallel::Communicator> own_world_;  // one process: the world of one
    parallel::Communicator* world_ = nullptr;            // the job's world, or own_world_
    // Declared before the groups, which record into them.
    TraceRecorder trace_;
    parallel::CommWaitTotals comm_wait_;  // this step's blocked time per traffic class
    parallel::ParallelGroups groups_;     // every group traced
    DataLoader loader_;
    // The model's backend with zb-h1 (it splits the backwards), over the given one; else null.
    std::unique_ptr<SplitBackwardBackend> split_backward_;
    std::unique_ptr<Model> model_;
    std::unique_ptr<AdamW> optimizer_;
    std::unique_ptr<ExpertBalancer> balancer_;  // with expert parallelism
    std::unique_ptr<PipelineRunner> pipeline_;  // pp > 1 only
    LrSchedule schedule_;
    int64_t rank_rows_ = 0;         // sequences of a micro-batch that this rank runs
    int64_t first_rank_row_ = 0;    // its first sequence in the micro-batch
    std::vector<int32_t> tokens_;   // (grad_accum * batch_size, seq_len): the step's batch
    std::vector<int32_t> targets_;  // (grad_accum * batch_size, seq_len)
    int64_t steps_done_ = 0;
    double model_flops_per_step_ = 0;
    double gemm_peak_gflops_ = 0;
    int64_t skipped_steps_ = 0;
    int64_t consecutive_skipped_ = 0;
    int64_t max_skipped_steps_ = 5;
    bool last_step_skipped_ = false;
    double last_loss_ = 0;  // the last step's loss, summed over ranks
    std::string last_checkpoint_;
    std::string run_id_;
    std::function<void(int64_t, float*)> grad_hook_;
    RunControl* run_control_ = nullptr;
    ProfilingBackend* profiler_ = nullptr;
    std::string trace_path_;
    int64_t trace_step_ = 0;
};

// The process's peak resident set size so far, in bytes (getrusage).
int64_t peak_rss_bytes();

}  // namespace moetron
