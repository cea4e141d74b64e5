// Checkpoints through the binary and through Hugging Face directories: SIGTERM makes
// `moetron train --save` save and exit 0; export to HF and import back gives the same parameters
// (bit for bit in fp32, bf16 rounding in bf16); fused expert names import too; bad HF input is an
// error naming file and tensor. The comparison with transformers is in
// test_checkpoint_transformers.cpp.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "moetron/checkpoint/hf_export.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/model/hf_names.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::read_file;
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
    c.warmup_steps = 2;
    c.seed = 5;
    c.eval_batches = 1;
    return c;
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& c) {
    const ModelConfig model = tiny_config();
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/3, /*num_bytes=*/8000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    return std::make_unique<Trainer>(model, c, std::move(loader));
}

TEST(CheckpointCli, SigtermSavesAndExitsZero) {
    TempDir dir;
    const fs::path root = dir.path() / "ckpt";
    const fs::path log = dir.path() / "out.txt";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        const int fd = ::creat(log.c_str(), 0644);
        if (fd < 0) ::_exit(126);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::execl(MOETRON_BINARY, MOETRON_BINARY, "train", "--steps", "1000000", "--batch-size", "2",
                "--seq-len", "16", "--eval-every", "0", "--threads", "1", "--save", root.c_str(),
                "--save-every", "3", "--keep", "2", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    // Stepping has started once the first periodic checkpoint exists.
    bool started = false;
    for (int i = 0; i < 1200 && !started; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        started = fs::exists(root / "latest");
    }
    if (!started) ::kill(child, SIGKILL);
    ASSERT_TRUE(started) << read_file(log);
    ASSERT_EQ(::kill(child, SIGTERM), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    const std::string out = read_file(log);
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 0) << out;
    EXPECT_NE(out.find("stopped by signal"), std::string::npos) << out;

    auto t = make_trainer(small_run());
    const fs::path loaded = load_checkpoint(*t, root);
    EXPECT_GE(t->steps_done(), 3);
    EXPECT_LE(list_checkpoint_dirs(root).size(), 2u);
    // The checkpoint of the stop is the latest, and its step is the last one run.
    std::string saved_line = "saved   checkpoint ";
    saved_line.append(loaded.string());
    EXPECT_NE(out.find(saved_line), std::string::npos) << out;
    std::printf("stopped at step %lld\n", static_cast<long long>(t->steps_done()));
}

// Runs the binary with args (stdout and stderr to log); returns the exit status.
int run_moetron(const std::vector<std::string>& args, const fs::path& log) {
    std::string cmd = MOETRON_BINARY;
    for (const std::string& a : args) {
        cmd.push_back(' ');
        cmd.append(a);
    }
    cmd.append(" > ");
    cmd.append(log.string());
    cmd.append(" 2>&1");
    return std::system(cmd.c_str());
}

TEST(CheckpointCli, ResumedRunEndsInTheSameCheckpointFile) {
    TempDir dir;
    const std::vector<std::string> run = {"train", "--steps",   "10", "--batch-size",
                                          "2",     "--seq-len", "16", "--eval-every",
                                          "4",     "--threads", "1"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = run;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    };
    const fs::path a = dir.path() / "a", b = dir.path() / "b", c = dir.path() / "c";
    ASSERT_EQ(run_moetron(with({"--save", a.string()}), dir.path() / "a.txt"), 0)
        << read_file(dir.path() / "a.txt");
    ASSERT_EQ(run_moetron(with({"--save", b.string(), "--save-every", "5"}), dir.path() / "b.txt"),
              0);
    // Resume the second run from its step-5 checkpoint into a third root.
    ASSERT_EQ(
        run_moetron(with({"--save", c.string(), "--resume", (b / checkpoint_dir_name(5)).string()}),
                    dir.path() / "c.txt"),
        0)
        << read_file(dir.path() / "c.txt");
    EXPECT_NE(read_file(dir.path() / "c.txt").find("resumed from"), std::string::npos);
    // A fresh run into a root that holds another run's checkpoints stops before training.
    EXPECT_NE(run_moetron(with({"--save", a.string()}), dir.path() / "d.txt"), 0);
    EXPECT_NE(read_file(dir.path() / "d.txt").find("belongs to another run"), std::string::npos)
        << read_file(dir.path() / "d.txt");
    // Parameters and both moments, byte for byte.
    const std::string name = checkpoint_dir_name(10) + "/" + checkpoint_shard_file_name(0, 1);
    const std::string straight = read_file(a / name), resumed = read_file(c / name);
    ASSERT_FALSE(straight.empty());
    EXPECT_TRUE(straight == resumed) << "the shards of the straight and resumed runs differ";
}

// A trained checkpoint (router biases moved, so they are checked too) and its parameters.
struct Trained {
    fs::path checkpoint;
    std::vector<float> params;
};

Trained train_and_save(const fs::path& root) {
    auto t = make_trainer(small_run());
    for (int i = 0; i < 3; ++i) t->step();
    Trained r;
    r.checkpoint = save_checkpoint(*t, root, 0);
    r.params.assign(t->model().params(), t->model().params() + t->model().num_params());
    return r;
}

std::vector<float> checkpoint_params(const fs::path& dir, std::vector<float>* m = nullptr) {
    const ParamTable table(model_param_specs(tiny_config()));
    std::vector<float> p(static_cast<size_t>(table.total_numel()));
    std::vector<float> mm(p.size()), vv(p.size());
    read_verified_checkpoint_state(dir);
    read_checkpoint_tensors(dir, table.entries(), p.data(), mm.data(), vv.data());
    if (m != nullptr) *m = mm;
    return p;
}

TEST(CheckpointHf, Fp32RoundTripIsExact) {
    TempDir dir;
    const Trained t = train_and_save(dir.path() / "ckpt");
    export_hf(dir.path() / "ckpt", dir.path() / "hf", DType::f32);
    const nlohmann::json config = nlohmann::json::parse(read_file(dir.path() / "hf/config.json"));
    EXPECT_EQ(config["model_type"], "deepseek_v3");
    EXPECT_EQ(config["architectures"][0], "DeepseekV3ForCausalLM");
    const nlohmann::json index =
        nlohmann::json::parse(read_file(dir.path() / "hf/model.safetensors.index.json"));
    EXPECT_EQ(index["weight_map"]["model.layers.1.mlp.experts.7.down_proj.weight"],
              "model.safetensors");
    EXPECT_TRUE(index["weight_map"].contains("model.layers.3.eh_proj.weight"));  // MTP

    const fs::path imported = import_hf(dir.path() / "hf", dir.path() / "imported");
    EXPECT_EQ(imported.filename().string(), checkpoint_dir_name(0));
    std::vector<float> m;
    const std::vector<float> p = checkpoint_params(imported, &m);
    ASSERT_EQ(p.size(), t.params.size());
    EXPECT_EQ(std::memcmp(p.data(), t.params.data(), p.size() * sizeof(float)), 0);
    for (float x : m) ASSERT_EQ(x, 0.0f);  // a fresh optimizer
    // The imported checkpoint resumes into a trainer.
    auto fresh = make_trainer(small_run());
    load_checkpoint(*fresh, dir.path() / "imported");
    EXPECT_EQ(fresh->steps_done(), 0);
    EXPECT_EQ(fresh->optimizer().step_count(), 0);
}

TEST(CheckpointHf, ExportAndImportCommands) {
    TempDir dir;
    const Trained t = train_and_save(dir.path() / "ckpt");
    const fs::path hf = dir.path() / "hf", imported = dir.path() / "imported";
    ASSERT_EQ(run_moetron({"export", "--weights", (dir.path() / "ckpt").string(), "--format", "hf",
                           "--out", hf.string(), "--dtype", "fp32"},
                          dir.path() / "export.txt"),
              0)
        << read_file(dir.path() / "export.txt");
    ASSERT_EQ(run_moetron({"import", "--hf", hf.string(), "--out", imported.string()},
                          dir.path() / "import.txt"),
              0)
        << read_file(dir.path() / "import.txt");
    const std::vector<float> p = checkpoint_params(resolve_checkpoint_dir(imported));
    EXPECT_EQ(std::memcmp(p.data(), t.params.data(), p.size() * sizeof(float)), 0);
    EXPECT_NE(run_moetron({"export", "--weights", (dir.path() / "ckpt").string(), "--format",
                           "onnx", "--out", hf.string()},
                          dir.path() / "bad.txt"),
              0);
    EXPECT_NE(read_file(dir.path() / "bad.txt").find("--format 'onnx'"), std::string::npos)
        << read_file(dir.path() / "bad.txt");
}

TEST(CheckpointHf, Bf16ExportIsTheRoundedParameters) {
    TempDir dir;
    const Trained t = train_and_save(dir.path() / "ckpt");
    export_hf(t.checkpoint, dir.path() / "hf", DType::bf16);
    const SafetensorsFile f = SafetensorsFile::open((dir.path() / "hf/model.safetensors").string());
    EXPECT_EQ(f.metadata().at("format"), "pt");
    for (const SafetensorsEntry& e : f.tensors()) ASSERT_EQ(e.dtype, DType::bf16) << e.name;
    const std::vector<float> p =
        checkpoint_params(import_hf(dir.path() / "hf", dir.path() / "imp"));
    double max_rel = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        ASSERT_EQ(p[i], bf16::to_float(bf16::from_float(t.params[i]))) << "element " << i;
        if (t.params[i] != 0.0f)
            max_rel = std::max(max_rel, std::fabs(static_cast<double>(p[i] - t.params[i]) /
                                                  static_cast<double>(t.params[i])));
    }
    std::printf("[maxerr] hf_export bf16 rel=%.3e (bf16 half-ulp 3.9e-03)\n", max_rel);
    EXPECT_LE(max_rel, 1.0 / 256.0);
}

// Writes an HF directory for the tiny config with the given name layout from params.
void write_hf_dir(const fs::path& out, const std::vector<float>& params, HfExpertLayout layout,
                  const std::function<bool(const HfTensor&)>& keep = nullptr,
                  const char* extra_tensor = nullptr) {
    const ModelConfig config = tiny_config();
    const ParamTable table(model_param_specs(config));
    const HfNameMap names(config, layout);
    SafetensorsWriter w;
    for (const HfTensor& t : names.tensors()) {
        if (keep && !keep(t)) continue;
        w.add(t.hf_name, DType::f32,
              {t.hf_shape.dims.begin(), t.hf_shape.dims.begin() + t.hf_shape.ndim},
              params.data() + table.entry(t.param_name).offset + t.param_offset);
    }
    if (extra_tensor != nullptr) w.add(extra_tensor, DType::f32, {1}, params.data());
    fs::create_directories(out);
    w.write((out / "model.safetensors").string());
    std::ofstream(out / "config.json") << hf_config_json(config, DType::f32).dump(2);
}

TEST(CheckpointHf, FusedExpertNamesImport) {
    TempDir dir;
    const Trained t = train_and_save(dir.path() / "ckpt");
    write_hf_dir(dir.path() / "hf", t.params, HfExpertLayout::fused);
    const std::vector<float> p =
        checkpoint_params(import_hf(dir.path() / "hf", dir.path() / "imp"));
    EXPECT_EQ(std::memcmp(p.data(), t.params.data(), p.size() * sizeof(float)), 0);
}

TEST(CheckpointHf, MissingTensorIsNamed) {
    TempDir dir;
    const Trained t = train_and_save(dir.path() / "ckpt");
    write_hf_dir(dir.path() / "hf", t.params, HfExpertLayout::per_expert, [](const HfTensor& x) {
        return x.hf_name != "model.layers.2.mlp.experts.3.up_proj.weight";
    });
    const std::string err = error_of([&] { import_hf(dir.path() / "hf", dir.path() / "imp"); });
    EXPECT_NE(err.find("model.layers.2.mlp.experts.3.up_proj.weight"), std::string::npos) << err;
    EXPECT_NE(err.find("layers.2.mlp.experts.gate_up"), std::string::npos) << err;
}

TEST(CheckpointHf, UnknownTensorIsNamed) {
    TempDir dir;
    const Trained t = train_and_save(dir.path() / "ckpt");
    write_hf_dir(dir.path() / "hf", t.params, HfExpertLayout::per_expert, nullptr,
                 "model.layers.9.mlp.gate.weight");
    const std::string err = error_of([&] { import_hf(dir.path() / "hf", dir.path() / "imp"); });
    EXPECT_NE(err.find("model.layers.9.mlp.gate.weight"), std::string::npos) << err;
    EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

}  // namespace
}  // namespace moetron
