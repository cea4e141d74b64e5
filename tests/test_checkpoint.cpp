// train/checkpoint: bit-exact resume (10 steps straight == 5, save, fresh trainer, load, 5),
// `latest` and retention, non-finite steps skipped, and damaged or foreign checkpoints rejected
// with errors naming the file and tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

ModelConfig tiny_config() {
    return load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
}

TrainConfig small_run() {
    TrainConfig c;
    c.batch_size = 2;
    c.seq_len = 16;
    c.steps = 10;
    c.warmup_steps = 3;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.seed = 7;
    c.eval_batches = 1;
    c.eval_every = 0;
    return c;
}

std::unique_ptr<Trainer> make_trainer(const ModelConfig& model, const TrainConfig& c) {
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/3, /*num_bytes=*/8000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    return std::make_unique<Trainer>(model, c, std::move(loader));
}

bool same_bits(const float* a, const float* b, int64_t n) {
    return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// The optimizer's first (second: false) or second moments laid out like the parameters, zeros
// where it keeps none (non-trainable tensors).
std::vector<float> moments_of(Trainer& t, bool first) {
    std::vector<float> out(static_cast<size_t>(t.model().num_params()), 0.0f);
    for (const AdamW::MomentRange& r : t.optimizer().moment_ranges())
        std::copy_n(first ? r.m : r.v, r.numel, out.begin() + r.offset);
    return out;
}

// The one shard a one-process trainer writes.
const std::string kOneShard = checkpoint_shard_file_name(0, 1);

TEST(Checkpoint, ResumeIsBitExact) {
    const ModelConfig model = tiny_config();
    const TrainConfig c = small_run();
    TempDir dir;

    auto straight = make_trainer(model, c);
    std::vector<double> straight_losses;
    for (int i = 0; i < 10; ++i) straight_losses.push_back(straight->step().loss);

    std::vector<double> resumed_losses;
    {
        auto first = make_trainer(model, c);
        for (int i = 0; i < 5; ++i) resumed_losses.push_back(first->step().loss);
        const fs::path saved = save_checkpoint(*first, dir.path(), 0);
        EXPECT_EQ(saved.filename().string(), checkpoint_dir_name(5));
    }
    // A fresh trainer with another seed: everything must come from the checkpoint.
    TrainConfig other = c;
    other.seed = 99;
    auto second = make_trainer(model, other);
    load_checkpoint(*second, dir.path() / checkpoint_dir_name(5));
    EXPECT_EQ(second->steps_done(), 5);
    for (int i = 0; i < 5; ++i) resumed_losses.push_back(second->step().loss);

    for (int i = 0; i < 10; ++i) {
        std::printf("[bitexact] step %d straight %.17g resumed %.17g\n", i + 1,
                    straight_losses[static_cast<size_t>(i)],
                    resumed_losses[static_cast<size_t>(i)]);
        EXPECT_EQ(std::memcmp(&straight_losses[static_cast<size_t>(i)],
                              &resumed_losses[static_cast<size_t>(i)], sizeof(double)),
                  0)
            << "loss of step " << i + 1;
    }
    const int64_t n = straight->model().num_params();
    EXPECT_TRUE(same_bits(straight->model().params(), second->model().params(), n));
    EXPECT_TRUE(same_bits(moments_of(*straight, true).data(), moments_of(*second, true).data(), n));
    EXPECT_TRUE(
        same_bits(moments_of(*straight, false).data(), moments_of(*second, false).data(), n));
    EXPECT_EQ(straight->optimizer().step_count(), second->optimizer().step_count());
    // The router biases moved (so the comparison above covers them) and are in the checkpoint.
    const TensorView bias = straight->model().param("layers.1.mlp.router_bias");
    bool moved = false;
    for (int64_t e = 0; e < bias.shape.numel(); ++e) moved |= bias.f32()[e] != 0.0f;
    EXPECT_TRUE(moved);
}

TEST(Checkpoint, ResumeFromRootFollowsLatestAndKeepRetains) {
    const ModelConfig model = tiny_config();
    TrainConfig c = small_run();
    c.steps = 6;
    TempDir dir;
    auto t = make_trainer(model, c);
    RunControl control({dir.path().string(), /*save_every=*/2, /*keep=*/2, nullptr});
    t->set_run_control(&control);
    MetricsLog log(c.steps, 100, "", false, stdout);
    t->run(log);
    const std::vector<CheckpointDir> dirs = list_checkpoint_dirs(dir.path());
    ASSERT_EQ(dirs.size(), 2u);  // steps 2, 4, 6 saved; keep 2
    EXPECT_EQ(dirs[0].step, 4u);
    EXPECT_EQ(dirs[1].step, 6u);
    EXPECT_EQ(read_latest_pointer(dir.path()).value(), checkpoint_dir_name(6));

    auto fresh = make_trainer(model, c);
    const fs::path loaded = load_checkpoint(*fresh, dir.path());
    EXPECT_EQ(loaded.filename().string(), checkpoint_dir_name(6));
    EXPECT_EQ(fresh->steps_done(), 6);
    EXPECT_TRUE(same_bits(t->model().params(), fresh->model().params(), t->model().num_params()));
}

TEST(Checkpoint, NonFiniteGradientSkipsTheStep) {
    const ModelConfig model = tiny_config();
    const TrainConfig c = small_run();
    auto t = make_trainer(model, c);
    t->step();
    const int64_t n = t->model().num_params();
    const std::vector<float> params(t->model().params(), t->model().params() + n);
    const std::vector<float> m = moments_of(*t, true);
    const int64_t opt_steps = t->optimizer().step_count();
    // Poison one gradient of step 2 only.
    t->set_grad_hook([](int64_t step, float* grads) {
        if (step == 2) grads[17] = std::numeric_limits<float>::quiet_NaN();
    });
    const StepRecord r = t->step();
    EXPECT_FALSE(std::isfinite(r.grad_norm));
    EXPECT_TRUE(t->last_step_skipped());
    EXPECT_EQ(t->skipped_steps(), 1);
    EXPECT_EQ(t->steps_done(), 2);
    EXPECT_EQ(t->optimizer().step_count(), opt_steps);
    EXPECT_TRUE(same_bits(params.data(), t->model().params(), n)) << "params (router bias too)";
    EXPECT_TRUE(same_bits(m.data(), moments_of(*t, true).data(), n));
    // The next good step updates again and resets the run of skips.
    t->step();
    EXPECT_FALSE(t->last_step_skipped());
    EXPECT_EQ(t->consecutive_skipped_steps(), 0);
    EXPECT_EQ(t->optimizer().step_count(), opt_steps + 1);
}

TEST(Checkpoint, TooManySkippedStepsStopNamingTheLastCheckpoint) {
    const ModelConfig model = tiny_config();
    const TrainConfig c = small_run();
    TempDir dir;
    auto t = make_trainer(model, c);
    t->step();
    const fs::path saved = save_checkpoint(*t, dir.path(), 0);
    t->set_max_skipped_steps(3);
    t->set_grad_hook(
        [](int64_t, float* grads) { grads[0] = std::numeric_limits<float>::infinity(); });
    t->step();
    t->step();
    const std::string err = error_of([&] { t->step(); });
    EXPECT_NE(err.find("3 steps in a row"), std::string::npos) << err;
    EXPECT_NE(err.find(saved.string()), std::string::npos) << err;
}

// ---- one format for every world size ----

nlohmann::json read_state(const fs::path& dir) {
    std::ifstream in(dir / kCheckpointStateFile);
    return nlohmann::json::parse(in);
}

// A single process is a world of one: it writes the shards every world size writes (one of
// them), and no single file. test_mpi_checkpoint.cpp checks that N ranks write the same format.
TEST(Checkpoint, OneProcessWritesOneShardOfTheShardedFormat) {
    TempDir dir;
    auto t = make_trainer(tiny_config(), small_run());
    t->step();
    const fs::path saved = save_checkpoint(*t, dir.path(), 0);
    const nlohmann::json state = read_state(saved);
    EXPECT_EQ(state.at("version"), kCheckpointVersion);
    EXPECT_EQ(state.at("world_size"), 1);
    // The layout as every command spells it (Layout::str), pp and vpp included.
    EXPECT_EQ(state.at("layout"), "tp1.pp1.vpp1.ep1.cp1.dp1");
    EXPECT_EQ(state.at("topology"), "tp1.pp1.vpp1.ep1.cp1.dp1 (world 1 in 1 domain of 1, edp1)");
    EXPECT_EQ(state.at("shard_files"), nlohmann::json::array({kOneShard}));
    EXPECT_FALSE(fs::exists(saved / kSingleFileCheckpointModelFile));
    const SafetensorsFile shard = SafetensorsFile::open((saved / kOneShard).string());
    EXPECT_TRUE(shard.metadata().contains(kShardSlicesKey));
}

// A checkpoint written before one process became a world of one (version 1: one
// model.safetensors, every tensor whole, moments under "optimizer.m." and "optimizer.v.") still
// resumes: this writes one as that version did and loads it.
TEST(Checkpoint, AVersionOneCheckpointStillResumes) {
    TempDir dir;
    auto t = make_trainer(tiny_config(), small_run());
    t->step();
    t->step();
    const fs::path saved = save_checkpoint(*t, dir.path(), 0);
    const fs::path old = dir.path() / "old";
    fs::create_directories(old);
    const std::vector<ParamEntry>& entries = t->model().param_entries();
    const std::vector<float> m = moments_of(*t, true), v = moments_of(*t, false);
    SafetensorsWriter writer;
    auto dims = [](const ParamEntry& e) {
        return std::vector<int64_t>(e.shape.dims.begin(), e.shape.dims.begin() + e.shape.ndim);
    };
    for (const ParamEntry& e : entries)
        writer.add(e.name, DType::f32, dims(e), t->model().params() + e.offset);
    for (const ParamEntry& e : entries)
        writer.add("optimizer.m." + e.name, DType::f32, dims(e), m.data() + e.offset);
    for (const ParamEntry& e : entries)
        writer.add("optimizer.v." + e.name, DType::f32, dims(e), v.data() + e.offset);
    writer.set_metadata("format", "moetron");
    CheckpointIndex index;
    index.add(kSingleFileCheckpointModelFile,
              writer.write((old / kSingleFileCheckpointModelFile).string()));
    nlohmann::json state = read_state(saved);
    for (const char* key : {"world_size", "topology", "shard_files"}) state.erase(key);
    state["version"] = kSingleFileCheckpointVersion;
    state["layout"] = "single";
    {
        std::ofstream out(old / kCheckpointStateFile);
        out << state.dump(2) << "\n";
    }
    index.add_file(old.string(), kCheckpointStateFile);
    index.write((old / kCheckpointIndexName).string());

    auto from_old = make_trainer(tiny_config(), small_run());
    load_checkpoint(*from_old, old);
    auto from_new = make_trainer(tiny_config(), small_run());
    load_checkpoint(*from_new, saved);
    EXPECT_EQ(from_old->steps_done(), 2);
    const int64_t n = t->model().num_params();
    EXPECT_TRUE(same_bits(from_old->model().params(), from_new->model().params(), n));
    EXPECT_TRUE(same_bits(moments_of(*from_old, true).data(), m.data(), n));
    EXPECT_TRUE(same_bits(moments_of(*from_old, false).data(), v.data(), n));
    EXPECT_EQ(from_old->optimizer().step_count(), from_new->optimizer().step_count());
    EXPECT_EQ(from_old->step().loss, from_new->step().loss);
}

// A checkpoint written before the layout had one spelling holds "dpD.tpT.epE" in state.json's
// "layout" (and the topology in other words): it still loads, to the same state.
TEST(Checkpoint, TheOldLayoutNameStillLoads) {
    TempDir dir;
    auto t = make_trainer(tiny_config(), small_run());
    t->step();
    const fs::path saved = save_checkpoint(*t, dir.path(), 0);
    const fs::path old = dir.path() / "old";
    fs::create_directories(old);
    fs::copy_file(saved / kOneShard, old / kOneShard);
    nlohmann::json state = read_state(saved);
    state["layout"] = "dp1.tp1.ep1";
    state["topology"] =
        "world 1 (1 domains of 1): attention pp1 x dp1 x cp1 x tp1, experts pp1 x "
        "edp1 x ep1";
    {
        std::ofstream out(old / kCheckpointStateFile);
        out << state.dump(2) << "\n";
    }
    CheckpointIndex index;
    index.add_file(old.string(), kOneShard);
    index.add_file(old.string(), kCheckpointStateFile);
    index.write((old / kCheckpointIndexName).string());

    auto from_old = make_trainer(tiny_config(), small_run());
    load_checkpoint(*from_old, old);
    auto from_new = make_trainer(tiny_config(), small_run());
    load_checkpoint(*from_new, saved);
    EXPECT_EQ(from_old->steps_done(), 1);
    EXPECT_TRUE(
        same_bits(from_old->model().params(), from_new->model().params(), t->model().num_params()));
    EXPECT_EQ(from_old->step().loss, from_new->step().loss);
}

// ---- bad input ----

class BadCheckpoint : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = std::make_unique<TempDir>();
        trainer_ = make_trainer(tiny_config(), small_run());
        trainer_->step();
        ckpt_ = save_checkpoint(*trainer_, dir_->path(), 0);
    }
    std::string load_error() {
        auto fresh = make_trainer(tiny_config(), small_run());
        return error_of([&] { load_checkpoint(*fresh, ckpt_); });
    }
    std::unique_ptr<TempDir> dir_;
    std::unique_ptr<Trainer> trainer_;
    fs::path ckpt_;
};

TEST_F(BadCheckpoint, TruncatedFileIsCaughtByTheIndex) {
    const fs::path file = ckpt_ / kOneShard;
    fs::resize_file(file, fs::file_size(file) - 100);
    const std::string err = load_error();
    EXPECT_NE(err.find(kOneShard), std::string::npos) << err;
}

TEST_F(BadCheckpoint, TruncatedFileWithRewrittenIndexIsCaughtByTheReader) {
    const fs::path file = ckpt_ / kOneShard;
    fs::resize_file(file, fs::file_size(file) - 100);
    CheckpointIndex index;
    index.add_file(ckpt_.string(), kOneShard);
    index.add_file(ckpt_.string(), kCheckpointStateFile);
    fs::remove(ckpt_ / kCheckpointIndexName);
    index.write((ckpt_ / kCheckpointIndexName).string());
    const std::string err = load_error();
    EXPECT_NE(err.find(kOneShard), std::string::npos) << err;
    EXPECT_NE(err.find("[safetensors]"), std::string::npos) << err;
}

TEST_F(BadCheckpoint, FlippedByteIsCaughtByTheChecksum) {
    const fs::path file = ckpt_ / kOneShard;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
    f.write(&byte, 1);
    f.close();
    const std::string err = load_error();
    EXPECT_NE(err.find(kOneShard), std::string::npos) << err;
    EXPECT_NE(err.find("checksum"), std::string::npos) << err;
}

TEST_F(BadCheckpoint, MissingFileIsNamed) {
    fs::remove(ckpt_ / kCheckpointStateFile);
    const std::string err = load_error();
    EXPECT_NE(err.find("state.json"), std::string::npos) << err;
}

TEST_F(BadCheckpoint, AnotherModelNamesTheDifferingKey) {
    ModelConfig other = tiny_config();
    other.n_routed_experts = 4;
    other.n_group = 2;
    other.topk_group = 1;
    auto t = make_trainer(other, small_run());
    const std::string err = error_of([&] { load_checkpoint(*t, ckpt_); });
    EXPECT_NE(err.find("another model"), std::string::npos) << err;
    EXPECT_NE(err.find("n_routed_experts"), std::string::npos) << err;
}

TEST_F(BadCheckpoint, WrongTensorShapeNamesFileAndTensor) {
    // Same config, but a tensor of another shape: write a state by hand with one entry changed.
    std::vector<ParamEntry> entries = trainer_->model().param_entries();
    const int64_t n = trainer_->model().num_params();
    std::vector<float> params(trainer_->model().params(), trainer_->model().params() + n);
    for (ParamEntry& e : entries) {
        if (e.name == "final_norm") e.shape = Shape{e.shape.dims[0] / 2, 2};
    }
    TrainingStateView st;
    st.model_config = &trainer_->model().config();
    st.train_config = &trainer_->config();
    st.entries = &entries;
    st.params = params.data();
    st.run_id = new_run_id();
    st.step = 42;
    const fs::path bad = save_training_state(dir_->path() / "bad", st, 0);
    auto fresh = make_trainer(tiny_config(), small_run());
    const std::string err = error_of([&] { load_checkpoint(*fresh, bad); });
    EXPECT_NE(err.find(kOneShard), std::string::npos) << err;
    EXPECT_NE(err.find("'final_norm'"), std::string::npos) << err;
}

TEST_F(BadCheckpoint, ExistingCheckpointIsNeverOverwritten) {
    const std::string err = error_of([&] { save_checkpoint(*trainer_, dir_->path(), 0); });
    EXPECT_NE(err.find("already exists"), std::string::npos) << err;
    EXPECT_NE(err.find(checkpoint_dir_name(1)), std::string::npos) << err;
}

TEST_F(BadCheckpoint, RootWithoutCheckpointIsAnError) {
    const fs::path empty = dir_->path() / "empty";
    fs::create_directories(empty);
    auto fresh = make_trainer(tiny_config(), small_run());
    const std::string err = error_of([&] { load_checkpoint(*fresh, empty); });
    EXPECT_NE(err.find("latest"), std::string::npos) << err;
}

}  // namespace
}  // namespace moetron
