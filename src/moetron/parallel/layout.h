// The parallel layout of a job as the user writes it: "--layout tp2.ep4". Tokens are a dimension
// name and a positive size, joined by dots, in any order: tp (tensor), ep (expert), pp (pipeline),
// cp (context), dp (data). A dimension left out is 1, except dp, which is left to be what remains
// of the world (topology.h resolves it and checks everything against the world and the model).
// An explicit dp counts the replicas of either side of parallel folding: "dp2.tp2" is 4 ranks
// (attention dp2 x tp2), "dp2.ep2" is 4 ranks too (experts edp2 x ep2, attention dp4).
#pragma once

#include <string>
#include <string_view>

namespace moetron::parallel {

struct Layout {
    int tp = 1;
    int ep = 1;
    int pp = 1;
    int cp = 1;
    int dp = 0;  // 0: what remains of the world; else checked against it (see above)

    // "tp2.ep4.pp1.cp1.dp2" (dp omitted while unresolved).
    std::string str() const;
};

// Throws moetron::Error naming the offending token for an unknown dimension, a repeated one, a
// missing or non-positive size. The empty string is the all-data-parallel layout.
Layout parse_layout(std::string_view text);

}  // namespace moetron::parallel
