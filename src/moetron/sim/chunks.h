// Model chunks: which blocks (embedding, layers, output head, MTP) each of the pp * vpp
// pipeline chunks holds. Either balanced by simulated block time (Megatron-LM's flexible layout
// chosen for us), or read from a Megatron-LM layout string such as "Et|(tt|)*30mL".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/sim/ops.h"

namespace moetron::sim {

struct ChunkBlock {
    BlockKind kind;
    int layer = -1;  // main-model layer index, -1 for other blocks
    double cost_s = 0;
};

// Splits items into exactly `parts` contiguous non-empty groups with the smallest maximum cost.
std::vector<std::vector<ChunkBlock>> partition_items(const std::vector<ChunkBlock>& items,
                                                     int64_t parts);

// The pipeline runs at the pace of its slowest stage, which holds chunks s, s+pp, s+2pp, ...:
// shifts chunk boundaries by one block while that lowers the largest stage sum.
void balance_stages(std::vector<std::vector<ChunkBlock>>& chunks, int64_t pp);

// Chunks from a Megatron-LM pipeline layout string (model/pipeline_layout.h), checked against the
// model.
std::vector<std::vector<ChunkBlock>> layout_items(const ModelConfig& model, const std::string& text,
                                                  int64_t chunks, bool with_mtp,
                                                  const std::map<BlockKind, double>& cost);

}  // namespace moetron::sim
