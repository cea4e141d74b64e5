#include "moetron/model/layout_fit.h"

#include <fmt/format.h>

#include "moetron/core/user_error.h"

namespace moetron {

std::string layout_misfit(const parallel::Layout& l, const ModelConfig& model) {
    if (model.num_attention_heads % l.tp != 0) {
        return fmt::format("[layout] tp {} does not divide the {} attention heads of model '{}'",
                           l.tp, model.num_attention_heads, model.name);
    }
    // The embedding and the head count as blocks (model/pipeline_layout.h's default placement).
    const int64_t blocks = model.num_hidden_layers + model.num_nextn_predict_layers + 2;
    if (l.pp * l.vpp > blocks) {
        return fmt::format(
            "[layout] layout {}: pp*vpp = {} virtual stages for only {} blocks of model '{}' "
            "(embedding, {} layers, {} MTP modules, head; each model chunk needs one)",
            l.str(), l.pp * l.vpp, blocks, model.name, model.num_hidden_layers,
            model.num_nextn_predict_layers);
    }
    if (model.vocab_size % l.tp != 0) {
        return fmt::format(
            "[layout] tp {} does not divide vocab_size {} (vocabulary-parallel embedding and "
            "head) of model '{}'",
            l.tp, model.vocab_size, model.name);
    }
    if (model.intermediate_size % l.tp != 0) {
        return fmt::format(
            "[layout] tp {} does not divide intermediate_size {} (the dense MLP) of model '{}'",
            l.tp, model.intermediate_size, model.name);
    }
    const int64_t shared_ffn = model.n_shared_experts * model.moe_intermediate_size;
    if (model.n_routed_experts > 0 && shared_ffn % l.tp != 0) {
        return fmt::format(
            "[layout] tp {} does not divide the shared experts' intermediate size "
            "(n_shared_experts {} x moe_intermediate_size {} = {}) of model '{}'",
            l.tp, model.n_shared_experts, model.moe_intermediate_size, shared_ffn, model.name);
    }
    if (l.ep > 1 && model.n_routed_experts == 0) {
        return fmt::format("[layout] ep {} needs routed experts, but model '{}' has none", l.ep,
                           model.name);
    }
    if (l.ep > 1 && model.n_routed_experts % l.ep != 0) {
        return fmt::format("[layout] ep {} does not divide the {} routed experts of model '{}'",
                           l.ep, model.n_routed_experts, model.name);
    }
    return {};
}

void validate_layout_for_model(const parallel::Layout& l, const ModelConfig& model) {
    const std::string misfit = layout_misfit(l, model);
    if (!misfit.empty()) throw UserError(misfit);
}

void validate_topology_for_model(const parallel::Topology& t, const ModelConfig& model) {
    validate_layout_for_model(
        parallel::Layout{.tp = t.tp, .pp = t.pp, .vpp = t.vpp, .ep = t.ep, .cp = t.cp, .dp = t.dp},
        model);
}

}  // namespace moetron
