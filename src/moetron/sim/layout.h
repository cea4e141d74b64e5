// Where the groups of a parallel layout (parallel/layout.h: "tp1.pp2.vpp4.ep32") land on the
// cluster. (Megatron-LM's pipeline layout strings are model/pipeline_layout.h's.) Ranks are ordered
// as Megatron-LM orders them: tp fastest, then cp, dp, pp for the attention part; the expert part
// folds the same ranks as ep fastest (expert TP = 1), then expert-dp, pp. A job places groups so
// that no EP (or TP) group straddles two scale-up domains: each domain uses the largest multiple of
// the EP*TP "block" that fits (64 of 72 GPUs for EP32 on NVL72), as Megatron's recipes request with
// SLURM segments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/parallel/layout.h"

namespace moetron::sim {

// How a communication group sits on the cluster.
struct GroupPlacement {
    int64_t size = 1;              // ranks in the group
    int64_t domains = 1;           // scale-up domains it spans
    int64_t ranks_per_domain = 1;  // ranks of the group inside one domain (size / domains)
};

// GPUs of a domain the job uses: the largest multiple of the EP*TP block (or the TP group) that
// fits the domain; the whole domain when the block is bigger than it.
int64_t used_gpus_per_domain(const parallel::Layout& layout, int64_t domain_gpus);
// Placement of a group of `size` ranks at `stride` apart in rank space.
GroupPlacement place_group(int64_t size, int64_t stride, int64_t gpus_per_domain);

struct LayoutPlacement {
    GroupPlacement tp, cp, dp, ep, edp, pp;
    int64_t gpus_per_domain = 1;
    int64_t num_domains = 1;
};
LayoutPlacement place_layout(const parallel::Layout& layout, int64_t domain_gpus);

}  // namespace moetron::sim
