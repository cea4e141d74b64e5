// The property the configuration fuzzer checks, shared by the libFuzzer target
// (fuzz_config.cpp) and the corpus replay in test_fuzz_corpora.cpp. It covers what a user types
// or writes: a model preset (TOML) or Hugging Face config.json, a [train] table, and the numbers
// of the command line.
//
// The first byte of an input picks the reader (its value modulo 4), the rest is its text:
//   0  parse_model_config_toml     1  parse_train_config_toml
//   2  parse_model_config_json     3  command-line numbers, one per line, through the validators
//                                     of cli/number_options.h
// Every text is either rejected with moetron::Error (a validator: with a message), or accepted,
// and then what was accepted is in range: model shapes within their bounds, every [train] number
// finite with a tokens-per-step count that fits, a command-line number that parses to a value in
// the validator's range. Anything else (another exception type, a crash, a sanitizer report) is
// a bug.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "moetron/checkpoint/train_config.h"
#include "moetron/cli/number_options.h"
#include "moetron/core/error.h"
#include "moetron/model/config.h"

namespace moetron::fuzz {

inline void require_config(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "config property violated: %s\n", what);
        std::abort();
    }
}

inline void check_model_config(const ModelConfig& c) {
    require_config(c.hidden_size > 0 && c.hidden_size <= (int64_t{1} << 20), "hidden_size");
    require_config(c.vocab_size > 0 && c.vocab_size <= (int64_t{1} << 24), "vocab_size");
    require_config(c.num_hidden_layers > 0 && c.num_hidden_layers <= 4096, "num_hidden_layers");
    require_config(std::isfinite(c.rope_theta) && std::isfinite(c.rms_norm_eps), "floats");
    (void)describe_model_config(c);
}

inline void check_train_config(const TrainConfig& c) {
    for (double x : {c.lr, c.min_lr, c.weight_decay, c.beta1, c.beta2, c.eps, c.grad_clip,
                     c.bias_update_speed, c.balance_loss_alpha, c.mtp_lambda, c.val_fraction})
        require_config(std::isfinite(x), "a [train] number is not finite");
    int64_t tokens = 0;
    require_config(!__builtin_mul_overflow(c.batch_size, c.seq_len, &tokens) &&
                       !__builtin_mul_overflow(tokens, c.grad_accum, &tokens),
                   "tokens per step overflow");
    require_config(c.steps >= 1 && c.steps <= kMaxTrainSteps, "steps");
}

// One command-line word through an integer and a float validator.
inline void check_number_word(std::string word) {
    std::string copy = word;
    const std::string whole_error = cli::whole_number(1, kMaxTrainSteps)(copy);
    if (whole_error.empty()) {
        int64_t value = 0;
        const char* begin = word.data() + (!word.empty() && word[0] == '+' ? 1 : 0);
        const auto [end, ec] = std::from_chars(begin, word.data() + word.size(), value);
        require_config(ec == std::errc() && end == word.data() + word.size() && value >= 1 &&
                           value <= kMaxTrainSteps,
                       "an accepted whole number is not in range");
    }
    copy = word;
    const std::string finite_error = cli::positive_number(kMaxLearningRate)(copy);
    if (finite_error.empty()) {
        double value = 0;
        const char* begin = word.data() + (!word.empty() && word[0] == '+' ? 1 : 0);
        const auto [end, ec] = std::from_chars(begin, word.data() + word.size(), value);
        require_config(ec == std::errc() && end == word.data() + word.size() &&
                           std::isfinite(value) && value > 0 && value <= kMaxLearningRate,
                       "an accepted number is not in range");
    }
}

// True when the text was accepted (always for command-line numbers, which are checked word by
// word), false when it was rejected with moetron::Error.
inline bool check_config_input(const uint8_t* data, size_t size) {
    if (size == 0) return false;
    const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        switch (data[0] % 4) {
            case 0:
                check_model_config(parse_model_config_toml(text, "fuzz.toml"));
                break;
            case 1:
                check_train_config(parse_train_config_toml(text, "fuzz.toml"));
                break;
            case 2:
                check_model_config(parse_model_config_json(text, "fuzz.json"));
                break;
            default:
                for (size_t begin = 0; begin <= text.size();) {
                    size_t end = text.find('\n', begin);
                    if (end == std::string_view::npos) end = text.size();
                    check_number_word(std::string(text.substr(begin, end - begin)));
                    begin = end + 1;
                }
        }
    } catch (const Error&) {
        return false;  // a rejection with a message: what every bad input should get
    }
    return true;
}

}  // namespace moetron::fuzz
