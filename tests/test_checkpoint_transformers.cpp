// moetron export --format hf against transformers: the logits of DeepseekV3ForCausalLM loaded
// from an exported fp32 directory equal moetron's own (skipped when python3 with torch and
// transformers is not importable; about 10 s, most of it importing torch), and the exported
// byte-level tokenizer loads in AutoTokenizer (skipped without transformers).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "moetron/checkpoint/hf_export.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"
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
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/3, /*num_bytes=*/8000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    return std::make_unique<Trainer>(model, c, std::move(loader));
}

TEST(CheckpointHf, MatchesTransformersLogits) {
    if (std::system("python3 -c 'import torch, transformers' > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "python3 with torch and transformers is not importable";
    TempDir dir;
    // A few trained steps, so the router biases and every weight moved from their init.
    auto trainer = make_trainer(small_run());
    for (int i = 0; i < 3; ++i) trainer->step();
    const fs::path checkpoint = save_checkpoint(*trainer, dir.path() / "ckpt", 0);
    export_hf(checkpoint, dir.path() / "hf", DType::f32);
    // Logits of the same tokens from moetron and from transformers' DeepseekV3ForCausalLM.
    const int64_t S = 16;
    std::vector<int32_t> tokens(S), targets(S, -1);
    for (int64_t i = 0; i < S; ++i)
        tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % 256);
    trainer->model().forward(tokens.data(), targets.data(), 1, S);
    const float* ours = trainer->model().logits();
    std::string ids;
    for (int32_t x : tokens) {
        if (!ids.empty()) ids.push_back(',');
        ids.append(std::to_string(x));
    }
    const fs::path script = dir.path() / "logits.py";
    const fs::path out = dir.path() / "logits.bin";
    std::ofstream(script) << "import sys, torch, transformers\n"
                             "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], "
                             "torch_dtype=torch.float32)\n"
                             "m.eval()\n"
                             "ids = torch.tensor([["
                          << ids
                          << "]])\n"
                             "with torch.no_grad():\n"
                             "    logits = m(ids).logits[0].float().numpy()\n"
                             "logits.tofile(sys.argv[2])\n";
    const std::string cmd =
        fmt::format("python3 {} {} {} > {} 2>&1", script.string(), (dir.path() / "hf").string(),
                    out.string(), (dir.path() / "py.txt").string());
    if (std::system(cmd.c_str()) != 0) {
        GTEST_SKIP() << "transformers could not run the exported model: "
                     << read_file(dir.path() / "py.txt");
    }
    std::vector<float> theirs(static_cast<size_t>(S * 256));
    std::ifstream(out, std::ios::binary)
        .read(reinterpret_cast<char*>(theirs.data()),
              static_cast<std::streamsize>(theirs.size() * sizeof(float)));
    double max_abs = 0;
    for (size_t i = 0; i < theirs.size(); ++i)
        max_abs = std::max(max_abs, std::fabs(static_cast<double>(ours[i] - theirs[i])));
    std::printf("[maxerr] hf_export transformers logits abs=%.3e\n", max_abs);
    EXPECT_LE(max_abs, 1e-3);
}

// The exported byte-level tokenizer through transformers' AutoTokenizer: text encodes to its raw
// UTF-8 bytes as token ids and decodes back. Needs transformers (not torch).
TEST(CheckpointHf, ByteTokenizerLoadsInTransformers) {
    if (std::system("python3 -c 'import transformers' > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "python3 with transformers is not importable";
    TempDir dir;
    HfExportOptions options;
    options.byte_tokenizer = true;
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    std::vector<float> params(
        static_cast<size_t>(ParamTable(model_param_specs(model)).total_numel()));
    export_hf_params(model, params.data(), dir.path() / "hf", options);
    const fs::path script =
        dir.path() / "check_tokenizer.py";  // not tokenize.py: that shadows a stdlib module
    std::ofstream(script) << "import sys, transformers\n"
                             "t = transformers.AutoTokenizer.from_pretrained(sys.argv[1])\n"
                             "text = 'ROMEO: caf\\u00e9\\n\\tend \\x00'\n"
                             "ids = t(text)['input_ids']\n"
                             "assert ids == list(text.encode('utf-8')), ids\n"
                             "assert t.decode(ids) == text, t.decode(ids)\n"
                             "print('tokenizer OK')\n";
    const std::string cmd =
        fmt::format("python3 {} {} > {} 2>&1", script.string(), (dir.path() / "hf").string(),
                    (dir.path() / "py.txt").string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(dir.path() / "py.txt");
}

}  // namespace
}  // namespace moetron
