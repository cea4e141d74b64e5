// Pipeline parallelism in a Model: the chunks this rank runs (ModelParallel::pipeline_chunks),
// their activation sets, the blocks it owns, and the stage_* entry points a pipeline schedule
// (train/pipeline_schedule.h) drives: stage_forward and stage_backward are the two halves of
// forward_backward (model_passes.cpp).
#include "moetron/model/model_impl.h"

#include <string>
#include <vector>

#include "moetron/core/user_error.h"

namespace moetron {

std::vector<PipelineChunk> checked_chunks(const ModelConfig& c, const ModelParallel& par) {
    if (par.pipeline_chunks.empty()) return {whole_model_chunk(c)};
    for (const PipelineChunk& chunk : par.pipeline_chunks)
        MT_USER_CHECK(chunk.num_mtp == 0 || chunk.loss,
                      "[model] a pipeline chunk that runs MTP modules needs the head (L) too");
    MT_CHECK(par.pipeline_in_flight.empty() ||
                 par.pipeline_in_flight.size() == par.pipeline_chunks.size(),
             "[model] pipeline_in_flight has {} counts for {} chunks",
             par.pipeline_in_flight.size(), par.pipeline_chunks.size());
    for (int64_t n : par.pipeline_in_flight)
        MT_CHECK(n >= 1, "[model] a pipeline chunk needs at least one activation set, got {}", n);
    return par.pipeline_chunks;
}

std::vector<size_t> sets_by_chunk(const ModelParallel& par, size_t num_chunks) {
    std::vector<size_t> out;
    for (size_t c = 0; c < num_chunks; ++c) {
        const int64_t n = par.pipeline_in_flight.empty() ? 1 : par.pipeline_in_flight[c];
        out.insert(out.end(), static_cast<size_t>(n), c);
    }
    return out;
}

// The embedding is on two pipeline stages: the first, and the one of the MTP modules.
bool Model::Impl::shares_embedding() const {
    return !parallel.pipeline_chunks.empty() && config.num_nextn_predict_layers > 0 &&
           runs_embedding() !=
               any_chunk(chunks, [](const PipelineChunk& k) { return k.num_mtp > 0; });
}

bool Model::Impl::runs_embedding() const {
    return any_chunk(chunks, [](const PipelineChunk& k) { return k.embedding; });
}
bool Model::Impl::owns_layer(int64_t l) const {
    return any_chunk(chunks, [l](const PipelineChunk& k) {
        return l >= k.first_layer && l < k.first_layer + k.num_layers;
    });
}
bool Model::Impl::owns_mtp(int64_t d) const {
    return any_chunk(chunks, [d](const PipelineChunk& k) {
        return d >= k.first_mtp && d < k.first_mtp + k.num_mtp;
    });
}

MicroBatchLosses Model::stage_forward(int64_t chunk, int64_t set, const int32_t* tokens,
                                      const int32_t* targets, int64_t batch, int64_t seq_len,
                                      const LossDenominators* denominators) {
    return impl_->forward_pass(static_cast<size_t>(chunk), static_cast<size_t>(set), tokens,
                               targets, batch, seq_len, denominators != nullptr, 1.0f,
                               denominators);
}

void Model::stage_backward(int64_t set) {
    impl_->backward_pass(static_cast<size_t>(set));
}

float* Model::stage_input(int64_t chunk, int64_t set) {
    const PipelineChunk& k = impl_->chunks.at(static_cast<size_t>(chunk));
    return impl_->sets.at(static_cast<size_t>(set)).residual[k.first_layer];
}

const float* Model::stage_output(int64_t chunk, int64_t set) const {
    const PipelineChunk& k = impl_->chunks.at(static_cast<size_t>(chunk));
    return impl_->sets.at(static_cast<size_t>(set)).residual[k.first_layer + k.num_layers];
}

Model::SetRange Model::stage_sets(int64_t chunk) const {
    const auto c = static_cast<size_t>(chunk);
    const auto& first = impl_->first_set;
    const int64_t end =
        c + 1 < first.size() ? first[c + 1] : static_cast<int64_t>(impl_->set_chunk.size());
    return {first.at(c), end - first.at(c)};
}

float* Model::stage_grad(int64_t set) {
    return impl_->sets.at(static_cast<size_t>(set)).d_stream;
}

int64_t Model::stage_numel(int64_t batch, int64_t seq_len) const {
    return impl_->tp.local_rows(batch * seq_len) * impl_->config.hidden_size;
}

const std::vector<PipelineChunk>& Model::pipeline_chunks() const {
    return impl_->chunks;
}

bool Model::runs_embedding() const {
    return impl_->runs_embedding();
}

bool Model::shares_embedding() const {
    return impl_->shares_embedding();
}

}  // namespace moetron
