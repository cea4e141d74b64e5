// The [train] table: one key table maps each TOML key to its TrainConfig field.
#include "moetron/checkpoint/train_config.h"

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <variant>

#include "moetron/core/checked_math.h"
#include "moetron/core/error.h"
#include "moetron/core/strings.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace {

using FieldMember =
    std::variant<int64_t TrainConfig::*, double TrainConfig::*, uint64_t TrainConfig::*>;

struct Field {
    std::string_view key;
    FieldMember member;
};

const Field kFields[] = {
    {"batch_size", &TrainConfig::batch_size},
    {"seq_len", &TrainConfig::seq_len},
    {"grad_accum", &TrainConfig::grad_accum},
    {"steps", &TrainConfig::steps},
    {"lr", &TrainConfig::lr},
    {"min_lr", &TrainConfig::min_lr},
    {"warmup_steps", &TrainConfig::warmup_steps},
    {"weight_decay", &TrainConfig::weight_decay},
    {"beta1", &TrainConfig::beta1},
    {"beta2", &TrainConfig::beta2},
    {"eps", &TrainConfig::eps},
    {"grad_clip", &TrainConfig::grad_clip},
    {"seed", &TrainConfig::seed},
    {"bias_update_speed", &TrainConfig::bias_update_speed},
    {"balance_loss_alpha", &TrainConfig::balance_loss_alpha},
    {"mtp_lambda", &TrainConfig::mtp_lambda},
    {"eval_every", &TrainConfig::eval_every},
    {"eval_batches", &TrainConfig::eval_batches},
    {"val_fraction", &TrainConfig::val_fraction},
};

std::string where_of(std::string_view source_name, const toml::node& node) {
    const auto& begin = node.source().begin;
    return fmt::format("{}:{}:{}", source_name, begin.line, begin.column);
}

std::string_view type_name(const toml::node& node) {
    switch (node.type()) {
        case toml::node_type::table:
            return "table";
        case toml::node_type::array:
            return "array";
        case toml::node_type::string:
            return "string";
        case toml::node_type::integer:
            return "integer";
        case toml::node_type::floating_point:
            return "floating-point number";
        case toml::node_type::boolean:
            return "boolean";
        case toml::node_type::date:
            return "date";
        case toml::node_type::time:
            return "time";
        case toml::node_type::date_time:
            return "date-time";
        case toml::node_type::none:
            break;
    }
    return "value of unknown type";
}

void assign(TrainConfig& config, const Field& field, const toml::node& value,
            const std::string& where) {
    std::visit(
        [&](auto member) {
            using T = std::remove_reference_t<decltype(config.*member)>;
            if constexpr (std::is_same_v<T, double>) {
                // Integers are numbers too: lr = 1 is as good as lr = 1.0.
                if (const auto* f = value.as_floating_point()) {
                    config.*member = f->get();
                } else if (const auto* i = value.as_integer()) {
                    config.*member = static_cast<double>(i->get());
                } else {
                    MT_USER_THROW("[train-config] {}: '{}' must be a number, got a {}", where,
                                  field.key, type_name(value));
                }
            } else {
                const auto* i = value.as_integer();
                MT_USER_CHECK(i != nullptr, "[train-config] {}: '{}' must be an integer, got a {}",
                              where, field.key, type_name(value));
                if constexpr (std::is_same_v<T, uint64_t>) {
                    MT_USER_CHECK(i->get() >= 0,
                                  "[train-config] {}: '{}' must not be negative, got {}", where,
                                  field.key, i->get());
                    config.*member = static_cast<uint64_t>(i->get());
                } else {
                    config.*member = i->get();
                }
            }
        },
        field.member);
}

}  // namespace

const std::vector<std::string_view>& train_config_keys() {
    static const std::vector<std::string_view> keys = [] {
        std::vector<std::string_view> k;
        for (const Field& f : kFields) k.push_back(f.key);
        return k;
    }();
    return keys;
}

TrainConfig parse_train_config_toml(std::string_view text, std::string_view source_name) {
    toml::table root;
    try {
        root = toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
        MT_USER_THROW("[train-config] {}:{}:{}: TOML syntax error: {}", source_name,
                      e.source().begin.line, e.source().begin.column, e.description());
    }
    TrainConfig config;
    const toml::node* train_node = root.get("train");
    if (!train_node) return config;
    const toml::table* train = train_node->as_table();
    MT_USER_CHECK(train != nullptr,
                  "[train-config] {}: 'train' must be a table ([train]), got a {}",
                  where_of(source_name, *train_node), type_name(*train_node));
    for (const auto& [key_node, value] : *train) {
        const std::string_view key = key_node.str();
        const std::string where = where_of(source_name, value);
        const Field* field = nullptr;
        for (const Field& f : kFields)
            if (f.key == key) field = &f;
        if (!field) {
            MT_USER_THROW("[train-config] {}: unknown key {} in [train] (did you mean '{}'?)",
                          where, printable(key), closest_match(key, train_config_keys()));
        }
        assign(config, *field, value, where);
    }
    try {
        validate_train_config(config);
    } catch (const Error& e) {
        MT_USER_THROW("{} (in [train] of {})", e.what(), source_name);
    }
    return config;
}

TrainConfig load_train_config(const std::string& path) {
    namespace fs = std::filesystem;
    fs::path file = path;
    if (fs::is_directory(file)) file /= "config.json";
    std::ifstream in(file, std::ios::binary);
    MT_USER_CHECK(in.good(), "[train-config] cannot open '{}': {}", file.string(),
                  fs::exists(file) ? "not readable" : "no such file");
    std::ostringstream buffer;
    buffer << in.rdbuf();
    MT_USER_CHECK(!in.bad(), "[train-config] error reading '{}'", file.string());
    const std::string text = buffer.str();
    // A Hugging Face config.json carries no training settings: the defaults apply.
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '{') return TrainConfig{};
    return parse_train_config_toml(text, file.string());
}

namespace {

// "key must lie in [min, max], got value": every key of the table is checked this way, so that a
// typo such as weight_decay = inf or grad_clip = nan never reaches the optimizer.
void check_whole(std::string_view key, int64_t value, int64_t min, int64_t max) {
    MT_USER_CHECK(value >= min && value <= max, "[train-config] {} must lie in [{}, {}], got {}",
                  key, min, max, value);
}

enum class Lower { inclusive, exclusive };

void check_finite(std::string_view key, double value, double min, double max,
                  Lower lower = Lower::inclusive) {
    const bool above_min = lower == Lower::inclusive ? value >= min : value > min;
    MT_USER_CHECK(std::isfinite(value) && above_min && value <= max,
                  "[train-config] {} must lie in {}{}, {}] (a finite number), got {}", key,
                  lower == Lower::inclusive ? "[" : "(", min, max, value);
}

}  // namespace

void validate_train_config(const TrainConfig& c) {
    constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
    check_whole("batch_size", c.batch_size, 1, kMaxBatchSize);
    check_whole("seq_len", c.seq_len, 2, kMaxSeqLen);
    check_whole("grad_accum", c.grad_accum, 1, kMaxGradAccum);
    checked_product({c.batch_size, c.seq_len, c.grad_accum},
                    "[train-config] tokens per step (batch_size x seq_len x grad_accum)");
    check_whole("steps", c.steps, 1, kMaxTrainSteps);
    check_finite("lr", c.lr, 0, kMaxLearningRate, Lower::exclusive);
    check_finite("min_lr", c.min_lr, 0, c.lr);
    check_whole("warmup_steps", c.warmup_steps, 0, kAny);
    check_finite("weight_decay", c.weight_decay, 0, 1e3);
    check_finite("beta1", c.beta1, 0, 1);
    MT_USER_CHECK(c.beta1 < 1, "[train-config] beta1 must lie in [0, 1), got {}", c.beta1);
    check_finite("beta2", c.beta2, 0, 1);
    MT_USER_CHECK(c.beta2 < 1, "[train-config] beta2 must lie in [0, 1), got {}", c.beta2);
    check_finite("eps", c.eps, 0, 1, Lower::exclusive);
    MT_USER_CHECK(
        std::isfinite(c.grad_clip),
        "[train-config] grad_clip must be a finite number (<= 0 disables clipping), got {}",
        c.grad_clip);
    check_finite("bias_update_speed", c.bias_update_speed, 0, 1e3);
    check_finite("balance_loss_alpha", c.balance_loss_alpha, 0, 1e3);
    check_finite("mtp_lambda", c.mtp_lambda, 0, 1e3);
    check_whole("eval_every", c.eval_every, 0, kAny);
    check_whole("eval_batches", c.eval_batches, 1, int64_t{1} << 30);
    check_finite("val_fraction", c.val_fraction, 0, 1, Lower::exclusive);
    MT_USER_CHECK(c.val_fraction < 1, "[train-config] val_fraction must lie in (0, 1), got {}",
                  c.val_fraction);
}

}  // namespace moetron
