// Model config parsing and validation: every preset loads, a Hugging Face config.json loads, and
// each kind of bad input (unknown key, wrong type, impossible value, missing or empty file,
// syntax error) is an error that names the key or the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/config.h"

namespace moetron {
namespace {

std::string preset_path(const std::string& name) {
    return std::string(MOETRON_SOURCE_DIR) + "/configs/models/" + name + ".toml";
}

std::string hf_fixture_dir() {
    return std::string(MOETRON_SOURCE_DIR) + "/tests/data/configs/deepseek-v3";
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A temporary file unique to this test, removed when it goes out of scope.
class TempFile {
  public:
    TempFile(const std::string& name, const std::string& text) {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = std::filesystem::path(::testing::TempDir()) /
               (std::string("moetron_config_") + info->test_suite_name() + "_" + info->name());
        std::filesystem::create_directories(dir_);
        path_ = (dir_ / name).string();
        std::ofstream(path_) << text;
    }
    ~TempFile() { std::filesystem::remove_all(dir_); }
    const std::string& path() const { return path_; }
    std::string dir() const { return dir_.string(); }

  private:
    std::filesystem::path dir_;
    std::string path_;
};

// The message of the moetron::Error that f throws; fails the test when it throws nothing.
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected a moetron::Error";
    return "";
}

void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
    for (const std::string& part : parts) {
        EXPECT_NE(message.find(part), std::string::npos)
            << "message lacks '" << part << "': " << message;
    }
}

TEST(ModelConfig, EveryPresetLoadsAndValidates) {
    for (const std::string name : {"tiny", "small", "dsv3-671b"}) {
        SCOPED_TRACE(name);
        const ModelConfig config = load_model_config(preset_path(name));
        EXPECT_EQ(config.name, name);
        EXPECT_NO_THROW(validate_model_config(config));
        EXPECT_GT(config.num_moe_layers(), 0);
        EXPECT_GT(config.num_dense_layers(), 0);
        EXPECT_EQ(config.num_nextn_predict_layers, 1);
        EXPECT_GT(config.q_lora_rank, 0);  // every preset exercises the low-rank q path
    }
}

TEST(ModelConfig, TinyHasEveryFeatureAtTestSize) {
    const ModelConfig c = load_model_config(preset_path("tiny"));
    EXPECT_EQ(c.vocab_size, 256);
    EXPECT_EQ(c.num_hidden_layers, 3);
    EXPECT_EQ(c.first_k_dense_replace, 1);
    EXPECT_EQ(c.num_dense_layers(), 1);
    EXPECT_EQ(c.num_moe_layers(), 2);
    EXPECT_EQ(c.n_routed_experts, 8);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_EQ(c.num_experts_per_tok, 2);
    EXPECT_EQ(c.n_group, 4);
    EXPECT_EQ(c.topk_group, 2);
    EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
    EXPECT_TRUE(c.mtp_layer_is_moe(0));
}

// DESIGN.md section 5, key by key.
TEST(ModelConfig, Dsv3PresetMatchesThePublishedShape) {
    const ModelConfig c = load_model_config(preset_path("dsv3-671b"));
    EXPECT_EQ(c.vocab_size, 129280);
    EXPECT_EQ(c.hidden_size, 7168);
    EXPECT_EQ(c.num_hidden_layers, 61);
    EXPECT_EQ(c.first_k_dense_replace, 3);
    EXPECT_EQ(c.intermediate_size, 18432);
    EXPECT_EQ(c.moe_intermediate_size, 2048);
    EXPECT_EQ(c.n_routed_experts, 256);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_EQ(c.num_experts_per_tok, 8);
    EXPECT_EQ(c.n_group, 8);
    EXPECT_EQ(c.topk_group, 4);
    EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
    EXPECT_EQ(c.scoring_func, "sigmoid");
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.num_attention_heads, 128);
    EXPECT_EQ(c.q_lora_rank, 1536);
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.qk_nope_head_dim, 128);
    EXPECT_EQ(c.qk_rope_head_dim, 64);
    EXPECT_EQ(c.v_head_dim, 128);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_EQ(c.num_nextn_predict_layers, 1);
    EXPECT_EQ(c.num_moe_layers(), 58);
}

TEST(ModelConfig, HuggingFaceConfigJsonLoadsAsTheDsv3Preset) {
    // A HF model directory: load_model_config finds config.json and names the model after it.
    const ModelConfig hf = load_model_config(hf_fixture_dir());
    const ModelConfig preset = load_model_config(preset_path("dsv3-671b"));
    EXPECT_EQ(hf.name, "deepseek-v3");
    EXPECT_EQ(hf.max_position_embeddings, 163840);  // the HF file has the extended context
    EXPECT_DOUBLE_EQ(hf.initializer_range, 0.02);
    EXPECT_EQ(hf.vocab_size, preset.vocab_size);
    EXPECT_EQ(hf.hidden_size, preset.hidden_size);
    EXPECT_EQ(hf.num_hidden_layers, preset.num_hidden_layers);
    EXPECT_EQ(hf.first_k_dense_replace, preset.first_k_dense_replace);
    EXPECT_EQ(hf.intermediate_size, preset.intermediate_size);
    EXPECT_EQ(hf.moe_intermediate_size, preset.moe_intermediate_size);
    EXPECT_EQ(hf.n_routed_experts, preset.n_routed_experts);
    EXPECT_EQ(hf.num_experts_per_tok, preset.num_experts_per_tok);
    EXPECT_EQ(hf.n_group, preset.n_group);
    EXPECT_EQ(hf.topk_group, preset.topk_group);
    EXPECT_EQ(hf.q_lora_rank, preset.q_lora_rank);
    EXPECT_EQ(hf.kv_lora_rank, preset.kv_lora_rank);
    EXPECT_EQ(hf.qk_rope_head_dim, preset.qk_rope_head_dim);
    EXPECT_DOUBLE_EQ(hf.rope_theta, 10000.0);  // an integer in JSON, a double field
    // The file itself by path: named after its directory as well.
    EXPECT_EQ(load_model_config(hf_fixture_dir() + "/config.json").name, "deepseek-v3");
}

TEST(ModelConfig, TomlTrainAndDataTablesAreLeftToTrain) {
    std::string text = read_text(preset_path("tiny"));
    text += "\n[data]\npath = \"x.bin\"\n";
    const ModelConfig c = parse_model_config_toml(text, "tiny+data.toml");
    EXPECT_EQ(c.hidden_size, 64);
}

TEST(ModelConfig, UnknownKeyNamesItAndTheClosestKnownKey) {
    const std::string tiny = read_text(preset_path("tiny"));
    std::string text = tiny;
    text.replace(text.find("hidden_size"), std::string("hidden_size").size(), "hiden_size");
    expect_mentions(error_of([&] { parse_model_config_toml(text, "typo.toml"); }),
                    {"[config]", "typo.toml", "'hiden_size'", "'hidden_size'"});

    const std::string json = R"({"vocab_size": 256, "num_expert_per_tok": 2})";
    expect_mentions(error_of([&] { parse_model_config_json(json, "typo.json"); }),
                    {"typo.json", "'num_expert_per_tok'", "'num_experts_per_tok'"});

    // HF keys that moetron ignores in config.json have no place in a TOML preset. (Prepended:
    // after tiny's [train] header the key would belong to train/'s table.)
    expect_mentions(
        error_of([&] { parse_model_config_toml("model_type = \"x\"\n" + tiny, "extra.toml"); }),
        {"'model_type'"});

    expect_mentions(error_of([&] { parse_model_config_toml(tiny + "\n[model]\n", "t.toml"); }),
                    {"[model]", "[train]"});
}

TEST(ModelConfig, WrongTypeNamesKeyAndExpectedType) {
    expect_mentions(error_of([] { parse_model_config_toml("hidden_size = \"64\"", "t.toml"); }),
                    {"t.toml:1", "'hidden_size'", "an integer", "\"64\""});
    expect_mentions(error_of([] { parse_model_config_toml("hidden_size = 64.5", "t.toml"); }),
                    {"'hidden_size'", "an integer"});
    expect_mentions(
        error_of([] { parse_model_config_json(R"({"routed_scaling_factor": true})", "t.json"); }),
        {"'routed_scaling_factor'", "a number"});
    expect_mentions(error_of([] { parse_model_config_json(R"({"norm_topk_prob": 1})", "t.json"); }),
                    {"'norm_topk_prob'", "true or false"});
    expect_mentions(error_of([] { parse_model_config_json(R"({"scoring_func": 3})", "t.json"); }),
                    {"'scoring_func'", "a string"});
    expect_mentions(error_of([] { parse_model_config_json(R"({"vocab_size": null})", "t.json"); }),
                    {"'vocab_size'", "null"});
}

TEST(ModelConfig, JsonNullQLoraRankMeansAPlainQProjection) {
    std::string json = read_text(hf_fixture_dir() + "/config.json");
    const std::string from = "\"q_lora_rank\": 1536";
    json.replace(json.find(from), from.size(), "\"q_lora_rank\": null");
    EXPECT_EQ(parse_model_config_json(json, "v2-lite-like.json").q_lora_rank, 0);
}

TEST(ModelConfig, CheckedHuggingFaceKeysMustMatchWhatIsImplemented) {
    const std::string json = read_text(hf_fixture_dir() + "/config.json");
    auto with = [&](const std::string& from, const std::string& to) {
        std::string text = json;
        text.replace(text.find(from), from.size(), to);
        return text;
    };
    expect_mentions(error_of([&] {
                        parse_model_config_json(
                            with("\"attention_bias\": false", "\"attention_bias\": true"), "x");
                    }),
                    {"attention_bias"});
    expect_mentions(error_of([&] {
                        parse_model_config_json(
                            with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), "x");
                    }),
                    {"hidden_act", "silu"});
    expect_mentions(error_of([&] {
                        parse_model_config_json(
                            with("\"num_key_value_heads\": 128", "\"num_key_value_heads\": 8"),
                            "x");
                    }),
                    {"num_key_value_heads", "num_attention_heads"});
}

struct ImpossibleCase {
    const char* what;
    std::function<void(ModelConfig&)> change;
    std::vector<std::string> keys;  // the message must name each
};

TEST(ModelConfig, EachImpossibleValueNamesItsKeys) {
    const ModelConfig tiny = load_model_config(preset_path("tiny"));
    const std::vector<ImpossibleCase> cases = {
        {"no vocab", [](ModelConfig& c) { c.vocab_size = 0; }, {"vocab_size"}},
        {"no width", [](ModelConfig& c) { c.hidden_size = -1; }, {"hidden_size"}},
        {"no layers", [](ModelConfig& c) { c.num_hidden_layers = 0; }, {"num_hidden_layers"}},
        {"no heads", [](ModelConfig& c) { c.num_attention_heads = 0; }, {"num_attention_heads"}},
        {"odd rope", [](ModelConfig& c) { c.qk_rope_head_dim = 7; }, {"qk_rope_head_dim", "even"}},
        {"no kv latent", [](ModelConfig& c) { c.kv_lora_rank = 0; }, {"kv_lora_rank"}},
        {"negative q rank", [](ModelConfig& c) { c.q_lora_rank = -1; }, {"q_lora_rank"}},
        {"no v", [](ModelConfig& c) { c.v_head_dim = 0; }, {"v_head_dim"}},
        {"too many dense",
         [](ModelConfig& c) { c.first_k_dense_replace = 4; },
         {"first_k_dense_replace", "num_hidden_layers"}},
        {"groups do not divide",
         [](ModelConfig& c) { c.n_group = 3; },
         {"n_routed_experts", "n_group"}},
        {"topk_group above groups",
         [](ModelConfig& c) { c.topk_group = 5; },
         {"topk_group", "n_group"}},
        {"K above E",
         [](ModelConfig& c) { c.num_experts_per_tok = 9; },
         {"num_experts_per_tok", "n_routed_experts"}},
        {"K above reachable experts",
         [](ModelConfig& c) { c.num_experts_per_tok = 5; },  // 2 groups x 2 experts = 4
         {"num_experts_per_tok", "topk_group"}},
        {"no K", [](ModelConfig& c) { c.num_experts_per_tok = 0; }, {"num_experts_per_tok"}},
        {"softmax scores",
         [](ModelConfig& c) { c.scoring_func = "softmax"; },
         {"scoring_func", "sigmoid"}},
        {"V2 top-k", [](ModelConfig& c) { c.topk_method = "greedy"; }, {"topk_method"}},
        {"no expert width",
         [](ModelConfig& c) { c.moe_intermediate_size = 0; },
         {"moe_intermediate_size"}},
        {"no dense width", [](ModelConfig& c) { c.intermediate_size = 0; }, {"intermediate_size"}},
        {"zero moe frequency", [](ModelConfig& c) { c.moe_layer_freq = 0; }, {"moe_layer_freq"}},
        {"negative MTP",
         [](ModelConfig& c) { c.num_nextn_predict_layers = -1; },
         {"num_nextn_predict_layers"}},
        {"zero eps", [](ModelConfig& c) { c.rms_norm_eps = 0; }, {"rms_norm_eps"}},
        {"zero scale",
         [](ModelConfig& c) { c.routed_scaling_factor = 0; },
         {"routed_scaling_factor"}},
        {"shared without routed",
         [](ModelConfig& c) { c.n_routed_experts = 0; },
         {"n_shared_experts", "n_routed_experts"}},
    };
    for (const ImpossibleCase& test_case : cases) {
        SCOPED_TRACE(test_case.what);
        ModelConfig c = tiny;
        test_case.change(c);
        std::vector<std::string> parts = test_case.keys;
        parts.push_back("[config]");
        parts.push_back("'tiny'");
        expect_mentions(error_of([&] { validate_model_config(c); }), parts);
    }
}

TEST(ModelConfig, ParsersValidateAndNameTheSource) {
    std::string text = read_text(preset_path("tiny"));
    text.replace(text.find("n_group = 4"), std::string("n_group = 4").size(), "n_group = 3");
    expect_mentions(error_of([&] { parse_model_config_toml(text, "bad-groups.toml"); }),
                    {"bad-groups.toml", "n_group = 3"});
}

TEST(ModelConfig, DenseOnlyModelIsValid) {
    ModelConfig c = load_model_config(preset_path("tiny"));
    c.n_routed_experts = 0;
    c.n_shared_experts = 0;
    EXPECT_NO_THROW(validate_model_config(c));
    EXPECT_EQ(c.num_moe_layers(), 0);
    EXPECT_EQ(c.num_dense_layers(), 3);
    EXPECT_FALSE(c.mtp_layer_is_moe(0));
}

TEST(ModelConfig, MoeLayerFrequencyFollowsHuggingFace) {
    ModelConfig c = load_model_config(preset_path("tiny"));
    c.num_hidden_layers = 8;
    c.first_k_dense_replace = 1;
    c.moe_layer_freq = 2;
    // HF modeling_deepseek: MoE where layer >= first_k_dense_replace and layer % freq == 0.
    std::vector<bool> moe;
    for (int64_t layer = 0; layer < 8; ++layer) moe.push_back(c.is_moe_layer(layer));
    EXPECT_EQ(moe, (std::vector<bool>{false, false, true, false, true, false, true, false}));
    EXPECT_EQ(c.num_moe_layers(), 3);
    EXPECT_TRUE(c.mtp_layer_is_moe(0));  // layer index 8
}

TEST(ModelConfig, ClosedFormMoeLayerCountMatchesEnumeration) {
    ModelConfig c = load_model_config(preset_path("tiny"));
    for (int64_t freq = 1; freq <= 4; ++freq) {
        for (int64_t first_k = 0; first_k <= 6; ++first_k) {
            c.moe_layer_freq = freq;
            c.first_k_dense_replace = first_k;
            for (int64_t begin = 0; begin <= 9; ++begin) {
                for (int64_t end = begin; end <= 9; ++end) {
                    int64_t expected = 0;
                    for (int64_t layer = begin; layer < end; ++layer)
                        expected += c.is_moe_layer(layer);
                    EXPECT_EQ(c.num_moe_layers_in(begin, end), expected)
                        << "freq " << freq << " first_k " << first_k << " [" << begin << ", " << end
                        << ")";
                }
            }
        }
    }
}

TEST(ModelConfig, MissingAndEmptyFilesNameThePath) {
    const std::string missing = "/nonexistent/moetron/model.toml";
    expect_mentions(error_of([&] { load_model_config(missing); }), {missing, "no such file"});

    const TempFile empty("empty.toml", "  \n\t\n");
    expect_mentions(error_of([&] { load_model_config(empty.path()); }), {empty.path(), "empty"});
}

TEST(ModelConfig, SyntaxErrorsNameFileAndLine) {
    const TempFile bad_toml("bad.toml", "vocab_size = 256\nhidden_size = = 64\n");
    expect_mentions(error_of([&] { load_model_config(bad_toml.path()); }),
                    {bad_toml.path() + ":2", "TOML syntax error"});

    const TempFile bad_json("bad.json", "{\"vocab_size\": 256,, }");
    expect_mentions(error_of([&] { load_model_config(bad_json.path()); }),
                    {bad_json.path(), "JSON syntax error"});

    expect_mentions(error_of([] { parse_model_config_json("[1, 2]", "array.json"); }),
                    {"array.json", "JSON object"});
}

TEST(ModelConfig, DetectsFormatByContentAndNamesUnnamedConfigsAfterTheFile) {
    // A JSON file with a .toml name is still JSON; its name comes from the file stem.
    std::string json = read_text(hf_fixture_dir() + "/config.json");
    const TempFile file("my-model.toml", "\xEF\xBB\xBF\n  " + json);
    const ModelConfig c = load_model_config(file.path());
    EXPECT_EQ(c.name, "my-model");
    EXPECT_EQ(c.hidden_size, 7168);
}

// Every truncation of a valid preset either parses or throws moetron::Error: never a crash, never
// another exception type.
TEST(ModelConfig, TruncatedFilesFailCleanly) {
    for (const std::string& text :
         {read_text(preset_path("tiny")), read_text(hf_fixture_dir() + "/config.json")}) {
        const bool is_json = text.front() == '{';
        for (size_t length = 0; length < text.size(); length += 7) {
            const std::string_view prefix = std::string_view(text).substr(0, length);
            try {
                if (is_json) {
                    parse_model_config_json(prefix, "prefix.json");
                } else {
                    parse_model_config_toml(prefix, "prefix.toml");
                }
            } catch (const Error&) {
                // expected for most prefixes
            }
        }
    }
}

TEST(ModelConfig, DescriptionNamesTheShape) {
    const std::string text = describe_model_config(load_model_config(preset_path("dsv3-671b")));
    expect_mentions(text, {"dsv3-671b", "7168", "256 routed", "top-8", "MTP 1"});
}

}  // namespace
}  // namespace moetron
