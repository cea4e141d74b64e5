// A trainer's checkpoints: save_checkpoint and load_checkpoint of a whole Trainer, the stop
// signals, and the RunControl that saves during a run. The format and the collective save and
// load are checkpoint_dir.h's and checkpoint_sharded.h's; this is what fills them from the
// Trainer (its model, optimizer moments, counters, loader and expert placements) and writes back
// what a load read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

namespace moetron {

class Trainer;
struct StepRecord;

// The trainer's whole state into root/step-<steps done> (see save_training_state), one shard per
// rank: a collective over trainer.world(), every rank calls it (checkpoint_sharded.h says who
// writes what). Throws on every rank when any rank fails, leaving root as it was.
std::filesystem::path save_checkpoint(Trainer& trainer, const std::filesystem::path& root,
                                      size_t keep);
// Restores parameters, moments, optimizer and schedule step, skipped-step count and the data
// loader's RNG from a checkpoint directory or root, whatever world size and layout wrote it: a
// collective over trainer.world(). Returns the directory loaded.
std::filesystem::path load_checkpoint(Trainer& trainer, const std::filesystem::path& dir_or_root);

// ---- stopping on SIGTERM / SIGINT ----
// The handlers only set a flag (the one piece of global mutable state of the checkpoint code, a
// volatile sig_atomic_t as the C++ standard allows a handler to write); the trainer reads it at
// the end of each step, saves and stops. A second signal while saving is ignored. In a
// distributed run the ranks agree on the flag at the end of every step (one all-reduce of a
// number), so that a signal reaching any rank stops every rank after the same step, and every
// rank saves that step.
void install_stop_signal_handlers();
bool stop_signal_received();
void clear_stop_signal();  // for tests that run several trainers in one process

// What Trainer::run consults after each logged step (Trainer::set_run_control).
class RunControl {
  public:
    struct Options {
        std::string save_root;     // "" : no checkpoints
        int64_t save_every = 0;    // 0: only at the end and on a stop signal
        size_t keep = 0;           // 0: keep every checkpoint
        std::FILE* out = nullptr;  // progress lines ("saved ..."); null: quiet
    };
    explicit RunControl(Options options) : options_(std::move(options)) {}
    // Saves when due (every save_every steps, at the last step, on a stop signal). Returns true
    // when the run must stop (a stop signal arrived; on any rank of a distributed trainer).
    bool after_step(Trainer& trainer, const StepRecord& record);
    const std::filesystem::path& last_saved() const { return last_saved_; }

  private:
    Options options_;
    std::filesystem::path last_saved_;
};

}  // namespace moetron
