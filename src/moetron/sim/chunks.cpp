#include "moetron/sim/chunks.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/model/pipeline_layout.h"

namespace moetron::sim {

std::vector<std::vector<ChunkBlock>> partition_items(const std::vector<ChunkBlock>& items,
                                                     int64_t parts) {
    MT_CHECK(static_cast<int64_t>(items.size()) >= parts, "[sim] {} model chunks for {} blocks",
             parts, items.size());
    double lo = 0, hi = 0;
    for (const auto& it : items) {
        lo = std::max(lo, it.cost_s);
        hi += it.cost_s;
    }
    auto groups_needed = [&](double cap) {
        int64_t n = 1;
        double acc = 0;
        for (const auto& it : items) {
            if (acc + it.cost_s > cap && acc > 0) {
                ++n;
                acc = 0;
            }
            acc += it.cost_s;
        }
        return n;
    };
    for (int iter = 0; iter < 60; ++iter) {
        const double mid = 0.5 * (lo + hi);
        (groups_needed(mid) <= parts ? hi : lo) = mid;
    }
    std::vector<std::vector<ChunkBlock>> out(1);
    double acc = 0;
    for (const auto& it : items) {
        if (acc + it.cost_s > hi * (1 + 1e-12) && acc > 0) {
            out.emplace_back();
            acc = 0;
        }
        out.back().push_back(it);
        acc += it.cost_s;
    }
    // Fewer groups than parts: split the costliest multi-item group at its balance point.
    while (static_cast<int64_t>(out.size()) < parts) {
        size_t best = out.size();
        double best_cost = -1;
        for (size_t g = 0; g < out.size(); ++g) {
            if (out[g].size() < 2) continue;
            double cost = 0;
            for (const auto& it : out[g]) cost += it.cost_s;
            if (cost > best_cost) {
                best_cost = cost;
                best = g;
            }
        }
        MT_CHECK(best < out.size(), "[sim] internal error: cannot split model chunks");
        size_t cut = 1;
        double left = out[best][0].cost_s;
        while (cut + 1 < out[best].size() && left + out[best][cut].cost_s <= best_cost / 2) {
            left += out[best][cut].cost_s;
            ++cut;
        }
        std::vector<ChunkBlock> tail(out[best].begin() + static_cast<long>(cut), out[best].end());
        out[best].resize(cut);
        out.insert(out.begin() + static_cast<long>(best) + 1, std::move(tail));
    }
    return out;
}

void balance_stages(std::vector<std::vector<ChunkBlock>>& chunks, int64_t pp) {
    auto stage_max = [&]() {
        std::vector<double> sum(pp, 0);
        for (size_t g = 0; g < chunks.size(); ++g) {
            for (const auto& it : chunks[g]) sum[g % pp] += it.cost_s;
        }
        return *std::max_element(sum.begin(), sum.end());
    };
    double best = stage_max();
    for (int pass = 0; pass < 200; ++pass) {
        bool improved = false;
        for (size_t g = 0; g + 1 < chunks.size(); ++g) {
            // Move the last block of chunk g to the front of g+1, or the reverse.
            for (int dir = 0; dir < 2; ++dir) {
                auto& from = dir == 0 ? chunks[g] : chunks[g + 1];
                auto& to = dir == 0 ? chunks[g + 1] : chunks[g];
                if (from.size() < 2) continue;
                if (dir == 0) {
                    to.insert(to.begin(), from.back());
                    from.pop_back();
                } else {
                    to.push_back(from.front());
                    from.erase(from.begin());
                }
                const double now = stage_max();
                if (now < best - 1e-12) {
                    best = now;
                    improved = true;
                } else if (dir == 0) {
                    from.push_back(to.front());
                    to.erase(to.begin());
                } else {
                    from.insert(from.begin(), to.back());
                    to.pop_back();
                }
            }
        }
        if (!improved) break;
    }
}

std::vector<std::vector<ChunkBlock>> layout_items(const ModelConfig& model, const std::string& text,
                                                  int64_t chunks, bool with_mtp,
                                                  const std::map<BlockKind, double>& cost) {
    const int64_t mtp_modules = with_mtp ? model.num_nextn_predict_layers : 0;
    const std::vector<PipelineChunk> placed = pipeline_chunks(model, text, chunks, mtp_modules);
    std::vector<std::vector<ChunkBlock>> out(placed.size());
    for (size_t g = 0; g < placed.size(); ++g) {
        const PipelineChunk& chunk = placed[g];
        if (chunk.embedding)
            out[g].push_back({BlockKind::embedding, -1, cost.at(BlockKind::embedding)});
        for (int64_t layer = chunk.first_layer; layer < chunk.first_layer + chunk.num_layers;
             ++layer) {
            const BlockKind k =
                model.is_moe_layer(layer) ? BlockKind::moe_layer : BlockKind::dense_layer;
            out[g].push_back({k, static_cast<int>(layer), cost.at(k)});
        }
        for (int64_t mtp = chunk.first_mtp; mtp < chunk.first_mtp + chunk.num_mtp; ++mtp) {
            const BlockKind k = model.mtp_layer_is_moe(mtp) && model.n_routed_experts > 0
                                    ? BlockKind::moe_layer
                                    : BlockKind::dense_layer;
            out[g].push_back({BlockKind::mtp_extra, -1, cost.at(BlockKind::mtp_extra)});
            out[g].push_back({k, -1, cost.at(k)});
        }
        if (chunk.loss)
            out[g].push_back({BlockKind::output_head, -1, cost.at(BlockKind::output_head)});
    }
    return out;
}

}  // namespace moetron::sim
