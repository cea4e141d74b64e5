// Where the blocks of the model sit in a pipeline: Megatron-LM's --pipeline-model-parallel-layout
// grammar, read by one function for the engine (moetron train --pp-layout) and the cluster model
// (moetron simulate --pp-layout) alike, and the placement both use when none is given.
//
// A layout is pp * vpp model chunks separated by '|', each a string of E (embedding), t
// (transformer layer), m (MTP module), L (final norm, output head, loss); "t*3" repeats a block
// and "(tt|)*30" a group. Example: "Et|(tt|)*30mL" has 32 chunks. Chunk c runs on pipeline stage
// c % pp (Megatron's interleaved order): stage 0 holds chunks 0, pp, 2pp, ...
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/model/config.h"

namespace moetron {

// The syntax only: one string of E/t/m/L per chunk, repetitions expanded. Throws
// moetron::UserError for an unknown symbol, unbalanced parentheses, a bad count or an empty chunk.
std::vector<std::string> parse_pipeline_layout(std::string_view text);

// What one model chunk holds, in the order it runs them: the embedding, main-model layers
// [first_layer, first_layer + num_layers), MTP modules [first_mtp, first_mtp + num_mtp), then
// the final norm, output head and loss.
struct PipelineChunk {
    bool embedding = false;
    int64_t first_layer = 0;
    int64_t num_layers = 0;
    int64_t first_mtp = 0;
    int64_t num_mtp = 0;
    bool loss = false;
};

// The chunks of `text` checked against the model: exactly num_chunks chunks, every main layer
// once and in order, exactly mtp_modules MTP modules (0 when MTP is not run or not simulated),
// in the last chunk, one E (first chunk) and one L (last chunk). A chunk runs its blocks in the
// order E, t, m, L, whatever order the string names them in. Throws moetron::UserError saying what
// does not fit.
std::vector<PipelineChunk> pipeline_chunks(const ModelConfig& model, std::string_view text,
                                           int64_t num_chunks, int64_t mtp_modules);

// The placement used when the user gives none: the blocks in model order (E, every layer, the
// MTP modules, L), the embedding and the head each counted as one layer (Megatron-LM's
// --account-for-embedding/loss-in-pipeline-split), cut into num_chunks contiguous runs whose
// sizes differ by at most one, except that the MTP modules stay in the last chunk with the head
// (they share it): that chunk grows and the ones before it shrink. So the first and last chunks
// get one layer fewer than the rest when the counts allow. Throws moetron::UserError when some
// chunk would hold no block (more chunks than blocks).
std::string default_pipeline_layout(const ModelConfig& model, int64_t num_chunks,
                                    int64_t mtp_modules);

}  // namespace moetron
