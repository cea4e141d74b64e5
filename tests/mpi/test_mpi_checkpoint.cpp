// Checkpoints of distributed runs (checkpoint/checkpoint_sharded.h), under mpirun -np 1, 2 and 4:
//  - resume in the same layout is bit-exact: 10 steps straight == 5 steps, save, a fresh trainer
//    loads, 5 steps (losses compared with ==, parameters and moments with memcmp), also with
//    tensor parallelism (tp2, tp2.ep2) and pipeline parallelism (pp2);
//  - resharding: a checkpoint saved under one layout resumes under another (4 ranks ep2 ->
//    2 ranks ep2, 1 rank distributed, 1 process, 4 ranks dp4; 1 process -> 4 ranks ep2;
//    4 ranks tp2.ep2 -> 1 process, 2 ranks ep2, 2 ranks tp2, 4 ranks dp4, 4 ranks tp4;
//    1 process -> 2 ranks tp2; 4 ranks pp2 x dp2 -> 1 process; 1 process -> 2 ranks pp2), the
//    resumed losses within 1e-5 relative of the uninterrupted run's and the final parameters within
//    1e-4 relative (per tensor L2, as test_mpi_training.cpp), since the reduction order changes
//    with the layout;
//  - a tp2.ep2 checkpoint exports to Hugging Face with every tensor whole and exact;
//  - every rank holds the run's id (rank 0's), the checkpoint records it, a resume continues it;
//  - a stop signal on one rank stops every rank after the same step, and that step is saved;
//  - a failure on one rank aborts the save on every rank and leaves the previous checkpoint;
//  - a missing shard, a shard of another checkpoint and a checkpoint of another model are errors
//    naming the file (and the differing key).
//
// Resharding within one job: the world is split into sub-communicators ({0, 1}, {0}) and a
// Trainer is built over one of them, the ranks outside it waiting at the next world barrier.
// This is the reliable choice: spawning mpirun from a process that mpirun started (nested
// launches) is not supported by Open MPI, and a sub-communicator is exactly the world a smaller
// job would have. (The launcher path, mpirun with a signal, is test_checkpoint_mpi_cli.cpp.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "moetron/checkpoint/hf_export.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "moetron/model/hf_names.h"
#include "moetron/model/moe.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/data_source.h"
#include "moetron/train/metrics.h"
#include "moetron/train/preset_path.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"
#include "mpi/shared_temp_dir.h"

namespace moetron::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 10;
constexpr int kSaveAt = 5;
constexpr double kLossTolerance = 1e-5;
constexpr double kParamL2Tolerance = 1e-4;

ModelConfig tiny_config() {
    return load_model_config(find_preset("tiny"));
}

TrainConfig run_config() {
    TrainConfig c;
    c.batch_size = 8;  // sequences per step over all ranks
    c.seq_len = 16;
    c.steps = kSteps;
    c.warmup_steps = 2;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.seed = 11;
    c.eval_batches = 1;
    c.eval_every = 0;
    return c;
}

struct Layout {
    std::string layout;  // as --layout; "" all data parallel
    bool zero1 = true;
    std::string str() const {
        return (layout.empty() ? "dp" : layout) + (zero1 ? "" : "+no-zero1");
    }
};

// world null: one process, no MPI.
std::unique_ptr<Trainer> make_trainer(parallel::Communicator* world, const Layout& l,
                                      const ModelConfig& model = tiny_config()) {
    const TrainConfig c = run_config();
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/3, /*num_bytes=*/20000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    RunSettings p;
    parallel::Communicator* job = world;
    p.layout = l.layout;
    p.zero1 = l.zero1;
    p.bucket_mb = 0.0625;  // several buckets, ZeRO-1 shards cutting tensors
    return std::make_unique<Trainer>(model, c, std::move(loader),
                                     plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
}

struct Losses {
    double lm = 0, mtp = 0, balance = 0, grad_norm = 0;
};

std::vector<Losses> run_steps(Trainer& t, int n) {
    std::vector<Losses> out;
    for (int i = 0; i < n; ++i) {
        const StepRecord r = t.step();
        out.push_back({r.loss, r.mtp_loss, r.balance_loss, r.grad_norm});
    }
    return out;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// The whole model as one process holds it, on every rank of the trainer's world: each element
// is contributed by exactly one rank (rank 0 for replicated tensors, the first expert-data-
// parallel replica for experts, the first data-parallel replica of each TP shard, placed by
// model/params.h's TensorParallelShard::for_each_run) and summed with zeros, so the gather is
// exact. Independent of the checkpoint code.
struct GlobalParams {
    std::vector<ParamEntry> entries;
    std::vector<float> values;
};

GlobalParams global_params(Trainer& t) {
    const ParamTable table(model_param_specs(t.model().config()));
    GlobalParams g;
    g.entries = table.entries();
    g.values.assign(static_cast<size_t>(table.total_numel()), 0.0f);
    const ExpertShard shard = t.model().expert_shard();
    const parallel::RankCoordinates c = parallel::coordinates_of(t.topology(), t.rank());
    for (const ParamEntry& e : t.model().param_entries()) {
        const bool expert = shard.count > 0 && is_routed_expert_param(e.name);
        // (A replicated tensor's first holder: the first replica of its pipeline stage.)
        const bool contributes = expert           ? c.edp == 0
                                 : e.tp.sharded() ? c.dp == 0
                                                  : c.dp == 0 && c.tp == 0;
        // A pipeline's shared embedding: its first stage's copy.
        if (!contributes || (e.name == "embed" && !t.model().runs_embedding())) continue;
        const int64_t first = expert ? shard.first * (e.numel / shard.count) : 0;
        float* global = g.values.data() + table.entry(e.name).offset + first;
        const float* local = t.model().params() + e.offset;
        e.tp.for_each_run(e.numel, [&](int64_t local_offset, int64_t global_offset, int64_t n) {
            std::copy(local + local_offset, local + local_offset + n, global + global_offset);
        });
    }
    t.world().all_reduce_sum(std::span<float>(g.values),
                             kHostStream);  // a one-process trainer: a no-op
    return g;
}

double rel(double a, double b) {
    return std::fabs(a - b) / std::max(std::fabs(b), 1e-12);
}

void expect_close_run(const std::vector<Losses>& got, const std::vector<Losses>& want,
                      const GlobalParams& got_params, const GlobalParams& want_params,
                      const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst_loss = 0;
    for (size_t s = 0; s < want.size(); ++s) {
        EXPECT_LE(rel(got[s].lm, want[s].lm), kLossTolerance) << what << " step " << s;
        EXPECT_LE(rel(got[s].mtp, want[s].mtp), kLossTolerance) << what << " step " << s;
        EXPECT_LE(rel(got[s].balance, want[s].balance), kLossTolerance) << what << " step " << s;
        worst_loss = std::max({worst_loss, rel(got[s].lm, want[s].lm), rel(got[s].mtp, want[s].mtp),
                               rel(got[s].balance, want[s].balance)});
    }
    ASSERT_EQ(got_params.entries.size(), want_params.entries.size());
    double worst_param = 0;
    for (const ParamEntry& e : want_params.entries) {
        const float* g = got_params.values.data() + e.offset;
        const float* w = want_params.values.data() + e.offset;
        double diff2 = 0, norm2 = 0;
        for (int64_t i = 0; i < e.numel; ++i) {
            const double d = static_cast<double>(g[i]) - w[i];
            diff2 += d * d;
            norm2 += static_cast<double>(w[i]) * w[i];
        }
        const double l2 = norm2 > 0 ? std::sqrt(diff2 / norm2) : std::sqrt(diff2);
        EXPECT_LE(l2, kParamL2Tolerance) << what << " " << e.name;
        worst_param = std::max(worst_param, l2);
    }
    std::printf("[maxerr] checkpoint %s: losses rel=%.3e, params l2rel=%.3e\n", what.c_str(),
                worst_loss, worst_param);
}

// ---- same layout: bit-exact ----

std::vector<Layout> layouts_for(int world_size) {
    std::vector<Layout> out = {{"", true}, {"", false}};
    if (world_size % 2 == 0) out.push_back({"ep2", true});
    if (world_size % 2 == 0) out.push_back({"tp2", true});  // on 4 ranks ZeRO-1 cuts TP shards
    if (world_size == 4) out.push_back({"ep2", false});
    if (world_size == 4) out.push_back({"tp2", false});
    if (world_size == 4) out.push_back({"tp2.ep2", true});
    if (world_size % 2 == 0) out.push_back({"pp2", true});  // on 4 ranks pp2 x dp2
    return out;
}

// Parameters and this rank's moments, as bytes.
std::vector<float> state_of(Trainer& t) {
    std::vector<float> s(t.model().params(), t.model().params() + t.model().num_params());
    for (const auto& r : t.optimizer().moment_ranges()) {
        s.insert(s.end(), r.m, r.m + r.numel);
        s.insert(s.end(), r.v, r.v + r.numel);
    }
    return s;
}

TEST(MpiCheckpoint, ResumeInTheSameLayoutIsBitExact) {
    parallel::Communicator& world = mpi_world();
    SharedTempDir dir(world);
    for (const Layout& l : layouts_for(world.size())) {
        auto straight = make_trainer(&world, l);
        const std::vector<Losses> want = run_steps(*straight, kSteps);

        auto first = make_trainer(&world, l);
        run_steps(*first, kSaveAt);
        const fs::path root = dir.path() / l.str();
        const fs::path saved = save_checkpoint(*first, root, 0);
        first.reset();

        auto resumed = make_trainer(&world, l);
        EXPECT_EQ(load_checkpoint(*resumed, root), saved);
        EXPECT_EQ(resumed->steps_done(), kSaveAt);
        const std::vector<Losses> got = run_steps(*resumed, kSteps - kSaveAt);
        for (int s = 0; s < kSteps - kSaveAt; ++s) {
            const Losses& w = want[static_cast<size_t>(kSaveAt + s)];
            EXPECT_EQ(got[s].lm, w.lm) << l.str() << " step " << kSaveAt + s + 1;
            EXPECT_EQ(got[s].mtp, w.mtp) << l.str() << " step " << kSaveAt + s + 1;
            EXPECT_EQ(got[s].balance, w.balance) << l.str() << " step " << kSaveAt + s + 1;
            EXPECT_EQ(got[s].grad_norm, w.grad_norm) << l.str() << " step " << kSaveAt + s + 1;
        }
        const std::vector<float> a = state_of(*straight), b = state_of(*resumed);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << l.str() << ": parameters or moments differ on rank " << world.rank();
        // One file per rank, listed in the state with the layout.
        for (int r = 0; r < world.size(); ++r)
            EXPECT_TRUE(fs::exists(saved / checkpoint_shard_file_name(r, world.size())));
    }
}

// One run, one identity (checkpoint/checkpoint_root.h): every rank holds rank 0's run id, the
// checkpoint records it, and a trainer that resumes continues it.
TEST(MpiCheckpoint, EveryRankSharesTheRunIdAndAResumeContinuesIt) {
    parallel::Communicator& world = mpi_world();
    SharedTempDir dir(world);
    auto first = make_trainer(&world, {});
    const std::string id = first->run_id();
    ASSERT_TRUE(is_run_id(id)) << id;
    std::string rank0_id = id;
    world.broadcast(rank0_id.data(), rank0_id.size(), DType::u8, 0, kHostStream);
    EXPECT_EQ(id, rank0_id) << "rank " << world.rank();
    run_steps(*first, 1);
    const fs::path saved = save_checkpoint(*first, dir.path() / "root", 0);
    EXPECT_EQ(checkpoint_run_id(saved), id);
    auto resumed = make_trainer(&world, {});
    EXPECT_NE(resumed->run_id(), id);
    load_checkpoint(*resumed, saved);
    EXPECT_EQ(resumed->run_id(), id);
}

// ---- resharding ----

// A trainer over a sub-communicator of the first `ranks` ranks (null on the others).
struct SubWorld {
    std::unique_ptr<parallel::Communicator> comm;
    bool member = false;
};

SubWorld first_ranks(int ranks) {
    parallel::Communicator& world = mpi_world();
    SubWorld s;
    s.member = world.rank() < ranks;
    s.comm = world.split(s.member ? 0 : 1, world.rank(), "checkpoint-sub");
    return s;
}

// The uninterrupted run of saved_layout on 4 ranks with ZeRO-1, and its step-5 checkpoint.
class ReshardingFrom : public ::testing::Test {
  protected:
    explicit ReshardingFrom(Layout saved_layout) : saved_layout_(std::move(saved_layout)) {}
    static std::unique_ptr<Trainer> single_process() { return make_trainer(nullptr, {}); }
    void SetUp() override {
        if (mpi_world().size() != 4)
            GTEST_SKIP() << "saves with 4 ranks (" << saved_layout_.str() << " on 4)";
        dir_ = std::make_unique<SharedTempDir>(mpi_world());
        auto straight = make_trainer(&mpi_world(), saved_layout_);
        want_ = run_steps(*straight, kSteps);
        want_params_ = global_params(*straight);
        auto first = make_trainer(&mpi_world(), saved_layout_);
        run_steps(*first, kSaveAt);
        saved_params_ = global_params(*first);
        checkpoint_ = save_checkpoint(*first, dir_->path() / saved_layout_.str(), 0);
    }
    void TearDown() override { dir_.reset(); }

    // Resumes the checkpoint in t and compares its last 5 steps with the uninterrupted run.
    void resume_and_compare(Trainer& t, const std::string& what) {
        load_checkpoint(t, checkpoint_);
        const std::vector<Losses> got = run_steps(t, kSteps - kSaveAt);
        const std::vector<Losses> want(want_.begin() + kSaveAt, want_.end());
        expect_close_run(got, want, global_params(t), want_params_, what);
    }

    // One process saves its step 5 (one shard) into checkpoint_.
    void save_one_process_checkpoint() {
        std::string error;
        fs::path saved = dir_->path() / "single";
        if (mpi_world().rank() == 0) {
            try {
                auto single = single_process();
                run_steps(*single, kSaveAt);
                save_checkpoint(*single, saved, 0);
            } catch (const std::exception& e) {
                error = e.what();
            }
        }
        throw_if_any_rank_failed(mpi_world(), error, "the one-process run");
        checkpoint_ = saved;
    }

    const Layout saved_layout_;
    std::unique_ptr<SharedTempDir> dir_;
    std::vector<Losses> want_;
    GlobalParams want_params_;
    GlobalParams saved_params_;  // at the checkpoint
    fs::path checkpoint_;
};

class Resharding : public ReshardingFrom {
  protected:
    Resharding() : ReshardingFrom({"ep2", true}) {}
};

TEST_F(Resharding, FourRanksEp2ToTwoRanksEp2) {
    SubWorld sub = first_ranks(2);
    if (sub.member) {
        auto t = make_trainer(sub.comm.get(), {"ep2", true});
        resume_and_compare(*t, "4 ranks ep2 -> 2 ranks ep2");
    }
    mpi_world().barrier();
}

TEST_F(Resharding, FourRanksEp2ToOneRank) {
    SubWorld sub = first_ranks(1);
    if (sub.member) {
        auto distributed = make_trainer(sub.comm.get(), {"", true});
        resume_and_compare(*distributed, "4 ranks ep2 -> 1 rank (distributed)");
        auto single = make_trainer(nullptr, {});
        resume_and_compare(*single, "4 ranks ep2 -> 1 process");
    }
    mpi_world().barrier();
}

TEST_F(Resharding, FourRanksEp2ToFourRanksDp4) {
    auto t = make_trainer(&mpi_world(), {"", true});
    resume_and_compare(*t, "4 ranks ep2 -> 4 ranks dp4 ZeRO-1");
    auto replicated = make_trainer(&mpi_world(), {"ep4", false});
    resume_and_compare(*replicated, "4 ranks ep2 -> 4 ranks ep4 replicated optimizer");
}

// One format for every world size: the 4 ranks' checkpoint and one process's have the same
// state.json fields, format and version (one shard file per rank), and one reader
// (read_checkpoint_tensors) reads both; the 4 ranks' holds exactly their parameters.
TEST_F(Resharding, OneProcessAndFourRanksWriteOneFormat) {
    const fs::path four_ranks = checkpoint_;
    save_one_process_checkpoint();
    const fs::path one_process = resolve_checkpoint_dir(checkpoint_);
    auto state_of_dir = [](const fs::path& dir) {
        std::ifstream in(dir / kCheckpointStateFile);
        return nlohmann::json::parse(in);
    };
    const nlohmann::json four = state_of_dir(four_ranks), one = state_of_dir(one_process);
    std::vector<std::string> four_keys, one_keys;
    for (const auto& [key, value] : four.items()) four_keys.push_back(key);
    for (const auto& [key, value] : one.items()) one_keys.push_back(key);
    EXPECT_EQ(four_keys, one_keys);
    EXPECT_EQ(four.at("format"), one.at("format"));
    EXPECT_EQ(four.at("version"), kCheckpointVersion);
    EXPECT_EQ(one.at("version"), kCheckpointVersion);
    EXPECT_EQ(four.at("shard_files").size(), 4u);
    EXPECT_EQ(one.at("shard_files"), nlohmann::json::array({checkpoint_shard_file_name(0, 1)}));
    for (const fs::path& dir : {four_ranks, one_process}) {
        std::vector<float> params(saved_params_.values.size());
        read_verified_checkpoint_state(dir);
        read_checkpoint_tensors(dir, saved_params_.entries, params.data(), nullptr, nullptr);
        if (dir == four_ranks) {
            EXPECT_EQ(params, saved_params_.values);
        }
    }
    mpi_world().barrier();
}

TEST_F(Resharding, OneProcessToFourRanksEp2) {
    // One process saves its step 5 (a world of one, one shard); the 4 ranks resume it.
    save_one_process_checkpoint();
    auto t = make_trainer(&mpi_world(), saved_layout_);
    resume_and_compare(*t, "1 process -> 4 ranks ep2");
}

// Pipeline parallelism: each stage writes its blocks' tensors under their logical names, so the
// union of the shards is the whole model, whatever the stages.
class ReshardingFromPp : public ReshardingFrom {
  protected:
    ReshardingFromPp() : ReshardingFrom({"pp2", true}) {}
};

TEST_F(ReshardingFromPp, FourRanksPp2ToOneProcess) {
    SubWorld sub = first_ranks(1);
    if (sub.member) {
        auto single = single_process();
        resume_and_compare(*single, "4 ranks pp2 x dp2 -> 1 process");
    }
    mpi_world().barrier();
}

TEST_F(ReshardingFromPp, OneProcessToTwoRanksPp2) {
    save_one_process_checkpoint();
    SubWorld sub = first_ranks(2);
    if (sub.member) {
        auto t = make_trainer(sub.comm.get(), {"pp2", true});
        resume_and_compare(*t, "1 process -> 2 ranks pp2");
    }
    mpi_world().barrier();
}

// Tensor parallelism: the checkpoint holds blocks of the global tensors (column-parallel row
// blocks, row-parallel column blocks, cut by ZeRO-1), read back under another TP split.
class ReshardingFromTp : public ReshardingFrom {
  protected:
    ReshardingFromTp() : ReshardingFrom({"tp2.ep2", true}) {}
};

TEST_F(ReshardingFromTp, FourRanksTp2Ep2ToOneProcess) {
    SubWorld sub = first_ranks(1);
    if (sub.member) {
        auto single = make_trainer(nullptr, {});
        resume_and_compare(*single, "4 ranks tp2.ep2 -> 1 process");
    }
    mpi_world().barrier();
}

TEST_F(ReshardingFromTp, FourRanksTp2Ep2ToTwoRanks) {
    SubWorld sub = first_ranks(2);
    if (sub.member) {
        auto ep = make_trainer(sub.comm.get(), {"ep2", true});
        resume_and_compare(*ep, "4 ranks tp2.ep2 -> 2 ranks ep2");
        auto tp = make_trainer(sub.comm.get(), {"tp2", true});
        resume_and_compare(*tp, "4 ranks tp2.ep2 -> 2 ranks tp2");
    }
    mpi_world().barrier();
}

TEST_F(ReshardingFromTp, FourRanksTp2Ep2ToFourRanks) {
    auto dp = make_trainer(&mpi_world(), {"", true});
    resume_and_compare(*dp, "4 ranks tp2.ep2 -> 4 ranks dp4 ZeRO-1");
    auto tp = make_trainer(&mpi_world(), {"tp4", true});
    resume_and_compare(*tp, "4 ranks tp2.ep2 -> 4 ranks tp4");
}

TEST_F(ReshardingFromTp, OneProcessToTwoRanksTp2) {
    save_one_process_checkpoint();
    SubWorld sub = first_ranks(2);
    if (sub.member) {
        auto t = make_trainer(sub.comm.get(), {"tp2", true});
        resume_and_compare(*t, "1 process -> 2 ranks tp2");
    }
    mpi_world().barrier();
}

// moetron export of the tp2.ep2 checkpoint: every HF tensor whole, equal to the trainer's
// parameters at the save (gathered independently of the checkpoint code).
TEST_F(ReshardingFromTp, ExportsWholeTensorsToHuggingFace) {
    std::string error;
    if (mpi_world().rank() == 0) {
        try {
            const fs::path hf = dir_->path() / "hf";
            export_hf(checkpoint_, hf, DType::f32);
            const SafetensorsFile file = SafetensorsFile::open((hf / kHfWeightsFile).string());
            const ParamTable table(model_param_specs(tiny_config()));
            int64_t compared = 0;
            const HfNameMap names(tiny_config());
            for (const HfTensor& t : names.tensors()) {
                std::vector<float> got(static_cast<size_t>(t.numel()));
                std::vector<float> want(got.size());
                file.read(t.hf_name, TensorView(got.data(), t.hf_shape, DType::f32));
                copy_param_to_hf(want.data(), t,
                                 saved_params_.values.data() + table.entry(t.param_name).offset);
                EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                    << t.hf_name;
                ++compared;
            }
            EXPECT_EQ(compared, static_cast<int64_t>(file.tensors().size()));
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    throw_if_any_rank_failed(mpi_world(), error, "exporting the tp2.ep2 checkpoint");
}

// ---- signals ----

TEST(MpiCheckpoint, StopSignalOnOneRankStopsEveryRankAtTheSameStep) {
    parallel::Communicator& world = mpi_world();
    SharedTempDir dir(world);
    const Layout l{world.size() % 2 == 0 ? "ep2" : "", true};
    auto t = make_trainer(&world, l);
    std::FILE* devnull = std::fopen("/dev/null", "w");
    ASSERT_NE(devnull, nullptr);
    RunControl control({(dir.path() / "root").string(), 0, 0, nullptr});
    t->set_run_control(&control);
    install_stop_signal_handlers();
    // The last rank alone is signalled, before the first step ends.
    if (world.rank() == world.size() - 1) {
        ASSERT_EQ(::raise(SIGTERM), 0);
    }
    MetricsLog log(kSteps, kSteps, "", false, devnull);
    const TrainSummary s = t->run(log);
    clear_stop_signal();
    std::fclose(devnull);
    EXPECT_TRUE(s.stopped_by_signal);
    EXPECT_EQ(s.steps, 1);
    EXPECT_EQ(t->steps_done(), 1);
    EXPECT_EQ(control.last_saved(), dir.path() / "root" / checkpoint_dir_name(1));
    auto resumed = make_trainer(&world, l);
    load_checkpoint(*resumed, dir.path() / "root");
    EXPECT_EQ(resumed->steps_done(), 1);
}

// ---- failures and bad checkpoints ----

class BadShardedCheckpoint : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = std::make_unique<SharedTempDir>(mpi_world());
        trainer_ = make_trainer(&mpi_world(), layout_);
        trainer_->step();
        first_ = save_checkpoint(*trainer_, dir_->path() / "root", 0);
        mpi_world().barrier();
    }
    void TearDown() override {
        trainer_.reset();
        dir_.reset();
    }
    std::string load_error(const fs::path& what) {
        auto fresh = make_trainer(&mpi_world(), layout_);
        return error_of([&] { load_checkpoint(*fresh, what); });
    }
    // Runs f on rank 0 alone, between barriers (the others wait for the file system change).
    void on_rank0(const std::function<void()>& f) {
        mpi_world().barrier();
        if (mpi_world().rank() == 0) f();
        mpi_world().barrier();
    }

    const Layout layout_{mpi_world().size() % 2 == 0 ? "ep2" : "", true};
    std::unique_ptr<SharedTempDir> dir_;
    std::unique_ptr<Trainer> trainer_;
    fs::path first_;
};

TEST_F(BadShardedCheckpoint, MissingShardFileIsNamed) {
    const std::string shard =
        checkpoint_shard_file_name(mpi_world().size() - 1, mpi_world().size());
    on_rank0([&] { fs::remove(first_ / shard); });
    const std::string err = load_error(first_);
    EXPECT_NE(err.find(shard), std::string::npos) << err;
    EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

TEST_F(BadShardedCheckpoint, ShardOfAnotherCheckpointFailsItsChecksum) {
    trainer_->step();
    const fs::path second = save_checkpoint(*trainer_, dir_->path() / "root", 0);
    const std::string shard = checkpoint_shard_file_name(0, mpi_world().size());
    on_rank0([&] {
        fs::copy_file(first_ / shard, second / shard, fs::copy_options::overwrite_existing);
    });
    const std::string err = load_error(second);
    EXPECT_NE(err.find((second / shard).string()), std::string::npos) << err;
    EXPECT_NE(err.find("checksum"), std::string::npos) << err;
}

TEST_F(BadShardedCheckpoint, CheckpointOfAnotherModelNamesTheKey) {
    ModelConfig other = tiny_config();
    other.num_hidden_layers += 1;
    auto t = make_trainer(&mpi_world(), layout_, other);
    const std::string err = error_of([&] { load_checkpoint(*t, first_); });
    EXPECT_NE(err.find("another model"), std::string::npos) << err;
    EXPECT_NE(err.find("num_hidden_layers"), std::string::npos) << err;
    EXPECT_NE(err.find(first_.string()), std::string::npos) << err;
    EXPECT_NE(err.find("state.json"), std::string::npos) << err;
}

TEST_F(BadShardedCheckpoint, ExistingCheckpointIsNeverOverwritten) {
    const std::string err = error_of([&] { save_checkpoint(*trainer_, dir_->path() / "root", 0); });
    EXPECT_NE(err.find("already exists"), std::string::npos) << err;
}

// A shard that cannot be written on one rank (its file-size limit, as a full disk would) fails
// the save on every rank; the previous checkpoint and `latest` stay, and no staging is left.
TEST_F(BadShardedCheckpoint, FailureOnOneRankAbortsTheSaveOnEveryRank) {
    trainer_->step();
    const int failing = mpi_world().size() - 1;
    rlimit saved_limit{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
    struct sigaction ignore {
    }, previous{};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &previous), 0);  // EFBIG instead of a core dump
    if (mpi_world().rank() == failing) {
        rlimit small = saved_limit;
        small.rlim_cur = 512;
        ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    }
    const std::string err = error_of([&] { save_checkpoint(*trainer_, dir_->path() / "root", 0); });
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved_limit), 0);
    ASSERT_EQ(::sigaction(SIGXFSZ, &previous, nullptr), 0);
    EXPECT_NE(err.find("rank " + std::to_string(failing)), std::string::npos) << err;
    EXPECT_NE(err.find(checkpoint_shard_file_name(failing, mpi_world().size())), std::string::npos)
        << err;
    mpi_world().barrier();
    const fs::path root = dir_->path() / "root";
    EXPECT_EQ(read_latest_pointer(root), checkpoint_dir_name(1));
    const std::vector<CheckpointDir> dirs = list_checkpoint_dirs(root);
    ASSERT_EQ(dirs.size(), 1u);
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(root)) {
        (void)e;
        ++entries;
    }
    EXPECT_EQ(entries, 2u) << "only step-00000001 and latest";
    auto fresh = make_trainer(&mpi_world(), layout_);
    EXPECT_EQ(load_checkpoint(*fresh, root), first_);
}

// A parameter that overflowed on one rank alone (a rank's own experts, say) fails the save on
// every rank, naming that rank, instead of leaving the others waiting in the save's collectives.
TEST_F(BadShardedCheckpoint, NonFiniteParameterOnOneRankFailsTheSaveOnEveryRank) {
    trainer_->step();
    const int failing = mpi_world().size() - 1;
    if (mpi_world().rank() == failing) {
        trainer_->model().params()[3] = std::numeric_limits<float>::quiet_NaN();
    }
    const std::string err = error_of([&] { save_checkpoint(*trainer_, dir_->path() / "root", 0); });
    EXPECT_NE(err.find("rank " + std::to_string(failing)), std::string::npos) << err;
    EXPECT_NE(err.find("holds nan at element 3"), std::string::npos) << err;
    mpi_world().barrier();
    EXPECT_EQ(read_latest_pointer(dir_->path() / "root"), checkpoint_dir_name(1));
}

}  // namespace
}  // namespace moetron::testing
