// Whether a parallel layout can split a model: the checks of the layout against the model that
// the cluster model and the engine share, and the engine's own tensor-parallel splits. They live
// here, not in parallel/, because parallel/ knows ranks and groups but not what a layer is.
#pragma once

#include <string>

#include "moetron/model/config.h"
#include "moetron/parallel/layout.h"
#include "moetron/parallel/topology.h"

namespace moetron {

// tp divides the attention heads and what the engine's tensor parallelism splits without padding
// (the vocabulary: vocabulary-parallel embedding and head; the dense MLP's and the shared experts'
// intermediate sizes; routed experts keep expert-TP = 1), ep the routed experts (ep > 1 needs
// some), and every virtual pipeline stage gets a block (pp*vpp <= layers + MTP modules + 2: the
// embedding and the head count). The cluster model counts parameters with the engine's splits,
// so both refuse the same layouts. Returns the first misfit as a message naming the numbers, or
// an empty string when the layout fits.
std::string layout_misfit(const parallel::Layout& layout, const ModelConfig& model);

// layout_misfit as moetron::UserError.
void validate_layout_for_model(const parallel::Layout& layout, const ModelConfig& model);

// The above for the engine's resolved topology.
void validate_topology_for_model(const parallel::Topology& topology, const ModelConfig& model);

}  // namespace moetron
