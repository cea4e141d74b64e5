// Time to train of a benchmark that runs a fixed number of optimizer steps and evaluates after
// each one (MLPerf Training's DeepSeek-V3 671B: the reference convergence points give the steps,
// the rules give the evaluation set). The evaluation is forward only, in the training layout.
#pragma once

#include <cstdint>

#include "moetron/sim/step.h"

namespace moetron::sim {

// One evaluation of `sequences` sequences in the step's layout: each data-parallel replica runs
// its share as micro-batches of the training micro-batch size through the pipeline, forward only
// (no EP overlap: no backward to hide the all-to-all behind). A replica with nothing to do waits
// for the others; the pipeline fills once.
double evaluation_time_s(const StepResult& step, int64_t sequences);

struct TimeToTrain {
    double steps = 0;
    double step_s = 0;
    double evaluation_s = 0;
    double total_s() const { return steps * (step_s + evaluation_s); }
};

TimeToTrain time_to_train(const StepResult& step, double steps, int64_t evaluation_sequences);

}  // namespace moetron::sim
