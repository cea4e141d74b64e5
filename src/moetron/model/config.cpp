// Model config parsing (TOML presets and Hugging Face config.json) and validation.
//
// Every ModelConfig field is read under its Hugging Face key (DeepSeek-V3's config.json), so the
// two formats share one key table. TOML presets may hold only those keys (plus [train] / [data]
// tables, which belong to train/); a config.json may also hold the HF keys listed in
// kIgnoredHfKeys, which describe things moetron does not model (tokenizer ids, dtype, inference
// settings) and are skipped.
#include "moetron/model/config.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/strings.h"
#include "moetron/core/user_error.h"

namespace moetron {

int64_t ModelConfig::num_moe_layers_in(int64_t begin, int64_t end) const {
    if (n_routed_experts <= 0 || moe_layer_freq <= 0) return 0;
    // Multiples of moe_layer_freq in [max(begin, first_k_dense_replace), end), as is_moe_layer.
    const int64_t first = std::max({begin, first_k_dense_replace, int64_t{0}});
    if (first >= end) return 0;
    auto ceil_div = [this](int64_t x) { return (x + moe_layer_freq - 1) / moe_layer_freq; };
    return ceil_div(end) - ceil_div(first);
}

namespace {

using FieldMember = std::variant<int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
                                 std::string ModelConfig::*>;

struct Field {
    std::string_view key;
    FieldMember member;
};

// The one key table: the Hugging Face name of each ModelConfig field ("name" is moetron's own).
const Field kFields[] = {
    {"name", &ModelConfig::name},
    {"vocab_size", &ModelConfig::vocab_size},
    {"hidden_size", &ModelConfig::hidden_size},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers},
    {"first_k_dense_replace", &ModelConfig::first_k_dense_replace},
    {"moe_layer_freq", &ModelConfig::moe_layer_freq},
    {"intermediate_size", &ModelConfig::intermediate_size},
    {"moe_intermediate_size", &ModelConfig::moe_intermediate_size},
    {"n_routed_experts", &ModelConfig::n_routed_experts},
    {"n_shared_experts", &ModelConfig::n_shared_experts},
    {"num_experts_per_tok", &ModelConfig::num_experts_per_tok},
    {"n_group", &ModelConfig::n_group},
    {"topk_group", &ModelConfig::topk_group},
    {"routed_scaling_factor", &ModelConfig::routed_scaling_factor},
    {"scoring_func", &ModelConfig::scoring_func},
    {"topk_method", &ModelConfig::topk_method},
    {"norm_topk_prob", &ModelConfig::norm_topk_prob},
    {"num_attention_heads", &ModelConfig::num_attention_heads},
    {"q_lora_rank", &ModelConfig::q_lora_rank},
    {"kv_lora_rank", &ModelConfig::kv_lora_rank},
    {"qk_nope_head_dim", &ModelConfig::qk_nope_head_dim},
    {"qk_rope_head_dim", &ModelConfig::qk_rope_head_dim},
    {"v_head_dim", &ModelConfig::v_head_dim},
    {"rope_theta", &ModelConfig::rope_theta},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings},
    {"rms_norm_eps", &ModelConfig::rms_norm_eps},
    {"num_nextn_predict_layers", &ModelConfig::num_nextn_predict_layers},
    {"tie_word_embeddings", &ModelConfig::tie_word_embeddings},
    {"initializer_range", &ModelConfig::initializer_range},
};

// Hugging Face config.json keys that moetron accepts and ignores, each for a stated reason.
const std::string_view kIgnoredHfKeys[] = {
    // Loader and tooling metadata.
    "architectures",
    "auto_map",
    "model_type",
    "transformers_version",
    "_name_or_path",
    // Storage and inference settings: moetron keeps fp32 masters and has no KV cache.
    "torch_dtype",
    "dtype",
    "quantization_config",
    "use_cache",
    "pretraining_tp",
    // Token ids belong to the tokenizer, not the model shape.
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    // Expert parallelism is a layout (parallel/), not a model property.
    "ep_size",
    // YaRN context extension is applied after pre-training (DeepSeek-V3 report sec. 4.3).
    "rope_scaling",
    // Dropout is off in DeepSeek-V3 pre-training; the balance loss weights live in [train].
    "attention_dropout",
    "aux_loss_alpha",
    "seq_aux",
};

// HF keys whose value moetron does not read but must agree with what it implements.
constexpr std::string_view kCheckedHfKeys[] = {"attention_bias", "hidden_act",
                                               "num_key_value_heads"};

// Tables of a TOML preset that belong to train/.
constexpr std::string_view kForeignTomlTables[] = {"train", "data"};

// A parsed value, independent of the file format.
struct OtherType {
    std::string type_name;
};
struct Null {};
using Scalar = std::variant<Null, int64_t, double, bool, std::string, OtherType>;

std::string describe_scalar(const Scalar& value) {
    struct Visitor {
        std::string operator()(const Null&) const { return "null"; }
        std::string operator()(int64_t v) const { return fmt::format("the integer {}", v); }
        std::string operator()(double v) const { return fmt::format("the number {}", v); }
        std::string operator()(bool v) const { return v ? "true" : "false"; }
        std::string operator()(const std::string& v) const {
            return fmt::format("the string \"{}\"", v);
        }
        std::string operator()(const OtherType& v) const { return v.type_name; }
    };
    return std::visit(Visitor{}, value);
}

std::string_view closest_key(std::string_view key) {
    std::vector<std::string_view> known;
    for (const Field& field : kFields) known.push_back(field.key);
    return closest_match(key, known);
}

const Field* find_field(std::string_view key) {
    for (const Field& field : kFields)
        if (field.key == key) return &field;
    return nullptr;
}

template <class Range>
bool contains(const Range& range, std::string_view key) {
    return std::find(std::begin(range), std::end(range), key) != std::end(range);
}

[[noreturn]] void throw_unknown_key(std::string_view where, std::string_view key) {
    MT_USER_THROW("[config] {}: unknown key {} (did you mean '{}'?)", where, printable(key),
                  closest_key(key));
}

// Stores value into the field, or throws naming the key and the type it needs.
void assign(ModelConfig& config, const Field& field, const Scalar& value, std::string_view where) {
    struct Visitor {
        ModelConfig& config;
        const Field& field;
        const Scalar& value;
        std::string_view where;

        [[noreturn]] void wrong_type(std::string_view expected) const {
            MT_USER_THROW("[config] {}: key '{}' must be {}, got {}", where, field.key, expected,
                          describe_scalar(value));
        }
        void operator()(int64_t ModelConfig::*member) const {
            if (const auto* v = std::get_if<int64_t>(&value)) {
                config.*member = *v;
            } else if (std::holds_alternative<Null>(value) && field.key == "q_lora_rank") {
                config.*member = 0;  // HF writes null for "no low-rank q" (DeepSeek-V2-Lite)
            } else {
                wrong_type("an integer");
            }
        }
        void operator()(double ModelConfig::*member) const {
            if (const auto* v = std::get_if<double>(&value)) {
                config.*member = *v;
            } else if (const auto* i = std::get_if<int64_t>(&value)) {
                config.*member = static_cast<double>(*i);
            } else {
                wrong_type("a number");
            }
        }
        void operator()(bool ModelConfig::*member) const {
            const auto* v = std::get_if<bool>(&value);
            if (!v) wrong_type("true or false");
            config.*member = *v;
        }
        void operator()(std::string ModelConfig::*member) const {
            const auto* v = std::get_if<std::string>(&value);
            if (!v) wrong_type("a string");
            config.*member = *v;
        }
    };
    std::visit(Visitor{config, field, value, where}, field.member);
}

// ---- TOML ----

Scalar toml_scalar(const toml::node& node) {
    if (const auto* v = node.as_integer()) return v->get();
    if (const auto* v = node.as_floating_point()) return v->get();
    if (const auto* v = node.as_boolean()) return v->get();
    if (const auto* v = node.as_string()) return v->get();
    if (node.is_table()) return OtherType{"a table"};
    if (node.is_array()) return OtherType{"an array"};
    return OtherType{"a date or time"};
}

std::string toml_where(std::string_view source_name, const toml::node& node) {
    const auto& begin = node.source().begin;
    if (begin.line == 0) return std::string(source_name);
    return fmt::format("{}:{}", source_name, begin.line);
}

// ---- JSON ----

Scalar json_scalar(const nlohmann::json& value) {
    switch (value.type()) {
        case nlohmann::json::value_t::null:
            return Null{};
        case nlohmann::json::value_t::boolean:
            return value.get<bool>();
        case nlohmann::json::value_t::number_integer:
            return value.get<int64_t>();
        case nlohmann::json::value_t::number_unsigned: {
            const uint64_t v = value.get<uint64_t>();
            if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                return OtherType{fmt::format("the integer {} (too large)", v)};
            return static_cast<int64_t>(v);
        }
        case nlohmann::json::value_t::number_float:
            return value.get<double>();
        case nlohmann::json::value_t::string:
            return value.get<std::string>();
        case nlohmann::json::value_t::object:
            return OtherType{"an object"};
        case nlohmann::json::value_t::array:
            return OtherType{"an array"};
        default:
            return OtherType{"an unsupported JSON value"};
    }
}

// The HF keys in kCheckedHfKeys: moetron implements exactly one value of each.
void check_hf_key(std::string_view source_name, std::string_view key, const nlohmann::json& value,
                  const ModelConfig& config) {
    if (key == "attention_bias") {
        MT_USER_CHECK(value.is_boolean() && !value.get<bool>(),
                      "[config] {}: attention_bias = {} is not supported: MLA projections in "
                      "moetron have no bias (DeepSeek-V3 uses false)",
                      source_name, value.dump());
    } else if (key == "hidden_act") {
        MT_USER_CHECK(value.is_string() && value.get<std::string>() == "silu",
                      "[config] {}: hidden_act = {} is not supported: the MLPs are SwiGLU, so it "
                      "must be \"silu\"",
                      source_name, value.dump());
    } else if (key == "num_key_value_heads") {
        // MLA has as many key/value heads as query heads.
        MT_USER_CHECK(
            value.is_number_integer() && value.get<int64_t>() == config.num_attention_heads,
            "[config] {}: num_key_value_heads = {} must equal num_attention_heads = {}: "
            "MLA gives every query head its own key and value",
            source_name, value.dump(), config.num_attention_heads);
    }
}

void validate_in(const ModelConfig& c, std::string_view where);

}  // namespace

ModelConfig parse_model_config_toml(std::string_view text, std::string_view source_name) {
    toml::table root;
    try {
        root = toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
        MT_USER_THROW("[config] {}:{}:{}: TOML syntax error: {}", source_name,
                      e.source().begin.line, e.source().begin.column, e.description());
    }
    ModelConfig config;
    for (const auto& [key_node, value] : root) {
        const std::string_view key = key_node.str();
        if (value.is_table() && contains(kForeignTomlTables, key)) continue;  // train/'s tables
        const std::string where = toml_where(source_name, value);
        if (value.is_table() && !find_field(key)) {
            MT_USER_THROW(
                "[config] {}: unknown table [{}]; a model preset keeps the model keys at the top "
                "level and may add only [train] and [data] (read by train/)",
                where, key);
        }
        const Field* field = find_field(key);
        if (!field) throw_unknown_key(where, key);
        assign(config, *field, toml_scalar(value), where);
    }
    validate_in(config, source_name);
    return config;
}

ModelConfig parse_model_config_json(std::string_view text, std::string_view source_name) {
    nlohmann::json root;
    try {
        root = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        // parse_error, and out_of_range for a number too large for a double (found by fuzzing).
        MT_USER_THROW("[config] {}: JSON syntax error: {}", source_name, e.what());
    }
    MT_USER_CHECK(root.is_object(), "[config] {}: a model config must be a JSON object, got {}",
                  source_name, describe_scalar(json_scalar(root)));
    ModelConfig config;
    for (const auto& [key, value] : root.items()) {
        if (contains(kIgnoredHfKeys, key) || contains(kCheckedHfKeys, key)) continue;
        const Field* field = find_field(key);
        if (!field) throw_unknown_key(source_name, key);
        assign(config, *field, json_scalar(value), source_name);
    }
    validate_in(config, source_name);
    for (std::string_view key : kCheckedHfKeys) {
        if (root.contains(key)) check_hf_key(source_name, key, root.at(std::string(key)), config);
    }
    return config;
}

ModelConfig load_model_config(const std::string& path) {
    namespace fs = std::filesystem;
    fs::path file = path;
    // A Hugging Face model directory holds its shape in config.json.
    if (fs::is_directory(file)) file /= "config.json";
    std::ifstream in(file, std::ios::binary);
    MT_USER_CHECK(in.good(), "[config] cannot open model config '{}': {}", file.string(),
                  fs::exists(file) ? "not readable" : "no such file");
    std::ostringstream buffer;
    buffer << in.rdbuf();
    std::string text = buffer.str();

    size_t first = 0;
    if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) first = 3;  // UTF-8 byte-order mark
    first = text.find_first_not_of(" \t\r\n", first);
    MT_USER_CHECK(first != std::string::npos, "[config] model config '{}' is empty", file.string());
    const size_t binary_at = first_binary_byte(text);
    MT_USER_CHECK(binary_at == std::string::npos,
                  "[config] model config '{}' is not a text file (byte {} is \\x{:02x}): a model "
                  "config is a TOML preset or a Hugging Face config.json",
                  file.string(), binary_at, static_cast<unsigned char>(text[binary_at]));
    MT_USER_CHECK(file.extension() != ".json" || text[first] == '{',
                  "[config] model config '{}' is not JSON: a Hugging Face config.json is one JSON "
                  "object, starting with '{{'",
                  file.string());

    // A JSON config is an object; a TOML document cannot start with '{'.
    ModelConfig config =
        text[first] == '{'
            ? parse_model_config_json(std::string_view(text).substr(first), file.string())
            : parse_model_config_toml(text, file.string());
    if (config.name == ModelConfig{}.name) {
        // Name an unnamed config after its file, or its directory for HF's <model>/config.json.
        const fs::path parent = file.parent_path();
        config.name = file.stem() == "config" && !parent.filename().empty()
                          ? parent.filename().string()
                          : file.stem().string();
    }
    return config;
}

void validate_model_config(const ModelConfig& config) {
    validate_in(config, fmt::format("model config '{}'", config.name));
}

namespace {

void validate_in(const ModelConfig& c, std::string_view where) {
    auto positive = [&](int64_t value, std::string_view key, std::string_view why) {
        MT_USER_CHECK(value > 0, "[config] {}: {} = {} must be positive ({})", where, key, value,
                      why);
    };
    auto non_negative = [&](int64_t value, std::string_view key) {
        MT_USER_CHECK(value >= 0, "[config] {}: {} = {} must not be negative", where, key, value);
    };
    // Upper bounds far above any real model, so that every count computed from the shape (the
    // parameters, FLOPs, arena sizes) stays exact: a hidden_size of 2^62 is a typo, not a model.
    auto at_most = [&](int64_t value, std::string_view key, int64_t max) {
        MT_USER_CHECK(value <= max, "[config] {}: {} = {} is out of range (at most {})", where, key,
                      value, max);
    };
    constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden and FFN widths, ranks, head dims
    at_most(c.vocab_size, "vocab_size", int64_t{1} << 24);
    at_most(c.hidden_size, "hidden_size", kMaxWidth);
    at_most(c.intermediate_size, "intermediate_size", kMaxWidth);
    at_most(c.moe_intermediate_size, "moe_intermediate_size", kMaxWidth);
    at_most(c.num_hidden_layers, "num_hidden_layers", 4096);
    at_most(c.num_nextn_predict_layers, "num_nextn_predict_layers", 4096);
    at_most(c.num_attention_heads, "num_attention_heads", 4096);
    at_most(c.q_lora_rank, "q_lora_rank", kMaxWidth);
    at_most(c.kv_lora_rank, "kv_lora_rank", kMaxWidth);
    at_most(c.qk_nope_head_dim, "qk_nope_head_dim", 65536);
    at_most(c.qk_rope_head_dim, "qk_rope_head_dim", 65536);
    at_most(c.v_head_dim, "v_head_dim", 65536);
    at_most(c.max_position_embeddings, "max_position_embeddings", int64_t{1} << 30);
    at_most(c.n_routed_experts, "n_routed_experts", 65536);
    at_most(c.n_shared_experts, "n_shared_experts", 65536);
    at_most(c.moe_layer_freq, "moe_layer_freq", 4096);
    auto positive_finite = [&](double value, std::string_view key) {
        MT_USER_CHECK(std::isfinite(value) && value > 0,
                      "[config] {}: {} = {} must be a positive finite number", where, key, value);
    };

    positive(c.vocab_size, "vocab_size", "rows of the embedding");
    positive(c.hidden_size, "hidden_size", "width of the residual stream");
    positive(c.num_hidden_layers, "num_hidden_layers", "the model needs at least one block");
    positive(c.num_attention_heads, "num_attention_heads", "MLA needs heads");
    non_negative(c.q_lora_rank, "q_lora_rank");
    positive(c.kv_lora_rank, "kv_lora_rank", "MLA compresses keys and values into it");
    positive(c.qk_nope_head_dim, "qk_nope_head_dim", "the non-rotary part of each q/k head");
    positive(c.qk_rope_head_dim, "qk_rope_head_dim", "the rotary part of each q/k head");
    MT_USER_CHECK(
        c.qk_rope_head_dim % 2 == 0,
        "[config] {}: qk_rope_head_dim = {} must be even: RoPE rotates pairs of dimensions", where,
        c.qk_rope_head_dim);
    positive(c.v_head_dim, "v_head_dim", "width of each value head");
    positive(c.max_position_embeddings, "max_position_embeddings", "longest sequence");
    positive_finite(c.rope_theta, "rope_theta");
    positive_finite(c.rms_norm_eps, "rms_norm_eps");
    MT_USER_CHECK(std::isfinite(c.initializer_range) && c.initializer_range >= 0,
                  "[config] {}: initializer_range = {} must be a finite standard deviation >= 0",
                  where, c.initializer_range);
    non_negative(c.num_nextn_predict_layers, "num_nextn_predict_layers");

    MT_USER_CHECK(
        c.first_k_dense_replace >= 0 && c.first_k_dense_replace <= c.num_hidden_layers,
        "[config] {}: first_k_dense_replace = {} must be between 0 and num_hidden_layers = "
        "{}",
        where, c.first_k_dense_replace, c.num_hidden_layers);
    positive(c.moe_layer_freq, "moe_layer_freq", "every moe_layer_freq-th layer is MoE");
    non_negative(c.n_routed_experts, "n_routed_experts");
    non_negative(c.n_shared_experts, "n_shared_experts");

    // A dense MLP exists in the main layers or in an MTP block: it needs a width.
    const int64_t num_mtp_moe =
        c.num_moe_layers_in(c.num_hidden_layers, c.num_hidden_layers + c.num_nextn_predict_layers);
    const bool any_dense = c.num_dense_layers() > 0 || num_mtp_moe < c.num_nextn_predict_layers;
    if (any_dense) {
        positive(c.intermediate_size, "intermediate_size",
                 "the dense MLP of the layers before first_k_dense_replace, or of every layer "
                 "when n_routed_experts = 0");
    }

    if (c.n_routed_experts == 0) {
        MT_USER_CHECK(
            c.n_shared_experts == 0,
            "[config] {}: n_shared_experts = {} needs MoE layers, but n_routed_experts = 0 "
            "makes every layer dense",
            where, c.n_shared_experts);
        return;
    }
    positive(c.moe_intermediate_size, "moe_intermediate_size", "width of each expert");
    positive(c.n_group, "n_group", "expert groups for group-limited routing");
    MT_USER_CHECK(c.n_routed_experts % c.n_group == 0,
                  "[config] {}: n_routed_experts = {} must be divisible by n_group = {}: routing "
                  "splits the experts into equal groups",
                  where, c.n_routed_experts, c.n_group);
    MT_USER_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group,
                  "[config] {}: topk_group = {} must be between 1 and n_group = {}", where,
                  c.topk_group, c.n_group);
    MT_USER_CHECK(
        c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.n_routed_experts,
        "[config] {}: num_experts_per_tok = {} must be between 1 and n_routed_experts = {}", where,
        c.num_experts_per_tok, c.n_routed_experts);
    const int64_t experts_reachable = c.topk_group * (c.n_routed_experts / c.n_group);
    MT_USER_CHECK(
        c.num_experts_per_tok <= experts_reachable,
        "[config] {}: num_experts_per_tok = {} is more than the {} experts in the topk_group "
        "= {} groups a token may use (n_routed_experts / n_group = {} each)",
        where, c.num_experts_per_tok, experts_reachable, c.topk_group,
        c.n_routed_experts / c.n_group);
    positive_finite(c.routed_scaling_factor, "routed_scaling_factor");
    MT_USER_CHECK(
        c.scoring_func == "sigmoid",
        "[config] {}: scoring_func = \"{}\" is not implemented; moetron's router implements "
        "only DeepSeek-V3's \"sigmoid\"",
        where, c.scoring_func);
    MT_USER_CHECK(
        c.topk_method == "noaux_tc",
        "[config] {}: topk_method = \"{}\" is not implemented; moetron's router implements "
        "only DeepSeek-V3's group-limited, bias-corrected \"noaux_tc\"",
        where, c.topk_method);
}

}  // namespace

std::string describe_model_config(const ModelConfig& c) {
    std::string text =
        fmt::format("{}: vocab {}, hidden {}, {} layers ({} dense with FFN {}, {} MoE)", c.name,
                    c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_dense_layers(),
                    c.intermediate_size, c.num_moe_layers());
    if (c.n_routed_experts > 0) {
        text += fmt::format(
            "; MoE {} routed + {} shared experts of FFN {}, top-{} in {} groups (top-{} groups), "
            "scale {}",
            c.n_routed_experts, c.n_shared_experts, c.moe_intermediate_size, c.num_experts_per_tok,
            c.n_group, c.topk_group, c.routed_scaling_factor);
    }
    text += fmt::format("; MLA {} heads, q_lora {}, kv_lora {}, qk {}+{} (rope), v {}; MTP {}",
                        c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                        c.qk_rope_head_dim, c.v_head_dim, c.num_nextn_predict_layers);
    return text;
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
    return nlohmann::json{{"name", c.name},
                          {"vocab_size", c.vocab_size},
                          {"hidden_size", c.hidden_size},
                          {"num_hidden_layers", c.num_hidden_layers},
                          {"first_k_dense_replace", c.first_k_dense_replace},
                          {"moe_layer_freq", c.moe_layer_freq},
                          {"intermediate_size", c.intermediate_size},
                          {"moe_intermediate_size", c.moe_intermediate_size},
                          {"n_routed_experts", c.n_routed_experts},
                          {"n_shared_experts", c.n_shared_experts},
                          {"num_experts_per_tok", c.num_experts_per_tok},
                          {"n_group", c.n_group},
                          {"topk_group", c.topk_group},
                          {"routed_scaling_factor", c.routed_scaling_factor},
                          {"scoring_func", c.scoring_func},
                          {"topk_method", c.topk_method},
                          {"norm_topk_prob", c.norm_topk_prob},
                          {"num_attention_heads", c.num_attention_heads},
                          {"q_lora_rank", c.q_lora_rank},
                          {"kv_lora_rank", c.kv_lora_rank},
                          {"qk_nope_head_dim", c.qk_nope_head_dim},
                          {"qk_rope_head_dim", c.qk_rope_head_dim},
                          {"v_head_dim", c.v_head_dim},
                          {"rope_theta", c.rope_theta},
                          {"max_position_embeddings", c.max_position_embeddings},
                          {"rms_norm_eps", c.rms_norm_eps},
                          {"num_nextn_predict_layers", c.num_nextn_predict_layers},
                          {"tie_word_embeddings", c.tie_word_embeddings},
                          {"initializer_range", c.initializer_range}};
}

}  // namespace moetron
