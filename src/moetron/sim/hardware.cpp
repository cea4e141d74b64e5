#include "moetron/sim/hardware.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/least_squares.h"
#include "moetron/core/user_error.h"

namespace moetron::sim {

namespace {

constexpr std::array<std::string_view, kNumMathRates> kMathRateKeys = {"tf32",  "bf16", "fp8",
                                                                       "mxfp8", "fp4",  "fp32"};

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    MT_USER_CHECK(in.good(), "[sim] cannot open cluster file '{}'", path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Rejects keys a table does not know, so a typo never silently falls back to a default.
void check_keys(const toml::table& table, std::string_view where,
                const std::vector<std::string_view>& known) {
    for (const auto& [key, value] : table) {
        bool ok = false;
        for (auto k : known) ok = ok || key.str() == k;
        std::string list;
        for (auto k : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
        MT_CHECK(ok, "[sim] {}: unknown key '{}' (known: {})", where, key.str(), list);
    }
}

const toml::table& need_table(const toml::table& t, std::string_view key, std::string_view where) {
    const toml::table* sub = t[key].as_table();
    MT_CHECK(sub != nullptr, "[sim] {}: missing table [{}]", where, key);
    return *sub;
}

double need_number(const toml::table& t, std::string_view key, std::string_view where) {
    auto v = t[key].value<double>();
    MT_CHECK(v.has_value(), "[sim] {}: missing number '{}'", where, key);
    MT_CHECK(std::isfinite(*v) && *v >= 0, "[sim] {}: '{}' must be a non-negative number, got {}",
             where, key, *v);
    return *v;
}

double need_fraction(const toml::table& t, std::string_view key, std::string_view where) {
    double v = need_number(t, key, where);
    MT_CHECK(v > 0 && v <= 1, "[sim] {}: '{}' is a fraction of peak in (0, 1], got {}", where, key,
             v);
    return v;
}

PerMathRate read_per_rate(const toml::table& t, std::string_view where, bool fractions) {
    PerMathRate out;
    for (const auto& [key, value] : t) {
        const MathRate rate = math_rate_from_key(key.str());
        auto v = value.value<double>();
        MT_CHECK(v.has_value() && *v > 0, "[sim] {}: '{}' must be a positive number", where,
                 key.str());
        MT_CHECK(!fractions || *v <= 1, "[sim] {}: '{}' is a fraction in (0, 1], got {}", where,
                 key.str(), *v);
        out.set(rate, *v);
    }
    return out;
}

// The keys a fabric file and a cluster's [scale_out] share, plus `extra`.
std::vector<std::string_view> fabric_keys(std::string_view extra) {
    return {extra,          "gbytes_per_s",    "latency_us", "in_network_reduction",
            "switch_radix", "spine_efficiency"};
}

// Reads the fabric keys present in `t` into `out`; with `complete`, bandwidth and latency must
// be there.
void read_scale_out(const toml::table& t, const std::string& where, ScaleOutSpec& out,
                    bool complete) {
    if (complete || t.contains("gbytes_per_s")) {
        out.bytes_per_s = need_number(t, "gbytes_per_s", where) * 1e9;
    }
    if (complete || t.contains("latency_us")) {
        out.latency_s = need_number(t, "latency_us", where) * 1e-6;
    }
    out.in_network_reduction = t["in_network_reduction"].value_or(out.in_network_reduction);
    if (t.contains("switch_radix")) {
        auto radix = t["switch_radix"].value<int64_t>();
        MT_CHECK(radix.has_value() && *radix >= 2, "[sim] {}: switch_radix must be >= 2", where);
        out.switch_radix = *radix;
    }
    if (t.contains("spine_efficiency")) {
        out.spine_efficiency = need_fraction(t, "spine_efficiency", where);
    }
}

std::vector<double> read_number_array(const toml::table& t, std::string_view key,
                                      std::string_view where) {
    std::vector<double> out;
    const toml::array* a = t[key].as_array();
    if (a == nullptr) {
        MT_CHECK(!t.contains(key), "[sim] {}: '{}' must be an array of numbers", where, key);
        return out;
    }
    for (const toml::node& item : *a) {
        auto v = item.value<double>();
        MT_CHECK(v.has_value() && std::isfinite(*v) && *v > 0,
                 "[sim] {}: '{}' must hold positive numbers", where, key);
        out.push_back(*v);
    }
    return out;
}

// The optional measured attention curve of a calibrated CPU: three arrays of one length, work
// strictly increasing, efficiencies fractions in (0, 1].
std::vector<AttentionEfficiencyPoint> read_attention_by_work(const toml::table& attn,
                                                             const std::string& where) {
    const auto work = read_number_array(attn, "work_per_query", where);
    const auto fwd = read_number_array(attn, "fwd_efficiency_at_work", where);
    const auto bwd = read_number_array(attn, "bwd_efficiency_at_work", where);
    MT_CHECK(work.size() == fwd.size() && work.size() == bwd.size(),
             "[sim] {}: work_per_query, fwd_efficiency_at_work and bwd_efficiency_at_work must "
             "have the same length ({}, {}, {})",
             where, work.size(), fwd.size(), bwd.size());
    std::vector<AttentionEfficiencyPoint> out;
    for (size_t i = 0; i < work.size(); ++i) {
        MT_CHECK(i == 0 || work[i] > work[i - 1],
                 "[sim] {}: work_per_query must be strictly increasing", where);
        MT_CHECK(fwd[i] <= 1 && bwd[i] <= 1,
                 "[sim] {}: attention efficiencies are fractions in "
                 "(0, 1]",
                 where);
        out.push_back({work[i], fwd[i], bwd[i]});
    }
    return out;
}

// The optional measured rate of a calibrated CPU's memory-bound kernels by size: two arrays of one
// length, bytes strictly increasing, efficiencies positive (above 1 where a call stays in cache).
std::vector<MemoryOpsEfficiencyPoint> read_memory_ops_by_bytes(const toml::table& mem,
                                                               const std::string& where) {
    const auto bytes = read_number_array(mem, "memory_ops_bytes", where);
    const auto eff = read_number_array(mem, "memory_ops_efficiency_at_bytes", where);
    MT_CHECK(bytes.size() == eff.size(),
             "[sim] {}: memory_ops_bytes and memory_ops_efficiency_at_bytes must have the same "
             "length ({}, {})",
             where, bytes.size(), eff.size());
    std::vector<MemoryOpsEfficiencyPoint> out;
    for (size_t i = 0; i < bytes.size(); ++i) {
        MT_CHECK(i == 0 || bytes[i] > bytes[i - 1],
                 "[sim] {}: memory_ops_bytes must be strictly increasing", where);
        out.push_back({bytes[i], eff[i]});
    }
    return out;
}

// Measured instead of gpu_speed_sigma (moetron calibrate): how far the slowest of `ranks` ranks
// ran behind their mean, as a fraction of it, one figure or one per block duration (increasing).
// The spread is what puts slowest_of_n there; over several durations, the least-squares line
// through log excess against log duration gives its exponent (clamped to [0, 1/2]), and the
// spread is that line's at the shortest block.
void read_slowest_rank_excess(const toml::table& t, const std::string& where, VariabilitySpec& v) {
    const int64_t ranks = t["slowest_rank_excess_ranks"].value_or(int64_t{0});
    std::vector<double> excess, block_s;
    if (const toml::array* a = t["slowest_rank_excess"].as_array()) {
        for (const toml::node& item : *a) excess.push_back(item.value_or(-1.0));
    } else if (t.contains("slowest_rank_excess")) {
        excess.push_back(t["slowest_rank_excess"].value_or(-1.0));
    }
    for (double ms : read_number_array(t, "slowest_rank_excess_block_ms", where)) {
        block_s.push_back(ms / 1e3);
    }
    bool valid = !t.contains("gpu_speed_sigma") && ranks >= 2 && !excess.empty() &&
                 (block_s.empty() || block_s.size() == excess.size());
    for (size_t i = 0; valid && i < excess.size(); ++i) {
        valid = excess[i] >= 0 && excess[i] < 1 &&
                (block_s.empty() || (block_s[i] > 0 && (i == 0 || block_s[i] > block_s[i - 1])));
    }
    MT_CHECK(valid,
             "[sim] {}: slowest_rank_excess (a fraction in [0, 1), or a list of them with "
             "slowest_rank_excess_block_ms, as many increasing durations) comes with "
             "slowest_rank_excess_ranks (at least 2) and replaces gpu_speed_sigma",
             where);
    if (block_s.size() < 2) {
        v.gpu_speed_sigma = excess.front() / slowest_of_n_sigmas(ranks);
        v.sigma_interval_s = block_s.empty() ? 0 : block_s.front();
        return;
    }
    // A block with no measured excess counts as a tenth of a percent (the log needs a number).
    std::vector<double> log_block_s, log_excess;
    for (size_t i = 0; i < excess.size(); ++i) {
        log_block_s.push_back(std::log(block_s[i]));
        log_excess.push_back(std::log(std::max(excess[i], 1e-3)));
    }
    const LineFit line = fit_line(log_block_s, log_excess);
    v.sigma_exponent = std::clamp(-line.slope, 0.0, 0.5);
    v.sigma_interval_s = block_s.front();
    // The line with the clamped slope through the points' mean.
    const double at_shortest =
        std::exp(line.mean_y - v.sigma_exponent * (log_block_s.front() - line.mean_x));
    v.gpu_speed_sigma = std::min(at_shortest, 0.99) / slowest_of_n_sigmas(ranks);
}

void read_variability(const toml::table& t, const std::string& where, VariabilitySpec& v) {
    check_keys(t, where,
               {"gpu_speed_sigma", "straggler_rate", "straggler_slowdown", "slowest_rank_excess",
                "slowest_rank_excess_block_ms", "slowest_rank_excess_ranks"});
    v.gpu_speed_sigma = t["gpu_speed_sigma"].value_or(v.gpu_speed_sigma);
    if (t.contains("slowest_rank_excess") || t.contains("slowest_rank_excess_ranks") ||
        t.contains("slowest_rank_excess_block_ms")) {
        read_slowest_rank_excess(t, where, v);
    }
    v.straggler_rate = t["straggler_rate"].value_or(v.straggler_rate);
    v.straggler_slowdown = t["straggler_slowdown"].value_or(v.straggler_slowdown);
    MT_CHECK(v.gpu_speed_sigma >= 0 && v.gpu_speed_sigma < 1 && v.straggler_rate >= 0 &&
                 v.straggler_rate <= 1 && v.straggler_slowdown >= 0,
             "[sim] {}: gpu_speed_sigma and straggler_rate are fractions in [0, 1), "
             "straggler_slowdown a non-negative fraction of the step",
             where);
}

EfficiencyParams efficiency_from_table(const toml::table& t, std::string_view where) {
    check_keys(t, where,
               {"arch", "gemm", "grouped_gemm", "attention", "memory", "kernel", "collectives",
                "variability"});
    EfficiencyParams e;
    auto arch = t["arch"].value<std::string>();
    MT_CHECK(arch.has_value(), "[sim] {}: missing 'arch' (e.g. \"hopper\")", where);
    e.arch = *arch;

    const auto& gemm = need_table(t, "gemm", where);
    check_keys(gemm, fmt::format("{} [gemm]", where),
               {"max_efficiency", "half_saturation_dim", "serial_below_flops", "threads"});
    const auto* maxe = gemm["max_efficiency"].as_table();
    MT_CHECK(maxe != nullptr, "[sim] {} [gemm]: missing max_efficiency = {{ bf16 = ..., ... }}",
             where);
    e.gemm_max = read_per_rate(*maxe, fmt::format("{} gemm.max_efficiency", where), true);
    e.gemm_half_dim = need_number(gemm, "half_saturation_dim", where);
    e.serial_gemm_below_flops = gemm["serial_below_flops"].value_or(0.0);
    e.threads = gemm["threads"].value_or(int64_t{1});
    MT_CHECK(e.serial_gemm_below_flops >= 0 && e.threads >= 1,
             "[sim] {} [gemm]: serial_below_flops must be >= 0 and threads >= 1", where);

    const auto& grouped = need_table(t, "grouped_gemm", where);
    check_keys(grouped, fmt::format("{} [grouped_gemm]", where),
               {"ratio_to_dense", "half_saturation_tokens_per_expert"});
    e.grouped_ratio = need_fraction(grouped, "ratio_to_dense", where);
    e.grouped_half_tokens = need_number(grouped, "half_saturation_tokens_per_expert", where);

    const auto& attn = need_table(t, "attention", where);
    check_keys(attn, fmt::format("{} [attention]", where),
               {"fwd_efficiency", "bwd_efficiency", "exp_efficiency", "work_per_query",
                "fwd_efficiency_at_work", "bwd_efficiency_at_work"});
    e.attention_fwd = need_fraction(attn, "fwd_efficiency", where);
    e.attention_bwd = need_fraction(attn, "bwd_efficiency", where);
    e.exp_efficiency = need_fraction(attn, "exp_efficiency", where);
    e.attention_by_work = read_attention_by_work(attn, fmt::format("{} [attention]", where));

    const auto& mem = need_table(t, "memory", where);
    check_keys(mem, fmt::format("{} [memory]", where),
               {"bandwidth_efficiency", "memory_ops_bandwidth_efficiency", "memory_ops_bytes",
                "memory_ops_efficiency_at_bytes"});
    e.memory_bw = need_fraction(mem, "bandwidth_efficiency", where);
    if (mem.contains("memory_ops_bandwidth_efficiency")) {
        e.memory_ops_bw = need_fraction(mem, "memory_ops_bandwidth_efficiency", where);
    }
    e.memory_ops_by_bytes = read_memory_ops_by_bytes(mem, fmt::format("{} [memory]", where));

    const auto& kern = need_table(t, "kernel", where);
    check_keys(kern, fmt::format("{} [kernel]", where),
               {"gpu_overhead_us", "host_overhead_us", "graph_launch_us"});
    e.kernel_gpu_overhead_s = need_number(kern, "gpu_overhead_us", where) * 1e-6;
    e.kernel_host_overhead_s = need_number(kern, "host_overhead_us", where) * 1e-6;
    e.graph_launch_s = need_number(kern, "graph_launch_us", where) * 1e-6;

    const auto& coll = need_table(t, "collectives", where);
    check_keys(coll, fmt::format("{} [collectives]", where),
               {"scale_up_bw_efficiency", "scale_out_bw_efficiency", "all_to_all_bw_efficiency",
                "reduce_scatter_bw_efficiency", "all_gather_bw_efficiency", "comm_sm_fraction"});
    e.scale_up_bw = need_fraction(coll, "scale_up_bw_efficiency", where);
    e.scale_out_bw = need_fraction(coll, "scale_out_bw_efficiency", where);
    e.all_to_all_bw = need_fraction(coll, "all_to_all_bw_efficiency", where);
    if (coll.contains("reduce_scatter_bw_efficiency"))
        e.reduce_scatter_bw = need_fraction(coll, "reduce_scatter_bw_efficiency", where);
    if (coll.contains("all_gather_bw_efficiency"))
        e.all_gather_bw = need_fraction(coll, "all_gather_bw_efficiency", where);
    e.comm_sm_fraction = need_number(coll, "comm_sm_fraction", where);
    MT_CHECK(e.comm_sm_fraction <= 1, "[sim] {}: comm_sm_fraction must be at most 1", where);
    if (const toml::table* var = t["variability"].as_table()) {
        read_variability(*var, fmt::format("{} [variability]", where), e.variability);
    }
    return e;
}

toml::table parse_toml(std::string_view text, std::string_view source_name) {
    try {
        return toml::parse(text, source_name);
    } catch (const toml::parse_error& err) {
        MT_THROW("[sim] {}: TOML syntax error at line {}: {}", source_name, err.source().begin.line,
                 err.description());
    }
}

}  // namespace

std::string_view math_rate_key(MathRate rate) {
    return kMathRateKeys[static_cast<int>(rate)];
}

MathRate math_rate_from_key(std::string_view key) {
    if (key == "nvfp4") return MathRate::fp4;
    for (int i = 0; i < kNumMathRates; ++i) {
        if (kMathRateKeys[i] == key) return static_cast<MathRate>(i);
    }
    MT_USER_THROW(
        "[sim] unknown number format '{}' in a cluster file (known: bf16, fp8, mxfp8, "
        "fp4, tf32, fp32)",
        key);
}

MathRate math_rate_of(Precision recipe) {
    switch (recipe) {
        case Precision::fp32:
            return MathRate::fp32;
        case Precision::bf16:
            return MathRate::bf16;
        case Precision::mxfp8:
            return MathRate::mxfp8;
        case Precision::fp8_blockwise:
            return MathRate::fp8;
        case Precision::nvfp4:
            return MathRate::fp4;
    }
    MT_THROW("[sim] unknown recipe {}", static_cast<int>(recipe));
}

double operand_bytes(MathRate rate) {
    switch (rate) {
        case MathRate::tf32:
        case MathRate::fp32:
            return 4;
        case MathRate::bf16:
            return 2;
        case MathRate::fp8:
        case MathRate::mxfp8:
            return 1;
        case MathRate::fp4:
            return 0.5;
    }
    return 2;
}

MathRate high_precision_rate(Precision recipe) {
    return recipe == Precision::fp32 ? MathRate::fp32 : MathRate::bf16;
}

double high_precision_bytes(Precision recipe) {
    return operand_bytes(high_precision_rate(recipe));
}

bool is_low_precision(Precision recipe) {
    switch (recipe) {
        case Precision::fp32:
        case Precision::bf16:
            return false;
        case Precision::mxfp8:
        case Precision::fp8_blockwise:
        case Precision::nvfp4:
            return true;
    }
    return false;
}

PerMathRate::PerMathRate() {
    values.fill(std::numeric_limits<double>::quiet_NaN());
}

bool PerMathRate::has(MathRate rate) const {
    return !std::isnan(values[static_cast<int>(rate)]);
}

double PerMathRate::at(MathRate rate) const {
    MT_CHECK(has(rate), "[sim] no value for rate class {}", math_rate_key(rate));
    return values[static_cast<int>(rate)];
}

double ClusterSpec::peak_flops(MathRate rate) const {
    MT_CHECK(gpu.peak_dense_tflops.has(rate),
             "[sim] {} ({}) has no {} tensor-core support; choose one of the rates its cluster "
             "file lists under peak_dense_tflops",
             gpu.name, name, math_rate_key(rate));
    return gpu.peak_dense_tflops.at(rate) * 1e12;
}

double ClusterSpec::recipe_peak_flops(Precision recipe) const {
    const MathRate rate = math_rate_of(recipe);
    if (!gpu.peak_dense_tflops.has(rate)) {
        std::string listed;
        for (int i = 0; i < kNumMathRates; ++i) {
            if (gpu.peak_dense_tflops.has(static_cast<MathRate>(i)))
                listed += fmt::format("{}{}", listed.empty() ? "" : ", ", kMathRateKeys[i]);
        }
        MT_USER_THROW(
            "[sim] --precision {} runs its GEMMs at the {} rate, which {} ({}) lacks: its cluster "
            "file lists peak_dense_tflops for {}",
            precision_name(recipe), math_rate_key(rate), gpu.name, name, listed);
    }
    return peak_flops(rate);
}

EfficiencyParams parse_efficiency_params(std::string_view text, std::string_view source_name) {
    toml::table t = parse_toml(text, source_name);
    return efficiency_from_table(t, source_name);
}

ClusterSpec parse_cluster_spec(std::string_view text, std::string_view source_name,
                               const std::string& efficiency_dir) {
    toml::table t = parse_toml(text, source_name);
    const std::string where(source_name);
    check_keys(t, where, {"name", "efficiency", "gpu", "scale_up", "scale_out", "variability"});
    ClusterSpec c;
    c.source = where;
    auto name = t["name"].value<std::string>();
    MT_CHECK(name.has_value(), "[sim] {}: missing 'name'", where);
    c.name = *name;

    const auto& gpu = need_table(t, "gpu", where);
    check_keys(gpu, where + " [gpu]",
               {"name", "peak_dense_tflops", "hbm_gib", "hbm_gbytes_per_s", "exp_per_s",
                "host_link_gbytes_per_s"});
    c.gpu.name = gpu["name"].value_or(std::string("gpu"));
    const auto* peaks = gpu["peak_dense_tflops"].as_table();
    MT_CHECK(peaks != nullptr, "[sim] {} [gpu]: missing peak_dense_tflops = {{ bf16 = ... }}",
             where);
    c.gpu.peak_dense_tflops = read_per_rate(*peaks, where + " peak_dense_tflops", false);
    MT_CHECK(c.gpu.peak_dense_tflops.has(MathRate::bf16),
             "[sim] {}: peak_dense_tflops needs at least bf16", where);
    c.gpu.hbm_bytes = need_number(gpu, "hbm_gib", where) * 1024.0 * 1024.0 * 1024.0;
    c.gpu.hbm_bytes_per_s = need_number(gpu, "hbm_gbytes_per_s", where) * 1e9;
    c.gpu.exp_per_s = need_number(gpu, "exp_per_s", where);
    MT_CHECK(c.gpu.hbm_bytes > 0 && c.gpu.hbm_bytes_per_s > 0 && c.gpu.exp_per_s > 0,
             "[sim] {}: GPU memory size, bandwidth and exp rate must be positive", where);
    c.gpu.host_link_bytes_per_s = gpu["host_link_gbytes_per_s"].value_or(0.0) * 1e9;
    MT_CHECK(c.gpu.host_link_bytes_per_s >= 0,
             "[sim] {}: host_link_gbytes_per_s must not be negative", where);

    const auto& up = need_table(t, "scale_up", where);
    check_keys(up, where + " [scale_up]",
               {"domain_gpus", "gbytes_per_s", "latency_us", "in_switch_reduction"});
    auto domain = up["domain_gpus"].value<int64_t>();
    MT_CHECK(domain.has_value() && *domain >= 1, "[sim] {}: scale_up.domain_gpus must be >= 1",
             where);
    c.scale_up.domain_gpus = *domain;
    c.scale_up.bytes_per_s = need_number(up, "gbytes_per_s", where) * 1e9;
    c.scale_up.latency_s = need_number(up, "latency_us", where) * 1e-6;
    c.scale_up.in_switch_reduction = up["in_switch_reduction"].value_or(false);

    const auto& out = need_table(t, "scale_out", where);
    check_keys(out, where + " [scale_out]", fabric_keys("fabric"));
    if (auto fabric = out["fabric"].value<std::string>()) {
        const std::string path =
            (std::filesystem::path(efficiency_dir).parent_path() / "fabrics" / (*fabric + ".toml"))
                .string();
        const toml::table ft = parse_toml(read_text_file(path), path);
        check_keys(ft, path, fabric_keys("name"));
        MT_CHECK(ft["name"].value_or(std::string()) == *fabric,
                 "[sim] {}: file says name = '{}', expected '{}'", path,
                 ft["name"].value_or(std::string()), *fabric);
        c.scale_out.fabric = *fabric;
        read_scale_out(ft, path, c.scale_out, true);
        read_scale_out(out, where + " [scale_out]", c.scale_out, false);
    } else {
        read_scale_out(out, where + " [scale_out]", c.scale_out, true);
    }
    MT_CHECK(c.scale_up.bytes_per_s > 0 && c.scale_out.bytes_per_s > 0,
             "[sim] {}: link bandwidths must be positive", where);

    const auto eff = t["efficiency"];
    if (const auto* inline_table = eff.as_table()) {
        c.efficiency = efficiency_from_table(*inline_table, where + " [efficiency]");
    } else if (auto arch = eff.value<std::string>()) {
        const std::string path =
            (std::filesystem::path(efficiency_dir) / (*arch + ".toml")).string();
        c.efficiency = parse_efficiency_params(read_text_file(path), path);
        MT_CHECK(c.efficiency.arch == *arch, "[sim] {}: file says arch = '{}', expected '{}'", path,
                 c.efficiency.arch, *arch);
    } else {
        MT_THROW(
            "[sim] {}: missing 'efficiency': name an architecture (efficiency = \"hopper\") or "
            "give an inline [efficiency] table",
            where);
    }
    if (const toml::table* var = t["variability"].as_table()) {
        read_variability(*var, where + " [variability]", c.efficiency.variability);
    }
    // Every rate the GPU offers needs a GEMM efficiency.
    for (int i = 0; i < kNumMathRates; ++i) {
        const auto rate = static_cast<MathRate>(i);
        MT_CHECK(!c.gpu.peak_dense_tflops.has(rate) || c.efficiency.gemm_max.has(rate),
                 "[sim] {}: efficiency set '{}' has no gemm.max_efficiency for {}", where,
                 c.efficiency.arch, math_rate_key(rate));
    }
    return c;
}

double slowest_of_n_sigmas(int64_t n) {
    return n > 1 ? std::sqrt(2 * std::log(static_cast<double>(n))) : 0.0;
}

double VariabilitySpec::sigma_over(double interval_s) const {
    if (sigma_interval_s <= 0 || interval_s <= sigma_interval_s) return gpu_speed_sigma;
    return gpu_speed_sigma * std::pow(interval_s / sigma_interval_s, -sigma_exponent);
}

SlowestOfN slowest_of_n(const VariabilitySpec& v, int64_t gpus, int64_t ep, double interval_s) {
    SlowestOfN s;
    if (gpus <= 1) return s;  // nobody to wait for
    const double sigma = v.sigma_over(interval_s);
    s.ep_jitter = sigma * slowest_of_n_sigmas(std::min(ep, gpus));
    s.dp_jitter = sigma * slowest_of_n_sigmas(gpus) - s.ep_jitter;
    s.stragglers =
        v.straggler_slowdown * (1 - std::pow(1 - v.straggler_rate, static_cast<double>(gpus)));
    return s;
}

ClusterSpec load_cluster_spec(const std::string& path) {
    const std::string dir = std::filesystem::path(path).parent_path().string();
    return parse_cluster_spec(read_text_file(path), path,
                              (std::filesystem::path(dir) / "efficiency").string());
}

}  // namespace moetron::sim
