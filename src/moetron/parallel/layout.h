// The parallel layout of a job as the user writes it, for the engine ("moetron train --layout
// tp2.ep4") and the cluster model ("moetron simulate --layout tp1.pp2.vpp4.ep32") alike. Tokens
// are a dimension name and a positive size, joined by dots, in any order: tp (tensor), pp
// (pipeline), vpp (virtual pipeline stages per pipeline rank), ep (expert), cp (context), dp
// (data). A dimension left out is 1, except dp, which is left to be what remains of the world.
//
// dp means what Megatron-LM's data-parallel size and the published recipes mean: the replicas of
// the attention part, world = tp * cp * dp * pp. The experts fold the same ranks independently
// (Megatron-Core's parallel folding, expert TP = 1): ep ranks per expert group, edp = world /
// (ep * pp) replicas of it. So on 4 ranks "ep2" is dp4 with edp2; "dp2.ep2" is an error that says
// to write dp4.ep2 (or leave dp out): the expert side's replica count follows from ep.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace moetron::parallel {

struct Layout {
    int64_t tp = 1;   // tensor parallel (with sequence parallel)
    int64_t pp = 1;   // pipeline stages
    int64_t vpp = 1;  // virtual stages (model chunks) per pipeline stage
    int64_t ep = 1;   // expert parallel
    int64_t cp = 1;   // context parallel
    int64_t dp = 0;   // attention data parallel; 0 until resolve_layout derives it from the world

    // Ranks of the resolved layout: tp * cp * dp * pp.
    int64_t world_size() const { return tp * cp * dp * pp; }
    // Replicas of an expert group: world / (ep * pp); 0 while dp is unresolved.
    int64_t edp() const { return dp > 0 ? world_size() / (ep * pp) : 0; }
    // "tp1.pp2.vpp4.ep32.cp1.dp128" (dp omitted while unresolved): the one spelling of a layout
    // that every command prints and a checkpoint records, in the grammar parse_layout reads.
    std::string str() const;
};

// Reads the syntax only. Throws moetron::UserError naming the offending token for an unknown
// dimension, a repeated one, a missing or non-positive size. The empty string is the
// all-data-parallel layout.
Layout parse_layout(std::string_view text);

// Derives dp from the world and checks that the sizes divide it: tp*cp*pp and ep*pp divide the
// world, an explicit dp equals world / (tp*cp*pp), vpp > 1 only with pp > 1. Throws
// moetron::UserError saying which number is wrong and what to write instead.
Layout resolve_layout(const Layout& layout, int64_t world_size);

// Both: the layout `text` resolved against `world_size` ranks (or GPUs).
Layout parse_layout(std::string_view text, int64_t world_size);

}  // namespace moetron::parallel
