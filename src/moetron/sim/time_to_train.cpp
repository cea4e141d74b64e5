#include "moetron/sim/time_to_train.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::sim {

double evaluation_time_s(const StepResult& r, int64_t sequences) {
    MT_CHECK(sequences >= 1, "[sim] an evaluation needs at least one sequence, got {}", sequences);
    const parallel::Layout& l = r.layout;
    const int64_t per_micro_batch = l.dp * r.options.micro_batch;
    const int64_t micro_batches = (sequences + per_micro_batch - 1) / per_micro_batch;
    // One micro-batch's forward through each stage: its vpp chunks' blocks (inline all-to-all).
    double slowest_stage_s = 0, fill_s = 0;
    for (int64_t s = 0; s < l.pp; ++s) {
        double stage_s = 0;
        for (int64_t c = 0; c < l.vpp; ++c) {
            for (const auto& block : r.chunk_block_times[c * l.pp + s]) stage_s += block.first;
        }
        slowest_stage_s = std::max(slowest_stage_s, stage_s);
        fill_s += stage_s;
    }
    // The first micro-batch crosses every stage; the rest follow at the slowest stage's pace.
    return fill_s + static_cast<double>(micro_batches - 1) * slowest_stage_s;
}

TimeToTrain time_to_train(const StepResult& step, double steps, int64_t evaluation_sequences) {
    MT_CHECK(steps > 0, "[sim] a time to train needs a positive step count, got {}", steps);
    return {steps, step.step_time_s, evaluation_time_s(step, evaluation_sequences)};
}

}  // namespace moetron::sim
