// Pipeline parallelism trains the same as one process (training_equivalence.h): Trainer::step
// on N ranks in pipeline layouts (1F1B, interleaved 1F1B, zero-bubble ZB-H1; with data, expert or
// tensor parallelism inside the stages) against Trainer::step on one process. A non-finite
// gradient on one stage skips the step on every stage; redundant experts under a pipeline are
// refused.
//
// Runs under mpirun -np 1, 2 and 4; a layout that needs another world size is skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"
#include "mpi/training_equivalence.h"

namespace moetron::testing {
namespace {

// Pipeline parallelism: the stages of one model run their micro-batches in the 1F1B order and
// train the same model as one process. 3 micro-batches over 2 stages and 6 over 4: not multiples
// of pp. The tiny model's MTP module sits on the last stage with a copy of the embedding, whose
// gradient the first and last stages add up: its parameters match the reference on both. pp4
// without MTP puts the head alone on the last stage.
TEST(MpiTrainer, PipelineOneFOneBMatchesOneProcess) {
    const int n = mpi_world().size();
    if (n == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
    run_trainer_case({.layout = "pp" + std::to_string(n), .grad_accum = n == 2 ? 3 : 6});
    if (n == 4) run_trainer_case({.layout = "pp4", .grad_accum = 5, .mtp = false});
}

// Virtual stages (Megatron-LM's interleaved 1F1B): tiny's E|t*2|t|mL, chunks 0 and 2 on the first
// rank and 1 and 3 on the second, so the stream goes round the pipeline twice; on 4 ranks with
// the experts of each stage's MoE layers over two ranks.
TEST(MpiTrainer, PipelineInterleavedMatchesOneProcess) {
    const int n = mpi_world().size();
    if (n == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
    if (n == 2) run_trainer_case({.layout = "pp2.vpp2", .grad_accum = 4});
    if (n == 4)
        run_trainer_case({.layout = "pp2.vpp2.ep2", .grad_accum = 2, .pp_schedule = "interleaved"});
}

// The zero-bubble schedule zb-h1: each backward split into B and W (the GEMMs' weight gradients
// queued with copies of their operands and replayed later), the W's filling the cool-down. 3
// micro-batches over 2 stages and 6 over 4: not multiples of pp. With data parallelism the
// gradient sync posts buckets as the stage's last W makes them final; with expert parallelism
// the routed experts' grouped GEMMs are split too, with tensor parallelism the split weights'.
TEST(MpiTrainer, PipelineZeroBubbleMatchesOneProcess) {
    const int n = mpi_world().size();
    if (n == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
    run_trainer_case(
        {.layout = "pp" + std::to_string(n), .grad_accum = n == 2 ? 3 : 6, .pp_schedule = "zb-h1"});
    if (n == 4) {
        const TrainerRun dp =
            run_trainer_case({.layout = "pp2.dp2", .grad_accum = 3, .pp_schedule = "zb-h1"});
        // The last B's notices reach the sync during the last W: buckets post while it runs.
        EXPECT_GT(dp.last_sync.buckets_posted_in_backward, 0);
        run_trainer_case({.layout = "pp2.ep2", .grad_accum = 2, .pp_schedule = "zb-h1"});
        run_trainer_case({.layout = "tp2.pp2", .grad_accum = 3, .pp_schedule = "zb-h1"});
    }
}

// Tensor parallelism inside each stage: each TP rank sends its sequence-parallel rows of the
// stream to the same TP rank of the next stage.
TEST(MpiTrainer, PipelineWithTensorParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_trainer_case({.layout = "tp2.pp2", .grad_accum = 3});
}

// A NaN gradient on one stage skips the step on every stage: the gradient norm is the world's, so
// all stages see it non-finite, and none moves its parameters (nor its router biases).
TEST(MpiTrainer, PipelineStagesSkipANonFiniteStepTogether) {
    if (mpi_world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
    const ModelConfig model = tiny_config();
    const TrainConfig c = trainer_config(2);
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = "pp2";
    Trainer trainer(model, c, std::move(loader),
                    plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
    // Only the last stage's gradient is poisoned, at step 2.
    const bool poisoner = mpi_world().rank() == 1;
    trainer.set_grad_hook([poisoner](int64_t step, float* grads) {
        if (poisoner && step == 2) grads[0] = std::numeric_limits<float>::quiet_NaN();
    });
    trainer.step();
    const std::vector<float> before(trainer.model().params(),
                                    trainer.model().params() + trainer.model().num_params());
    const StepRecord skipped = trainer.step();
    EXPECT_FALSE(std::isfinite(skipped.grad_norm)) << "rank " << mpi_world().rank();
    EXPECT_TRUE(trainer.last_step_skipped()) << "rank " << mpi_world().rank();
    EXPECT_EQ(trainer.skipped_steps(), 1);
    const std::vector<float> after(trainer.model().params(),
                                   trainer.model().params() + trainer.model().num_params());
    EXPECT_EQ(before, after) << "rank " << mpi_world().rank() << " moved in a skipped step";
    trainer.step();
    EXPECT_FALSE(trainer.last_step_skipped());
}

// A pipeline of data-parallel replicas (ZeRO-1 per stage), and expert parallelism inside a stage.
TEST(MpiTrainer, PipelineWithDataOrExpertParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_trainer_case({.layout = "pp2.dp2", .grad_accum = 3});
    run_trainer_case({.layout = "pp2.ep2", .grad_accum = 2});
}

// Redundant experts sum their replicas' gradients in the last micro-batch's backward, which an
// interleaved pipeline splits: the combination is refused, on every rank alike.
TEST(MpiTrainer, RedundantExpertsUnderAPipelineAreRefused) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    const ModelConfig model = tiny_config();
    const TrainConfig c = trainer_config(2);
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = "pp2.ep2";
    p.moe.redundant_experts = 2;
    try {
        trainer_run(model, c, p, job);
        ADD_FAILURE() << "no error for --redundant-experts under pp2.ep2";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("pipeline"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace moetron::testing
