#include "moetron/model/layout_fit.h"

#include "moetron/core/user_error.h"

namespace moetron {

void validate_layout_for_model(const parallel::Layout& l, const ModelConfig& model) {
    MT_USER_CHECK(model.num_attention_heads % l.tp == 0,
                  "[layout] tp {} does not divide the {} attention heads of model '{}'", l.tp,
                  model.num_attention_heads, model.name);
    // The embedding and the head count as blocks (model/pipeline_layout.h's default placement).
    const int64_t blocks = model.num_hidden_layers + model.num_nextn_predict_layers + 2;
    MT_USER_CHECK(l.pp * l.vpp <= blocks,
                  "[layout] layout {}: pp*vpp = {} virtual stages for only {} blocks of model '{}' "
                  "(embedding, {} layers, {} MTP modules, head; each model chunk needs one)",
                  l.str(), l.pp * l.vpp, blocks, model.name, model.num_hidden_layers,
                  model.num_nextn_predict_layers);
    if (l.ep > 1) {
        MT_USER_CHECK(model.n_routed_experts > 0,
                      "[layout] ep {} needs routed experts, but model '{}' has none", l.ep,
                      model.name);
        MT_USER_CHECK(model.n_routed_experts % l.ep == 0,
                      "[layout] ep {} does not divide the {} routed experts of model '{}'", l.ep,
                      model.n_routed_experts, model.name);
    }
}

void validate_topology_for_model(const parallel::Topology& t, const ModelConfig& model) {
    validate_layout_for_model(
        parallel::Layout{.tp = t.tp, .pp = t.pp, .vpp = t.vpp, .ep = t.ep, .cp = t.cp, .dp = t.dp},
        model);
    MT_USER_CHECK(model.vocab_size % t.tp == 0,
                  "[layout] tp {} does not divide vocab_size {} (vocabulary-parallel embedding and "
                  "head) of model '{}'",
                  t.tp, model.vocab_size, model.name);
    MT_USER_CHECK(model.intermediate_size % t.tp == 0,
                  "[layout] tp {} does not divide intermediate_size {} (the dense MLP) of model "
                  "'{}'",
                  t.tp, model.intermediate_size, model.name);
    const int64_t shared_ffn = model.n_shared_experts * model.moe_intermediate_size;
    MT_USER_CHECK(model.n_routed_experts == 0 || shared_ffn % t.tp == 0,
                  "[layout] tp {} does not divide the shared experts' intermediate size "
                  "(n_shared_experts {} x moe_intermediate_size {} = {}) of model '{}'",
                  t.tp, model.n_shared_experts, model.moe_intermediate_size, shared_ffn,
                  model.name);
}

}  // namespace moetron
