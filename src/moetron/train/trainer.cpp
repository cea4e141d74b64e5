#include "moetron/train/trainer.h"

#include <sys/resource.h>

#include <cmath>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/model/flops.h"

namespace moetron {

namespace {

std::unique_ptr<Model> make_model(const ModelConfig& model_config, const TrainConfig& config) {
    validate_train_config(config);
    MT_CHECK(config.seq_len <= model_config.max_position_embeddings,
             "[train] seq_len {} is longer than the model's max_position_embeddings {}",
             config.seq_len, model_config.max_position_embeddings);
    ModelRuntime runtime;
    runtime.batch_size = config.batch_size;
    runtime.seq_len = config.seq_len;
    LossWeights weights;
    weights.mtp_lambda = static_cast<float>(config.mtp_lambda);
    weights.balance_alpha = static_cast<float>(config.balance_loss_alpha);
    auto model = std::make_unique<Model>(model_config, runtime, weights);
    model->init_parameters(config.seed);
    return model;
}

AdamWConfig adamw_config(const TrainConfig& c) {
    AdamWConfig a;
    a.beta1 = c.beta1;
    a.beta2 = c.beta2;
    a.eps = c.eps;
    a.weight_decay = c.weight_decay;
    a.grad_clip = c.grad_clip;
    return a;
}

}  // namespace

Trainer::Trainer(const ModelConfig& model_config, const TrainConfig& config, DataLoader loader)
    : config_(config),
      loader_(std::move(loader)),
      model_(make_model(model_config, config)),
      optimizer_(model_->param_entries(), model_->num_params(), adamw_config(config)),
      schedule_(config.lr, config.min_lr, config.warmup_steps, config.steps),
      tokens_(static_cast<size_t>(config.batch_size * config.seq_len)),
      targets_(static_cast<size_t>(config.batch_size * config.seq_len)) {
    MT_CHECK(loader_.seq_len() == config.seq_len,
             "[train] the data loader cuts windows of {} tokens, the run wants seq_len {}",
             loader_.seq_len(), config.seq_len);
    const bool has_mtp = model_config.num_nextn_predict_layers > 0;
    model_flops_per_step_ = flops_per_token(model_config, config.seq_len, has_mtp).total *
                            static_cast<double>(config.tokens_per_step());
}

StepRecord Trainer::step() {
    StepRecord r;
    Timer timer;
    model_->zero_grads();
    const float grad_scale = 1.0f / static_cast<float>(config_.grad_accum);
    for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
        loader_.next_train_batch(tokens_.data(), targets_.data(), config_.batch_size);
        const MicroBatchLosses l = model_->forward_backward(
            tokens_.data(), targets_.data(), config_.batch_size, config_.seq_len, grad_scale);
        r.loss += l.lm_loss;
        r.mtp_loss += l.mtp_loss;
        r.balance_loss += l.balance_loss;
    }
    // The mean over micro-batches: what the scaled gradients differentiate.
    const auto micro_batches = static_cast<double>(config_.grad_accum);
    r.loss /= micro_batches;
    r.mtp_loss /= micro_batches;
    r.balance_loss /= micro_batches;

    r.step = optimizer_.step_count() + 1;
    r.grad_norm = optimizer_.clip_gradients(model_->grads());
    // Stop before the update: the parameters stay those of the last good step.
    MT_CHECK(std::isfinite(r.loss) && std::isfinite(r.grad_norm),
             "[train] step {}: training diverged (loss {}, gradient norm {}); try a lower --lr "
             "or a smaller grad_clip",
             r.step, r.loss, r.grad_norm);
    r.lr = schedule_.lr_at(optimizer_.step_count());
    optimizer_.step(model_->params(), model_->grads(), r.lr);
    double compute_s = timer.elapsed_s();

    // The loads must be read before the bias update resets them; expert_load() allocates, so it
    // stays outside the timed part.
    const ExpertLoadStats load = model_->expert_load();
    r.expert_load_max_over_mean = load.max_over_mean;
    r.expert_load_min_over_mean = load.min_over_mean;
    timer.reset();
    model_->update_router_bias(static_cast<float>(config_.bias_update_speed));
    compute_s += timer.elapsed_s();

    r.step_s = compute_s;
    r.tokens_per_s = static_cast<double>(config_.tokens_per_step()) / compute_s;
    r.model_tflops = model_flops_per_step_ / compute_s / 1e12;
    r.mfu =
        gemm_peak_gflops_ > 0 ? model_flops_per_step_ / compute_s / (gemm_peak_gflops_ * 1e9) : 0.0;
    return r;
}

double Trainer::evaluate() {
    double loss_sum = 0;
    int64_t num_tokens = 0;
    for (int64_t i = 0; i < config_.eval_batches; ++i) {
        loader_.val_batch(tokens_.data(), targets_.data(), config_.batch_size, i);
        const MicroBatchLosses l =
            model_->forward(tokens_.data(), targets_.data(), config_.batch_size, config_.seq_len);
        loss_sum += l.lm_loss * static_cast<double>(l.num_tokens);
        num_tokens += l.num_tokens;
    }
    return num_tokens > 0 ? loss_sum / static_cast<double>(num_tokens) : 0.0;
}

TrainSummary Trainer::run(MetricsLog& log) {
    TrainSummary s;
    const int64_t first_step = steps_done();
    while (steps_done() < config_.steps) {
        StepRecord r = step();
        const bool last = r.step == config_.steps;
        if (last || (config_.eval_every > 0 && r.step % config_.eval_every == 0)) {
            r.val_loss = evaluate();
            s.last_val_loss = r.val_loss;
        }
        if (r.step == first_step + 1) s.first_loss = r.loss;
        s.last_loss = r.loss;
        s.train_s += r.step_s;
        log.log_step(r);
    }
    log.finish();
    s.steps = steps_done() - first_step;
    if (s.train_s > 0) {
        const auto steps = static_cast<double>(s.steps);
        s.tokens_per_s = steps * static_cast<double>(config_.tokens_per_step()) / s.train_s;
        s.model_tflops = steps * model_flops_per_step_ / s.train_s / 1e12;
    }
    return s;
}

int64_t peak_rss_bytes() {
    rusage usage{};
    MT_CHECK(getrusage(RUSAGE_SELF, &usage) == 0, "[train] getrusage failed: {}",
             detail::errno_message());
    return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace moetron
