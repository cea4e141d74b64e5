#include "moetron/sim/expert_imbalance.h"

#include <cmath>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moetron/core/user_error.h"

namespace moetron::sim {

std::vector<double> expert_loads_from_jsonl(const std::string& path) {
    std::ifstream in(path);
    MT_USER_CHECK(in.good(), "cannot read the expert load log '{}'", path);
    std::vector<double> loads;
    std::string line;
    while (std::getline(in, line)) {
        if (line.find("\"average_expert_load\"") == std::string::npos) continue;
        const nlohmann::json record =
            nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (record.is_object() && record.contains("average_expert_load"))
            loads = record.at("average_expert_load").get<std::vector<double>>();
    }
    MT_USER_CHECK(!loads.empty(),
                  "'{}' holds no \"average_expert_load\": log a run with --redundant-experts R "
                  "--rebalance-every N --log-jsonl",
                  path);
    return loads;
}

std::vector<double> zipf_expert_loads(int64_t experts, double exponent) {
    MT_USER_CHECK(experts >= 1 && exponent >= 0 && std::isfinite(exponent),
                  "a Zipf expert load needs experts >= 1 and an exponent >= 0 (got {} and {})",
                  experts, exponent);
    std::vector<double> loads(static_cast<size_t>(experts));
    double sum = 0;
    for (int64_t i = 0; i < experts; ++i)
        sum += loads[static_cast<size_t>(i)] = std::pow(static_cast<double>(i + 1), -exponent);
    for (double& l : loads) l *= static_cast<double>(experts) / sum;
    return loads;
}

std::vector<double> expert_loads_from_spec(const std::string& spec, int64_t experts) {
    const std::string zipf = "zipf:";
    if (spec.rfind(zipf, 0) != 0) return expert_loads_from_jsonl(spec);
    const std::string exponent_text = spec.substr(zipf.size());
    size_t used = 0;
    double exponent = -1;
    try {
        exponent = std::stod(exponent_text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    MT_USER_CHECK(used > 0 && used == exponent_text.size(),
                  "--expert-imbalance '{}': expected zipf:S with a number S >= 0 (such as "
                  "zipf:1.0) or a --log-jsonl file",
                  spec);
    MT_USER_CHECK(experts >= 1, "--expert-imbalance '{}': the model has no routed experts", spec);
    return zipf_expert_loads(experts, exponent);
}

ExpertImbalance expert_rank_imbalance(std::span<const double> loads,
                                      const parallel::PlacementShape& shape) {
    parallel::PlacementShape contiguous = shape;
    contiguous.num_slots = shape.num_experts;
    ExpertImbalance r;
    r.contiguous = parallel::rank_imbalance(parallel::initial_placement(contiguous), loads);
    r.redundant = parallel::rank_imbalance(parallel::balanced_placement(loads, shape), loads);
    return r;
}

}  // namespace moetron::sim
