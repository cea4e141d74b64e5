// The single-process training loop. One optimizer step:
//   zero the gradients once; for each of grad_accum micro-batches draw batch_size windows and run
//   forward_backward with grad_scale 1 / grad_accum (so the step's gradient is the mean over
//   micro-batches); clip the global gradient norm; AdamW at the schedule's learning rate; then
//   the aux-loss-free router bias update from the loads the step counted.
// Everything a step touches (model arenas, optimizer moments, token buffers) is allocated in the
// constructor; only the expert-load statistics for the log allocate, outside the step's timing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moetron/model/config.h"
#include "moetron/model/model.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/lr_schedule.h"
#include "moetron/train/metrics.h"
#include "moetron/train/optimizer.h"
#include "moetron/train/train_config.h"

namespace moetron {

struct TrainSummary {
    int64_t steps = 0;
    double first_loss = 0;  // training loss of the first step of this run
    double last_loss = 0;   // training loss of the last step
    double last_val_loss = 0;
    double train_s = 0;       // sum of the steps' compute times
    double tokens_per_s = 0;  // over the whole run
    double model_tflops = 0;  // over the whole run
};

class Trainer {
  public:
    // Builds and initializes the model (seed from config), the optimizer and the buffers.
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
    const AdamW& optimizer() const { return optimizer_; }
    DataLoader& loader() { return loader_; }
    const TrainConfig& config() const { return config_; }
    int64_t steps_done() const { return optimizer_.step_count(); }
    double model_flops_per_step() const { return model_flops_per_step_; }

  private:
    TrainConfig config_;
    DataLoader loader_;
    std::unique_ptr<Model> model_;
    AdamW optimizer_;
    LrSchedule schedule_;
    std::vector<int32_t> tokens_;   // (batch_size, seq_len)
    std::vector<int32_t> targets_;  // (batch_size, seq_len)
    double model_flops_per_step_ = 0;
    double gemm_peak_gflops_ = 0;
};

// The process's peak resident set size so far, in bytes (getrusage).
int64_t peak_rss_bytes();

}  // namespace moetron
