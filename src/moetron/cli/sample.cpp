// moetron sample: generate text byte by byte from trained weights: a checkpoint (`moetron train
// --save` or `--save-final`). Each new token runs the model forward
// over the last `context` tokens (by default the [train] seq_len it was trained at) and samples
// from the last position's logits.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moetron/checkpoint/train_config.h"
#include "moetron/checkpoint/trained_weights.h"
#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/cli/vocabulary.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/backend.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/model/model.h"
#include "moetron/train/preset_path.h"
#include "moetron/train/threads.h"
#include "moetron/train/tokenizer.h"

namespace moetron::cli {

namespace {

struct SampleOptions {
    std::string config_path;
    std::string weights_path;
    std::string prompt;
    int64_t num_tokens = 200;
    int64_t context = 0;  // 0: the preset's [train] seq_len
    double temperature = 0.8;
    uint64_t seed = 1;
    int threads = 0;
};

// Draws from softmax(logits / temperature); temperature 0 takes the most likely token.
int32_t sample_token(const float* logits, int64_t vocab_size, double temperature,
                     std::vector<double>& probs, RngStream& rng) {
    const int64_t best = std::max_element(logits, logits + vocab_size) - logits;
    if (temperature <= 0) return static_cast<int32_t>(best);
    double total = 0;
    for (int64_t v = 0; v < vocab_size; ++v) {
        probs[static_cast<size_t>(v)] = std::exp((logits[v] - logits[best]) / temperature);
        total += probs[static_cast<size_t>(v)];
    }
    double u = rng.next_unit_double() * total;
    for (int64_t v = 0; v < vocab_size; ++v) {
        u -= probs[static_cast<size_t>(v)];
        if (u < 0) return static_cast<int32_t>(v);
    }
    return static_cast<int32_t>(best);  // rounding left u >= 0: the mode is a safe choice
}

void run_sample(const SampleOptions& o) {
    if (o.threads > 0) check_thread_count(o.threads, "--threads");  // flags before files
    const TrainedWeightsSource weights = inspect_trained_weights(o.weights_path);
    // A checkpoint knows its model and settings; --config, if given, must name the same model.
    const std::string config_path =
        o.config_path.empty() ? std::string() : model_config_path(o.config_path);
    const ModelConfig model_config = trained_weights_model(weights, config_path);
    const TrainConfig& train_config = weights.train;
    MT_USER_CHECK(model_config.vocab_size >= kByteVocabSize,
                  "[sample] sampling is byte-level (256 ids) but the model has vocab_size {}",
                  model_config.vocab_size);
    const int64_t context = std::min(o.context > 0 ? o.context : train_config.seq_len,
                                     model_config.max_position_embeddings);

    // A forward pass is a third of a training step's FLOPs.
    choose_and_set_threads(o.threads, flops_per_token(model_config, context, false).total / 3.0 *
                                          static_cast<double>(context));

    ModelRuntime runtime;
    runtime.batch_size = 1;
    runtime.seq_len = context;
    runtime.backend = &cpu_backend();  // read_trained_params writes the parameters from the host
    Model model(model_config, runtime, LossWeights{});
    read_trained_params(weights, model_config, model.param_entries(), model.params());

    // An empty prompt starts after a newline, as a document would.
    std::vector<int32_t> tokens = byte_encode(o.prompt.empty() ? std::string("\n") : o.prompt);
    tokens.reserve(tokens.size() + static_cast<size_t>(o.num_tokens));
    std::vector<int32_t> window(static_cast<size_t>(context)),
        targets(static_cast<size_t>(context));
    std::vector<double> probs(static_cast<size_t>(model_config.vocab_size));
    RngStream rng(o.seed, /*stream_id=*/0x5A3B1E);

    MT_CHECK(std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout) == o.prompt.size(),
             "[sample] writing to stdout failed: {}", detail::errno_message());
    for (int64_t i = 0; i < o.num_tokens; ++i) {
        const auto n = static_cast<int64_t>(std::min<size_t>(tokens.size(), window.size()));
        std::copy(tokens.end() - n, tokens.end(), window.begin());
        // Targets are the next tokens where known; the last position has none.
        for (int64_t t = 0; t + 1 < n; ++t)
            targets[static_cast<size_t>(t)] = window[static_cast<size_t>(t + 1)];
        targets[static_cast<size_t>(n - 1)] = -1;
        model.forward(window.data(), targets.data(), 1, n);
        const float* last = model.logits() + (n - 1) * model_config.vocab_size;
        const int32_t next = sample_token(last, model_config.vocab_size, o.temperature, probs, rng);
        tokens.push_back(next);
        const char byte = static_cast<char>(next);
        MT_CHECK(std::fwrite(&byte, 1, 1, stdout) == 1 && std::fflush(stdout) == 0,
                 "[sample] writing to stdout failed: {}", detail::errno_message());
    }
    MT_CHECK(std::fputc('\n', stdout) != EOF && std::fflush(stdout) == 0,
             "[sample] writing to stdout failed: {}", detail::errno_message());
}

}  // namespace

void register_sample(CLI::App& app) {
    auto o = std::make_shared<SampleOptions>();
    CLI::App* cmd = app.add_subcommand("sample", "Generate text (byte-level) from a checkpoint");
    cmd->add_option("--config", o->config_path,
                    "optional: the model the checkpoint must hold, a preset name or a TOML file "
                    "(a checkpoint knows its model)");
    cmd->add_option("--weights", o->weights_path,
                    "a checkpoint directory or root (train --save or --save-final)")
        ->required();
    cmd->add_option("--prompt", o->prompt, "text to continue");
    cmd->add_option("--new-tokens", o->num_tokens, "tokens (bytes) to generate")
        ->capture_default_str()
        ->check(whole_number(0, int64_t{1} << 30));
    cmd->add_option("--temperature", o->temperature, "softmax temperature (0: greedy)")
        ->capture_default_str()
        ->check(finite_number(0, 1000));
    cmd->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
    cmd->add_option("--context", o->context,
                    "tokens of context the model sees (default: the preset's [train] seq_len, "
                    "the length it was trained at)")
        ->check(whole_number(1, kMaxSeqLen));
    cmd->add_option("--threads", o->threads,
                    "compute threads (default: OMP_NUM_THREADS, else 1 for a small model)")
        ->check(whole_number(1, kMaxThreads));
    cmd->callback([o] { run_sample(*o); });
}

}  // namespace moetron::cli
