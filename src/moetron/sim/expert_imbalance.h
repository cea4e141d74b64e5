// Routing imbalance for the cluster model: the tokens per EP rank, max over mean, that a load
// histogram over the experts gives, with the experts split contiguously (no redundant experts) and
// with R redundant slots placed as training places them (parallel/expert_placement.h). In a
// dropless MoE the slowest rank sets the step, so the step's expert compute (and the receive side
// of its dispatch) scales by that ratio over the balanced estimate.
//
// The histogram comes from a measured run (`moetron train --log-jsonl`, whose rebalance records
// carry "average_expert_load") or from a parametric skew (Zipf: expert i's load proportional to
// 1 / (i + 1)^s; s = 0 is balanced).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moetron/parallel/expert_placement.h"

namespace moetron::sim {

// The last "average_expert_load" of a --log-jsonl file. Throws moetron::UserError naming the file
// when it cannot be read or holds no such record (the run needs --redundant-experts and
// --rebalance-every).
std::vector<double> expert_loads_from_jsonl(const std::string& path);

// Zipf loads over `experts` experts with exponent s >= 0 (mean 1).
std::vector<double> zipf_expert_loads(int64_t experts, double exponent);

// What `moetron simulate --expert-imbalance` takes: "zipf:S" (zipf_expert_loads over `experts`)
// or the path of a --log-jsonl file (expert_loads_from_jsonl). Throws moetron::UserError for a
// malformed exponent, an unreadable file or a file without loads.
std::vector<double> expert_loads_from_spec(const std::string& spec, int64_t experts);

struct ExpertImbalance {
    double contiguous = 1;  // tokens per rank max / mean, E / ep experts per rank in order
    double redundant = 1;   // the same with the shape's redundant slots, balanced_placement
};

// shape: the EP group with its redundant slots (num_slots = E + R; R = 0 gives the same twice).
ExpertImbalance expert_rank_imbalance(std::span<const double> loads,
                                      const parallel::PlacementShape& shape);

}  // namespace moetron::sim
