// moetron train: single-process training of a model preset on a token file, a text file or the
// built-in synthetic dataset. With no arguments it trains the tiny preset on synthetic text.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "moetron/cli/commands.h"
#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/metrics.h"
#include "moetron/train/preset_path.h"
#include "moetron/train/threads.h"
#include "moetron/train/train_config.h"
#include "moetron/train/trainer.h"
#include "moetron/train/weights_file.h"

namespace moetron::cli {

namespace {

struct TrainOptions {
    std::string config_path;
    std::string data_path;
    std::string text_path;
    std::string log_jsonl_path;
    std::string save_final_path;
    int threads = 0;
    // Overrides of the preset's [train] table; applied only when given (count() > 0).
    int64_t steps = 0, batch_size = 0, seq_len = 0, grad_accum = 0, eval_every = 0;
    double lr = 0;
    uint64_t seed = 0;
    CLI::Option *steps_opt = nullptr, *batch_size_opt = nullptr, *seq_len_opt = nullptr,
                *grad_accum_opt = nullptr, *eval_every_opt = nullptr, *lr_opt = nullptr,
                *seed_opt = nullptr;
};

double to_mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

void run_train(const TrainOptions& o) {
    const Timer wall;
    const std::string config_path = o.config_path.empty() ? find_preset("tiny") : o.config_path;
    const ModelConfig model_config = load_model_config(config_path);
    TrainConfig config = load_train_config(config_path);
    if (o.steps_opt->count()) config.steps = o.steps;
    if (o.batch_size_opt->count()) config.batch_size = o.batch_size;
    if (o.seq_len_opt->count()) config.seq_len = o.seq_len;
    if (o.grad_accum_opt->count()) config.grad_accum = o.grad_accum;
    if (o.eval_every_opt->count()) config.eval_every = o.eval_every;
    if (o.lr_opt->count()) {
        // Keep the preset's floor-to-peak ratio when only the peak is given.
        config.min_lr = config.min_lr / config.lr * o.lr;
        config.lr = o.lr;
    }
    if (o.seed_opt->count()) config.seed = o.seed;
    validate_train_config(config);
    const bool has_mtp = model_config.num_nextn_predict_layers > 0;
    const ThreadChoice threads = choose_and_set_threads(
        o.threads, flops_per_token(model_config, config.seq_len, has_mtp).total *
                       static_cast<double>(config.tokens_per_step()));

    TokenData data =
        !o.data_path.empty()   ? load_token_file_data(o.data_path, model_config.vocab_size)
        : !o.text_path.empty() ? load_text_file_data(o.text_path, model_config.vocab_size)
                               : make_synthetic_data(model_config.vocab_size, config.seed);
    const std::string data_description = data.description;
    const double entropy_floor = data.entropy_nats_per_token;
    DataLoader loader(std::move(data.tokens), data.source, model_config.vocab_size, config.seq_len,
                      config.val_fraction, config.seed);

    std::printf("moetron train: %s\n", config_path.c_str());
    std::printf("model   %s\n", describe_model_config(model_config).c_str());
    std::printf("data    %s\n", data_description.c_str());
    std::printf("        %lld training tokens, %lld held out (%lld validation windows)\n",
                static_cast<long long>(loader.num_train_tokens()),
                static_cast<long long>(loader.num_val_tokens()),
                static_cast<long long>(loader.num_val_windows()));
    Trainer trainer(model_config, config, std::move(loader));
    const double peak_gflops = measure_gemm_peak_gflops();
    trainer.set_gemm_peak_gflops(peak_gflops);
    std::printf("params  %.3fM (main model and MTP); model arenas %.1f MiB\n",
                static_cast<double>(trainer.model().num_params()) / 1e6,
                to_mib(static_cast<double>(trainer.model().planned_bytes())));
    std::printf(
        "train   %lld steps x %lld micro-batch(es) of %lld x %lld tokens = %lld tokens/step; lr "
        "%.2e -> %.2e (warmup %lld), wd %.2g, clip %.2g, seed %llu\n",
        static_cast<long long>(config.steps), static_cast<long long>(config.grad_accum),
        static_cast<long long>(config.batch_size), static_cast<long long>(config.seq_len),
        static_cast<long long>(config.tokens_per_step()), config.lr, config.min_lr,
        static_cast<long long>(config.warmup_steps), config.weight_decay, config.grad_clip,
        static_cast<unsigned long long>(config.seed));
    std::printf(
        "compute %d thread(s) (%s); measured sgemm peak %.1f GFLOP/s; %.3f model "
        "GFLOP/step\n",
        threads.num_threads, threads.reason, peak_gflops, trainer.model_flops_per_step() / 1e9);
    const double initial_val = trainer.evaluate();
    std::printf("step 0 | val %.4f (uniform guess: ln %lld = %.4f)\n", initial_val,
                static_cast<long long>(model_config.vocab_size),
                std::log(static_cast<double>(model_config.vocab_size)));
    MT_CHECK(std::fflush(stdout) == 0, "[train] writing to stdout failed: {}",
             detail::errno_message());

    const int64_t print_every = std::max<int64_t>(1, config.steps / 25);
    MetricsLog log(config.steps, print_every, o.log_jsonl_path, isatty(fileno(stdout)) == 1);
    const TrainSummary s = trainer.run(log);

    std::printf(
        "done    %lld steps in %.1f s of compute (%.1f s wall); train loss %.4f -> %.4f; "
        "val %.4f -> %.4f",
        static_cast<long long>(s.steps), s.train_s, wall.elapsed_s(), s.first_loss, s.last_loss,
        initial_val, s.last_val_loss);
    if (std::isfinite(entropy_floor)) std::printf(" (data entropy %.4f)", entropy_floor);
    std::printf("\nspeed   %.0f tokens/s, %.4f model TFLOP/s, MFU %.1f%% of the sgemm peak\n",
                s.tokens_per_s, s.model_tflops,
                peak_gflops > 0 ? 100.0 * s.model_tflops * 1e3 / peak_gflops : 0.0);
    const double moments_bytes = 2.0 * 4.0 * static_cast<double>(trainer.model().num_params());
    std::printf(
        "memory  peak RSS %.1f MiB; planned: model arenas %.1f MiB + AdamW moments %.1f "
        "MiB\n",
        to_mib(static_cast<double>(peak_rss_bytes())),
        to_mib(static_cast<double>(trainer.model().planned_bytes())), to_mib(moments_bytes));
    if (!o.save_final_path.empty()) {
        save_weights(o.save_final_path, trainer.model());
        std::printf(
            "saved   weights to %s (sample with: moetron sample --config %s --weights %s "
            "--prompt TEXT)\n",
            o.save_final_path.c_str(), config_path.c_str(), o.save_final_path.c_str());
    }
    MT_CHECK(std::fflush(stdout) == 0, "[train] writing to stdout failed: {}",
             detail::errno_message());
}

}  // namespace

void register_train(CLI::App& app) {
    auto o = std::make_shared<TrainOptions>();
    CLI::App* cmd = app.add_subcommand(
        "train",
        "Train a model on one process (default: the tiny preset on built-in synthetic text)");
    cmd->add_option("--config", o->config_path,
                    "model preset with a [train] table (default: configs/models/tiny.toml)");
    CLI::Option* data = cmd->add_option(
        "--data", o->data_path, "token file: a moetron shard (moetron prepare) or an llm.c .bin");
    CLI::Option* text =
        cmd->add_option("--text", o->text_path, "text file, tokenized byte-level on the fly");
    data->excludes(text);
    o->steps_opt =
        cmd->add_option("--steps", o->steps, "optimizer steps")->check(CLI::PositiveNumber);
    o->batch_size_opt = cmd->add_option("--batch-size", o->batch_size, "sequences per micro-batch")
                            ->check(CLI::PositiveNumber);
    o->seq_len_opt = cmd->add_option("--seq-len", o->seq_len, "tokens per sequence")
                         ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
    o->grad_accum_opt =
        cmd->add_option("--grad-accum", o->grad_accum, "micro-batches per optimizer step")
            ->check(CLI::PositiveNumber);
    o->lr_opt = cmd->add_option("--lr", o->lr, "peak learning rate (min_lr scales with it)")
                    ->check(CLI::PositiveNumber);
    o->seed_opt = cmd->add_option("--seed", o->seed, "initialization and data-sampling seed");
    o->eval_every_opt = cmd->add_option("--eval-every", o->eval_every,
                                        "validate every N steps (0: only after the last)")
                            ->check(CLI::NonNegativeNumber);
    cmd->add_option("--log-jsonl", o->log_jsonl_path, "write one JSON object per step here");
    cmd->add_option("--save-final", o->save_final_path,
                    "write the trained weights here (for moetron sample)");
    cmd->add_option("--threads", o->threads,
                    "compute threads (default: OMP_NUM_THREADS, else 1 for steps under 5 model "
                    "GFLOP, else all cores)")
        ->check(CLI::PositiveNumber);
    cmd->callback([o] { run_train(*o); });
}

}  // namespace moetron::cli
