// Gradient-sync overlap under mpirun (bench/run_grad_sync.sh): full training steps of a model
// preset in a parallel layout, interleaving steps with the bucketed gradient sync overlapped with
// the backward (buckets posted as they become final), steps with it after the backward (every
// bucket posted in finish()), and steps with no sync at all (the compute-only baseline), in the
// same run. Per mode, the medians over steps of:
//   step_s     the slowest rank's step time (forward_backward + sync + clip + AdamW + bias update)
//   exposed_s  the sync time the step waited for: GradSync::finish() on the rank that reached it
//              last (the others' waits also hold their lateness, not only communication), plus
//              that rank's posting time inside the backward (staging copies, MPI posts)
// and comm_s: the same sync with no backward around it (every bucket ready at once, then
// finish()): what it costs when nothing hides it. exposed fraction = exposed_s / comm_s; the
// step-time view of the same: (step_s - step_s with no sync) / comm_s.
// Also the optimizer state per rank by replica group (ZeRO-1 shards DP state over DP and the
// routed experts' over EDP) against the replicated baseline, and gather_wait_s: with ZeRO-1, how
// long the step still waited for the parameter all-gathers after the router bias update that
// they overlap (slowest rank, median).
//
//   bench_grad_sync [--config PATH] [--layout L] [--batch-size B] [--seq-len S] [--steps N]
//                   [--bucket-mb MB] [--zero1]
// Defaults: configs/models/small.toml (relative: run from the repository root), layout "" (data
// parallel over the world), 1 x 128 tokens per rank, 6 steps per mode (at least 5: the on/off step
// time ratio is printed as the median and min..max over the interleaved pairs,
// bench/ratio_spread.h), 4 MB buckets, all-reduce. Only rank 0 prints.
#include <cstdio>

#if MOETRON_HAVE_MPI

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/timer.h"
#include "moetron/core/user_error.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/model.h"
#include "moetron/parallel/grad_sync.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/optimizer.h"
#include "ratio_spread.h"

namespace moetron {
namespace {

using parallel::Communicator;

struct Options {
    std::string config_path = "configs/models/small.toml";  // from the repository root
    std::string layout;
    int64_t batch = 1;
    int64_t seq = 128;
    int steps = 6;
    double bucket_mb = 4.0;
    bool zero1 = false;
};

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            MT_CHECK(i + 1 < argc, "[bench] {} needs a value", arg);
            return argv[++i];
        };
        if (arg == "--config") {
            o.config_path = value();
        } else if (arg == "--layout") {
            o.layout = value();
        } else if (arg == "--batch-size") {
            o.batch = std::stoll(value());
        } else if (arg == "--seq-len") {
            o.seq = std::stoll(value());
        } else if (arg == "--steps") {
            o.steps = std::stoi(value());
        } else if (arg == "--bucket-mb") {
            o.bucket_mb = std::stod(value());
        } else if (arg == "--zero1") {
            o.zero1 = true;
        } else {
            MT_THROW("[bench] unknown flag '{}'", arg);
        }
    }
    MT_USER_CHECK(o.steps >= static_cast<int>(bench::kMinRatioPairs),
                  "--steps {}: the on/off ratio needs at least {} interleaved pairs", o.steps,
                  bench::kMinRatioPairs);
    return o;
}

double slowest(Communicator& world, double seconds) {
    std::vector<double> all(static_cast<size_t>(world.size()));
    world.all_gather(std::span<double>(all), std::span<const double>(&seconds, 1), kHostStream);
    return *std::max_element(all.begin(), all.end());
}

// The value of the rank with the largest key.
double at_last_rank(Communicator& world, double key, double value) {
    const std::array<double, 2> mine{key, value};
    std::vector<double> all(2 * static_cast<size_t>(world.size()));
    world.all_gather(std::span<double>(all), std::span<const double>(mine), kHostStream);
    size_t last = 0;
    for (size_t r = 1; r < all.size() / 2; ++r)
        if (all[2 * r] > all[2 * last]) last = r;
    return all[2 * last + 1];
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct StepTimes {
    double step_s = 0, exposed_s = 0, posted_early = 0, gather_wait_s = 0;
};

int run(const Options& o, Communicator& world) {
    const ModelConfig config = load_model_config(o.config_path);
    const parallel::Topology topo =
        parallel::make_topology(parallel::parse_layout(o.layout), world.size());
    validate_topology_for_model(topo, config);
    parallel::ParallelGroups groups = parallel::build_groups(world, topo);

    ModelParallel mp;
    mp.ep = groups.ep.get();
    mp.load = &world;
    Model model(config, {o.batch, o.seq}, {}, mp);
    model.init_parameters(1);
    const std::vector<parallel::ParamSpan> spans = model.param_spans();
    AdamWConfig adamw;
    adamw.grad_sync.bucket_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
    adamw.grad_sync.zero1 = o.zero1;
    // Two optimizers (each with its sync) over the same buffer and groups: overlapped and not.
    AdamW opt_overlapped(spans, model.num_params(), model.grads(), {world, *groups.dp, *groups.edp},
                         adamw);
    adamw.grad_sync.overlap = false;
    AdamW opt_after(spans, model.num_params(), model.grads(), {world, *groups.dp, *groups.edp},
                    adamw);
    parallel::GradSync& overlapped = opt_overlapped.grad_sync();
    parallel::GradSync& after = opt_after.grad_sync();
    parallel::GradSync* active = &overlapped;
    model.set_grad_ready_callback(
        [&active](int64_t begin, int64_t end) { active->grads_ready(begin, end); });

    // Random tokens; every rank draws its own slice of a global batch.
    const int64_t n = o.batch * o.seq;
    std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(tokens.size());
    RngStream rng(7, static_cast<uint64_t>(world.rank()));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(config.vocab_size));
    for (int64_t i = 0; i < n; ++i) targets[i] = tokens[(i + 1) % n];
    LossDenominators den = count_loss_denominators(config, targets.data(), o.batch, o.seq);
    den.lm_tokens *= topo.dp;
    den.sequences *= topo.dp;
    for (int64_t& m : den.mtp_tokens) m *= topo.dp;

    // sync null: the compute-only baseline (gradients left unsynchronized, optimizer still run).
    auto step = [&](parallel::GradSync* sync, AdamW& opt) {
        active = sync != nullptr ? sync : &after;
        world.barrier();
        const Timer t;
        model.zero_grads();
        if (sync != nullptr) sync->arm();
        model.forward_backward(tokens.data(), targets.data(), o.batch, o.seq, 1.0f, den);
        const double reached_finish_s = t.elapsed_s();
        if (sync != nullptr) sync->finish();
        opt.clip_gradients(model.grads());
        opt.post_step(model.params(), model.grads(), 1e-4);
        model.update_router_bias(1e-3f);  // overlaps the parameter all-gathers (ZeRO-1)
        const Timer gather;
        opt.finish_param_gathers();
        const double gather_wait_s = gather.elapsed_s();
        StepTimes s;
        s.gather_wait_s = slowest(world, gather_wait_s);
        s.step_s = slowest(world, t.elapsed_s());
        if (sync != nullptr) {
            const parallel::GradSyncStats& st = sync->last_stats();
            s.exposed_s = at_last_rank(world, reached_finish_s, st.exposed_s());
            s.posted_early = static_cast<double>(st.buckets_posted_in_backward);
        }
        return s;
    };

    step(&overlapped, opt_overlapped);  // warm-up: first touch, MPI connections
    step(&after, opt_after);
    std::vector<double> step_on, step_off, step_none, exposed_on, exposed_off, gather_wait;
    std::vector<double> on_over_off;  // per interleaved pair
    double posted_early = 0;
    for (int i = 0; i < o.steps; ++i) {
        // Interleaved, so that drift in the machine's load hits every mode alike.
        const StepTimes on = step(&overlapped, opt_overlapped);
        const StepTimes off = step(&after, opt_after);
        const StepTimes none = step(nullptr, opt_after);
        step_on.push_back(on.step_s);
        exposed_on.push_back(on.exposed_s);
        step_off.push_back(off.step_s);
        exposed_off.push_back(off.exposed_s);
        step_none.push_back(none.step_s);
        on_over_off.push_back(on.step_s / off.step_s);
        gather_wait.push_back(on.gather_wait_s);
        posted_early = on.posted_early;
    }
    // The sync alone: every bucket ready at once, nothing to hide behind.
    std::vector<double> comm;
    for (int i = 0; i < o.steps; ++i) {
        world.barrier();
        after.arm();
        after.grads_ready(0, model.num_params());
        after.finish();
        comm.push_back(slowest(world, after.last_stats().exposed_s()));
    }

    if (world.rank() == 0) {
        const double comm_s = median(comm);
        const auto& st = overlapped.last_stats();
        std::printf(
            "bench_grad_sync: %s on %d ranks, %s, %lld x %lld tokens per rank, %.1fM "
            "params/rank, %lld buckets of <= %.1f MB (%.1f MB reduced per rank), %s\n",
            config.name.c_str(), world.size(), topo.str().c_str(), static_cast<long long>(o.batch),
            static_cast<long long>(o.seq), static_cast<double>(model.num_params()) / 1e6,
            static_cast<long long>(st.num_buckets), o.bucket_mb,
            static_cast<double>(st.bytes) / (1 << 20),
            o.zero1 ? "ZeRO-1 (reduce-scatter + all-gather)" : "all-reduce");
        std::printf("  progress thread: %s\n",
                    groups.dp->progress_thread_active() ? "on" : "off (no MPI_THREAD_MULTIPLE)");
        const double none_s = median(step_none);
        std::printf("  sync alone (nothing to hide behind): comm_s %.4f\n", comm_s);
        std::printf("  no sync (compute only):  step_s %.4f\n", none_s);
        std::printf(
            "  overlap off: step_s %.4f  exposed_s %.4f  exposed fraction %.2f  (step-time view "
            "%.2f)\n",
            median(step_off), median(exposed_off), median(exposed_off) / comm_s,
            (median(step_off) - none_s) / comm_s);
        std::printf(
            "  overlap on:  step_s %.4f  exposed_s %.4f  exposed fraction %.2f  (step-time view "
            "%.2f; %.0f of %lld buckets posted during the backward)\n",
            median(step_on), median(exposed_on), median(exposed_on) / comm_s,
            (median(step_on) - none_s) / comm_s, posted_early,
            static_cast<long long>(st.num_buckets));
        std::printf("  %s\n", bench::format_ratio_spread("step time on / off",
                                                         bench::ratio_spread(on_over_off))
                                  .c_str());
        // Optimizer state per rank (this rank's; ranks differ only by padding), and what the
        // replicated baseline keeps: 2 moments per float of every bucket.
        std::array<double, 2> replicated_mb{};
        for (const parallel::GradBucket& b : overlapped.buckets().buckets())
            replicated_mb[b.group == parallel::ReplicaGroup::data_parallel ? 0 : 1] +=
                2.0 * static_cast<double>(b.numel) * sizeof(float) / (1 << 20);
        auto state_mb = [&](parallel::ReplicaGroup g) {
            return static_cast<double>(opt_overlapped.state_numel(g)) * sizeof(float) / (1 << 20);
        };
        std::printf(
            "  optimizer state per rank: dp %.2f MB, edp %.2f MB (replicated: dp %.2f MB, edp "
            "%.2f MB; dp %d, edp %d)\n",
            state_mb(parallel::ReplicaGroup::data_parallel),
            state_mb(parallel::ReplicaGroup::expert_data_parallel), replicated_mb[0],
            replicated_mb[1], groups.dp->size(), groups.edp->size());
        std::printf("  parameter all-gather wait after the bias update: %.4f s\n",
                    median(gather_wait));
    }
    return 0;
}

}  // namespace
}  // namespace moetron

int main(int argc, char** argv) {
    namespace parallel = moetron::parallel;
    std::unique_ptr<parallel::MpiSession> session;
    try {
        session = std::make_unique<parallel::MpiSession>(&argc, &argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_grad_sync: %s\n", e.what());
        return 2;
    }
    try {
        const moetron::Options options = moetron::parse_options(argc, argv);
        auto world = parallel::make_mpi_world(*session);
        const int status = moetron::run(options, *world);
        world.reset();
        return status;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_grad_sync: %s\n", e.what());
        parallel::MpiSession::abort_job(2);
    }
}

#else

int main() {
    std::fprintf(stderr, "bench_grad_sync: built without MPI\n");
    return 2;
}

#endif
