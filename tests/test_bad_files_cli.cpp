// Bad files through the moetron binary: a binary config.json, a Hugging Face config that asks for
// far more parameters than its weights hold, and tensor names carrying terminal escape sequences
// each end with exit code 1 and a message that says what is wrong, prints no raw control bytes,
// and allocates nothing for the model first.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "moetron/checkpoint/hf_export.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/model/config.h"
#include "moetron/model/params.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::TempDir;

using Output = moetron::testing::CliOutput;
using moetron::testing::run_cli;

ModelConfig tiny() {
    return load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
}

// A Hugging Face directory: config.json of `config`, and model.safetensors with one F32 tensor
// named `tensor_name` of `numel` elements.
void write_hf_dir(const TempDir& dir, const ModelConfig& config, const std::string& tensor_name,
                  int64_t numel) {
    std::ofstream(dir.file("config.json")) << hf_config_json(config, DType::f32).dump(2);
    const std::vector<float> zeros(static_cast<size_t>(numel), 0.0f);
    SafetensorsWriter writer;
    writer.add(tensor_name, DType::f32, {numel}, zeros.data());
    writer.write(dir.file("model.safetensors"));
}

TEST(BadFilesCli, ABinaryConfigJsonIsNotCalledATomlSyntaxError) {
    TempDir dir;
    const char bytes[] = {'P', 'K', 3, 4, 0, 0, 0, 0, 1, 2, 3};
    std::ofstream(dir.file("config.json"), std::ios::binary).write(bytes, sizeof bytes);
    const Output out = run_cli("info --config " + dir.path().string());
    EXPECT_EQ(out.exit_code, 1) << out.text;
    EXPECT_CONTAINS(out.text, "is not a text file (byte 4 is \\x00)");
    EXPECT_EQ(out.text.find("TOML syntax error"), std::string::npos) << out.text;
    // Text, but not JSON, under a .json name.
    std::ofstream(dir.file("config.json")) << "hidden_size = 64\n";
    const Output toml = run_cli("info --config " + dir.file("config.json"));
    EXPECT_EQ(toml.exit_code, 1) << toml.text;
    EXPECT_CONTAINS(toml.text, "is not JSON");
}

TEST(BadFilesCli, AHugeHuggingFaceConfigIsRefusedBeforeAllocating) {
    TempDir dir;
    ModelConfig huge = tiny();
    huge.vocab_size = int64_t{1} << 24;
    huge.hidden_size = int64_t{1} << 20;  // 2^44 embedding parameters: 64 TiB of floats
    write_hf_dir(dir, huge, "model.embed_tokens.weight", 16);
    // Once std::bad_alloc (or, for a model that fits, gigabytes zeroed before the first tensor).
    const Output out = run_cli("import --hf " + dir.path().string() + " --out " + dir.file("ck"));
    EXPECT_EQ(out.exit_code, 1) << out.text;
    EXPECT_CONTAINS(out.text, "but its safetensors files hold only 16 elements");
}

TEST(BadFilesCli, TensorNamesWithTerminalEscapesArePrintedEscaped) {
    TempDir dir;
    const ModelConfig config = tiny();
    const int64_t numel = ParamTable(model_param_specs(config)).total_numel();
    write_hf_dir(dir, config, "\x1b[2J\x1b[31mred", numel);
    const Output out = run_cli("import --hf " + dir.path().string() + " --out " + dir.file("ck"));
    EXPECT_EQ(out.exit_code, 1) << out.text;
    EXPECT_CONTAINS(out.text, "tensor '\\x1b[2J\\x1b[31mred' is not a DeepSeek-V3 tensor");
    EXPECT_EQ(out.text.find('\x1b'), std::string::npos) << "a raw escape byte was printed";
}

}  // namespace
}  // namespace moetron
