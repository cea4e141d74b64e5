// Per-step training metrics: the record, the machine's measured GEMM peak that MFU is taken
// against, and the log that shows them: a progress bar on a terminal, plain lines otherwise,
// and optionally one JSON object per step in a .jsonl file. Lines are formatted into a buffer
// owned by the log, so logging a step allocates nothing.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace moetron {

struct StepRecord {
    int64_t step = 0;         // 1-based: the number of optimizer steps done
    double loss = 0;          // mean next-token cross-entropy over the step's micro-batches
    double mtp_loss = 0;      // mean MTP cross-entropy (0 without MTP)
    double balance_loss = 0;  // alpha-weighted sequence-wise balance loss
    double lr = 0;
    double grad_norm = 0;  // global norm before clipping
    double step_s = 0;     // wall time of the step's compute (not of its logging)
    double tokens_per_s = 0;
    double model_tflops = 0;               // model FLOPs (model/flops.h) per second, in TFLOP/s
    double mfu = 0;                        // model FLOP/s over the measured GEMM peak
    double expert_load_max_over_mean = 0;  // worst MoE layer
    double expert_load_min_over_mean = 0;
    // Expert dispatch on this rank during the step (parallel/expert_dispatcher.h): bytes sent to
    // ranks of its own scale-up domain and of other domains, and the destination domains per
    // routed token (mean and max over the step's MoE layers).
    double dispatch_intra_domain_bytes = 0;
    double dispatch_inter_domain_bytes = 0;
    double domains_per_token_mean = 0;
    double domains_per_token_max = 0;
    // MoE layer passes (forward; the backward repeats them) whose routing exceeded the planned
    // expert-side capacity on some rank, and the extra rounds they took (model/moe.h): dropless,
    // but slower. Zero in a balanced step.
    int64_t moe_overflowed_layers = 0;
    int64_t moe_extra_rounds = 0;
    // Expert load balancing (train/expert_balance.h): the tokens each EP rank's experts received,
    // max over mean, worst MoE layer, under the placement that served the step (0 without expert
    // parallelism). After a rebalance (--rebalance-every): the migration's time and slots moved,
    // the moving-average load per rank (max/mean) under the old and the new placement, and the
    // moving average per logical expert (summed over the MoE layers).
    double rank_load_max_over_mean = 0;
    // The step's routed-expert computation time (model.h's take_expert_compute_s): the slowest EP
    // rank's and the EP group's mean (0 without expert parallelism).
    double expert_compute_max_s = 0, expert_compute_mean_s = 0;
    bool rebalanced = false;
    double rebalance_migration_s = 0;
    double rebalance_migrated_slots = 0;
    double rebalance_before = 0, rebalance_after = 0;
    std::vector<double> average_expert_load;
    double val_loss = std::numeric_limits<double>::quiet_NaN();  // set on validation steps

    // Where this rank's step time went (distributed runs; zeros on one process): time blocked in
    // collectives of the expert (dispatch/combine), tensor-parallel and data-parallel groups,
    // and the rest (step_s minus those). grad_sync_exposed_s is the gradient sync's share that
    // the backward did not hide (parallel/grad_sync.h); it is part of dp_comm_s.
    double compute_only_s = 0;
    double expert_comm_s = 0;
    double tp_comm_s = 0;
    double dp_comm_s = 0;
    double grad_sync_exposed_s = 0;
    // Bytes this rank moved per collective kind (parallel::CollectiveKind order; the
    // communicator counters' payload convention).
    std::array<uint64_t, 7> payload_bytes{};
    // Pipeline parallelism (pp > 1; empty otherwise): for each stage of rank 0's pipeline, the
    // time it spent computing its forwards and backwards (busy) and waiting for its neighbours'
    // activations and gradients (idle: the bubble, and transfers not hidden).
    std::vector<double> stage_busy_s, stage_idle_s;
    // The pipeline's idle share of its stages' time, as moetron simulate defines it:
    // 1 - mean(busy) / span, the span being the slowest stage's busy + idle (the stages start the
    // step together). A stage that finishes its last action early waits out the rest of the step
    // outside the pipeline's waits (in the gradient sync or the loss sum), so its own idle time
    // misses that tail; the span counts it.
    double bubble_fraction() const;
};

// Best sustained single-precision GEMM rate of this machine in GFLOP/s, with the threads now
// configured: square n x n x n sgemm through the CPU backend's matmul, repeated for about
// `seconds`.
double measure_gemm_peak_gflops(int64_t n = 1024, double seconds = 0.3);

class MetricsLog {
  public:
    // total_steps: for the bar and the plain-line rhythm (plain lines every print_every steps,
    // and always at the first and last step and on validation). jsonl_path: "" for none.
    // terminal: draw a progress bar (use isatty on the output) instead of plain lines.
    // longest_list: the most entries a record's lists hold (logical experts for
    // average_expert_load, pipeline stages for the busy/idle times): the line buffer is planned
    // from it, and a record with a longer list is an internal error, never a cut line.
    MetricsLog(int64_t total_steps, int64_t print_every, const std::string& jsonl_path,
               bool terminal, std::FILE* out = stdout, int64_t longest_list = 0);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;

    void log_step(const StepRecord& record);
    // Ends the bar's line and flushes the JSONL file (checking that every write landed).
    void finish();

  private:
    void write_out(const char* text, size_t size);

    int64_t total_steps_;
    int64_t print_every_;
    bool terminal_;
    std::FILE* out_;
    std::string jsonl_path_;
    std::FILE* jsonl_ = nullptr;
    bool bar_open_ = false;  // the bar's line has no newline yet
    double compute_s_ = 0;   // of the steps logged so far, for the bar's time estimate
    int64_t steps_logged_ = 0;
    int64_t longest_list_;
    std::vector<char> line_;  // planned in the constructor from longest_list
};

}  // namespace moetron
