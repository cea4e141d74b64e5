#include "moetron/train/checkpoint.h"

#include <fmt/format.h>

#include <signal.h>

#include <csignal>
#include <exception>
#include <nlohmann/json.hpp>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "moetron/core/error.h"
#include "moetron/train/trainer.h"

namespace moetron {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Set by the SIGTERM/SIGINT handler, read at the end of each step (install_stop_signal_handlers).
// The only global mutable state here: a signal handler can only reach globals.
volatile std::sig_atomic_t g_stop_signal = 0;  // the signal number, 0 when none arrived

extern "C" void on_stop_signal(int signal_number) {
    g_stop_signal = signal_number;
}

// The optimizer's moment ranges, as the checkpoint reads and writes them.
std::vector<MomentShard> moment_shards(AdamW& optimizer) {
    std::vector<MomentShard> shards;
    for (const AdamW::MomentRange& r : optimizer.moment_ranges())
        shards.push_back({r.offset, r.numel, r.replicated, r.group_rank, r.m, r.v});
    return shards;
}

// Redundant experts: each MoE layer's slot table and moving average of the expert loads, so
// that a run resumed with the same slots routes, sums and rebalances as the saved one would have
// (state.json's "expert_balance"; null: none to save). The tensors themselves stay logical
// (checkpoint_sharded.h), whatever the placement.
json expert_balance_state(Trainer& trainer) {
    const ExpertBalancer* balancer = trainer.expert_balancer();
    if (balancer == nullptr) return nullptr;
    const std::vector<std::vector<int32_t>> tables = balancer->slot_tables();
    if (tables.empty()) return nullptr;
    return {{"slot_experts", tables},
            {"slot_shares", balancer->slot_shares()},
            {"load_average", balancer->averages()}};
}

// Before the tensors are read: the placements decide which slot reads which logical expert.
// b: state.json's "expert_balance" (null: none saved).
void restore_expert_balance(const json& b, Trainer& trainer) {
    ExpertBalancer* balancer = trainer.expert_balancer();
    if (balancer == nullptr || b.is_null()) return;
    balancer->restore(b.at("slot_experts").get<std::vector<std::vector<int32_t>>>(),
                      b.contains("slot_shares")  // older checkpoints: even shares
                          ? b.at("slot_shares").get<std::vector<std::vector<int32_t>>>()
                          : std::vector<std::vector<int32_t>>{},
                      b.at("load_average").get<std::vector<std::vector<double>>>());
}

}  // namespace

fs::path save_checkpoint(Trainer& trainer, const fs::path& root, size_t keep) {
    parallel::Communicator& world = trainer.world();
    const fs::path final_dir =
        root / checkpoint_dir_name(static_cast<uint64_t>(trainer.steps_done()));
    const std::string what = fmt::format("saving checkpoint '{}'", final_dir.string());

    // Each rank checks its own parameters (its shard of them); every rank learns of a failure,
    // so that one rank's NaN does not leave the others waiting in the save's collectives.
    std::vector<MomentShard> moments;
    TrainingStateView state;
    json expert_balance;
    run_on_every_rank(world, what, [&] {
        trainer.check_safe_to_save("a checkpoint");
        moments = moment_shards(trainer.optimizer());
        state.model_config = &trainer.model().config();
        state.train_config = &trainer.config();
        state.step = trainer.steps_done();
        state.optimizer_step = trainer.optimizer().step_count();
        state.skipped_steps = trainer.skipped_steps();
        state.data_rng = trainer.loader().state();  // every rank draws the same batches
        state.data_source = trainer.loader().source_name();
        state.run_id = trainer.run_id();
        state.topology = trainer.topology();
        expert_balance = expert_balance_state(trainer);
    });
    save_sharded_checkpoint(world, trainer.model(), moments, state, expert_balance, root, keep,
                            what);
    trainer.set_last_checkpoint(final_dir.string());
    return final_dir;
}

fs::path load_checkpoint(Trainer& trainer, const fs::path& dir_or_root) {
    parallel::Communicator& world = trainer.world();
    const std::string what = fmt::format("loading checkpoint '{}'", dir_or_root.string());
    Model& model = trainer.model();

    // Everything checked before anything is written: index, model, coverage.
    const OpenedCheckpoint opened = open_checkpoint_on_every_rank(world, dir_or_root, model, what);

    // The ranges this rank holds under its layout (the saved expert placements first: they say
    // which slot holds which expert).
    run_on_every_rank(world, what, [&] {
        restore_expert_balance(opened.expert_balance, trainer);
        AdamW& optimizer = trainer.optimizer();
        read_rank_tensors(opened, model, moment_shards(optimizer));
        optimizer.restore_step_count(opened.counters.optimizer_step);
    });
    const CheckpointCounters& counters = opened.counters;
    trainer.set_steps_done(counters.step);
    trainer.set_skipped_steps(counters.skipped_steps);
    if (counters.data_rng) trainer.loader().restore(*counters.data_rng);
    if (counters.run_id) trainer.set_run_id(*counters.run_id);
    trainer.set_last_checkpoint(opened.dir.string());
    return opened.dir;
}

// ---- signals ----

void install_stop_signal_handlers() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a write in progress continues; the step loop reads the flag
    for (int signal_number : {SIGTERM, SIGINT})
        MT_CHECK_ERRNO(sigaction(signal_number, &action, nullptr) == 0, "sigaction");
}

bool stop_signal_received() {
    return g_stop_signal != 0;
}

void clear_stop_signal() {
    g_stop_signal = 0;
}

bool RunControl::after_step(Trainer& trainer, const StepRecord& record) {
    // Every rank must stop after the same step and save it, whichever ranks the signal reached.
    const bool stop = any_rank(trainer.world(), stop_signal_received());
    const bool due = !options_.save_root.empty() &&
                     (stop || record.step == trainer.config().steps ||
                      (options_.save_every > 0 && record.step % options_.save_every == 0));
    if (due) {
        last_saved_ = save_checkpoint(trainer, options_.save_root, options_.keep);
        if (options_.out != nullptr) {
            std::fprintf(options_.out, "saved   checkpoint %s (step %lld)\n", last_saved_.c_str(),
                         static_cast<long long>(record.step));
            std::fflush(options_.out);
        }
    }
    if (stop && options_.out != nullptr) {
        const int signal_number = g_stop_signal;  // 0: the signal reached another rank
        std::fprintf(
            options_.out, "stopped by signal %s after step %lld%s\n",
            signal_number != 0 ? std::to_string(signal_number).c_str() : "(on another rank)",
            static_cast<long long>(record.step),
            options_.save_root.empty() ? " (no --save: nothing saved)" : "");
        std::fflush(options_.out);
    }
    return stop;
}

}  // namespace moetron
