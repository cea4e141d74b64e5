#include "moetron/sim/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "moetron/core/error.h"

namespace moetron::sim {

namespace {

constexpr double kWidth = 1200, kLeft = 110, kRight = 20, kLane = 22;

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<')
            out += "&lt;";
        else if (c == '>')
            out += "&gt;";
        else if (c == '&')
            out += "&amp;";
        else
            out += c;
    }
    return out;
}

std::string rect(double x, double y, double w, double h, const char* fill,
                 const std::string& title) {
    return fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\">"
        "<title>{}</title></rect>\n",
        x, y, std::max(w, 0.3), h, fill, escape(title));
}

std::string text(double x, double y, const std::string& s, int size = 12,
                 const char* anchor = "start") {
    return fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-family=\"sans-serif\" font-size=\"{}\" "
        "text-anchor=\"{}\">{}</text>\n",
        x, y, size, anchor, escape(s));
}

// Text read bottom to top (a y-axis title), centred on (x, y).
std::string vertical_text(double x, double y, const std::string& s, int size) {
    return fmt::format(
        "<text x=\"{0:.1f}\" y=\"{1:.1f}\" transform=\"rotate(-90 {0:.1f} {1:.1f})\" "
        "font-family=\"sans-serif\" font-size=\"{2}\" text-anchor=\"middle\">{3}</text>\n",
        x, y, size, escape(s));
}

const char* op_color(OpKind k, bool recompute) {
    if (recompute) return "#b0b0b0";
    switch (k) {
        case OpKind::gemm:
            return "#4e79a7";
        case OpKind::grouped_gemm:
            return "#2e5984";
        case OpKind::attention:
            return "#59a14f";
        case OpKind::memory:
        case OpKind::copy:
            return "#edc948";
        case OpKind::comm_tp:
            return "#f28e2b";
        case OpKind::comm_ep:
            return "#e15759";
        case OpKind::comm_cp:
            return "#ff9da7";
        case OpKind::sync:
            return "#000000";
    }
    return "#999999";
}

std::string ops_lane(const std::vector<OpEvent>& events, double y, double scale,
                     const std::string& label) {
    std::string s = text(8, y + 15, label, 11);
    for (const OpEvent& e : events) {
        s += rect(kLeft + e.start_s * scale, y, (e.end_s - e.start_s) * scale, kLane,
                  op_color(e.kind, e.recompute),
                  fmt::format("{} {:.3f} ms", e.name, (e.end_s - e.start_s) * 1e3));
    }
    return s;
}

// Thin white lines at the layer (block) boundaries inside a forward or backward task, placed
// by the blocks' share of the chunk's time.
std::string layer_ticks(const StepResult& r, const ScheduledTask& t, double y, double scale) {
    if (t.kind == TaskKind::forward_backward || t.kind == TaskKind::weight_gradient) return "";
    const bool fwd = t.kind == TaskKind::forward;
    const auto& blocks = r.chunk_block_times.at(static_cast<size_t>(fwd ? t.chunk_f : t.chunk_b));
    double total = 0;
    for (const auto& [f, b] : blocks) total += fwd ? f : b;
    if (total <= 0 || blocks.size() < 2) return "";
    std::string s;
    double acc = 0;
    for (size_t i = 0; i + 1 < blocks.size(); ++i) {
        // Backward runs the blocks in reverse.
        const auto& blk = fwd ? blocks[i] : blocks[blocks.size() - 1 - i];
        acc += fwd ? blk.first : blk.second;
        const double x = kLeft + (t.start_s + (t.end_s - t.start_s) * acc / total) * scale;
        s += fmt::format(
            "<line x1=\"{0:.2f}\" y1=\"{1:.1f}\" x2=\"{0:.2f}\" y2=\"{2:.1f}\" "
            "stroke=\"white\" stroke-width=\"0.3\"/>\n",
            x, y, y + kLane);
    }
    return s;
}

}  // namespace

std::string step_timeline_svg(const StepResult& r) {
    const int64_t pp = r.layout.pp;
    const double plot = kWidth - kLeft - kRight;
    const double scale = plot / r.step_time_s;
    const double lanes_h = static_cast<double>(pp) * (kLane + 6);
    const double height = 90 + lanes_h + 150;
    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
        "viewBox=\"0 0 {:.0f} {:.0f}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        kWidth, height, kWidth, height);
    s += text(10, 20,
              fmt::format("{} on {} x {}, {}: step {:.3f} s, {:.0f} TFLOPs/GPU", r.model_name,
                          r.gpus, r.cluster_name, r.layout.str(), r.step_time_s, r.tflops_per_gpu),
              14);
    s += text(10, 38,
              "forward (blue) | backward (green) | combined 1F1B (purple) | grad sync (orange) "
              "| optimizer (grey) | idle: white",
              11);
    double y = 50;
    for (int64_t st = 0; st < pp; ++st) {
        s += text(8, y + 15, fmt::format("stage {}", st), 11);
        for (const ScheduledTask& t : r.schedule.stages[st]) {
            const char* fill = t.kind == TaskKind::forward           ? "#6b9bd1"
                               : t.kind == TaskKind::backward        ? "#69b36b"
                               : t.kind == TaskKind::weight_gradient ? "#a6d8a0"
                                                                     : "#9c6ade";
            const std::string what = t.kind == TaskKind::forward
                                         ? fmt::format("F chunk {} mb {}", t.chunk_f, t.micro_f)
                                     : t.kind == TaskKind::backward
                                         ? fmt::format("B chunk {} mb {}", t.chunk_b, t.micro_b)
                                     : t.kind == TaskKind::weight_gradient
                                         ? fmt::format("W chunk {} mb {}", t.chunk_b, t.micro_b)
                                         : fmt::format("F chunk {} mb {} + B chunk {} mb {}",
                                                       t.chunk_f, t.micro_f, t.chunk_b, t.micro_b);
            s += rect(kLeft + t.start_s * scale, y, (t.end_s - t.start_s) * scale, kLane, fill,
                      fmt::format("{}: {:.2f} ms", what, (t.end_s - t.start_s) * 1e3));
            s += layer_ticks(r, t, y, scale);
        }
        const double end = r.schedule.end_s[st];
        s += rect(kLeft + end * scale, y, (r.dp_end_s - end) * scale, kLane, "#f28e2b",
                  "gradient reduce-scatter tail");
        s += rect(kLeft + r.dp_end_s * scale, y, (r.optimizer_end_s - r.dp_end_s) * scale, kLane,
                  "#9d9d9d", "optimizer");
        s += rect(kLeft + r.optimizer_end_s * scale, y, (r.step_time_s - r.optimizer_end_s) * scale,
                  kLane, "#f28e2b", "parameter all-gather (exposed part)");
        y += kLane + 6;
    }
    // Time axis.
    for (int i = 0; i <= 10; ++i) {
        const double x = kLeft + plot * i / 10;
        s += fmt::format(
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
            "stroke=\"#888\" stroke-width=\"0.5\"/>\n",
            x, y, x, y + 4);
        s += text(x, y + 16, fmt::format("{:.2f} s", r.step_time_s * i / 10), 10, "middle");
    }
    // One layer, forward and backward, on its own scale.
    y += 40;
    double layer_s = 0;
    if (!r.moe_layer_forward.empty()) layer_s += r.moe_layer_forward.back().end_s;
    if (!r.moe_layer_backward.empty())
        layer_s = std::max(layer_s, r.moe_layer_backward.back().end_s);
    if (layer_s > 0) {
        const double ls = plot / layer_s;
        s += text(10, y - 8,
                  fmt::format("one layer, one micro-batch ({:.2f} ms full width): GEMM blue, "
                              "attention green, memory-bound yellow, TP orange, EP red, "
                              "recompute grey",
                              layer_s * 1e3),
                  11);
        s += ops_lane(r.moe_layer_forward, y, ls, "layer fwd");
        s += ops_lane(r.moe_layer_backward, y + kLane + 6, ls, "layer bwd");
    }
    s += "</svg>\n";
    return s;
}

std::string scaling_svg(const std::vector<ScalingPoint>& points, const std::string& title) {
    MT_CHECK(!points.empty(), "[sim] nothing to draw in the scaling chart");
    const double w = 640, h = 400, left = 70, right = 20, top = 50, bottom = 60;
    const double pw = w - left - right, ph = h - top - bottom;
    double max_tf = 0;
    for (const auto& p : points) max_tf = std::max(max_tf, p.tflops_per_gpu);
    max_tf *= 1.15;
    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
        "viewBox=\"0 0 {:.0f} {:.0f}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        w, h, w, h);
    s += text(w / 2, 24, title, 14, "middle");
    const double n = static_cast<double>(points.size());
    const double bar = pw / n * 0.6;
    for (size_t i = 0; i < points.size(); ++i) {
        const auto& p = points[i];
        const double x = left + pw * (static_cast<double>(i) + 0.5) / n;
        const double bh = ph * p.tflops_per_gpu / max_tf;
        s += rect(x - bar / 2, top + ph - bh, bar, bh, "#4e79a7",
                  fmt::format("{} GPUs: {:.1f} TFLOPs/GPU", p.gpus, p.tflops_per_gpu));
        s += text(x, top + ph - bh - 6,
                  fmt::format("{:.0f} ({:.1f}%)", p.tflops_per_gpu, 100 * p.efficiency), 11,
                  "middle");
        s += text(x, top + ph + 18, fmt::format("{} GPUs", p.gpus), 11, "middle");
    }
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"black\"/>\n",
        left, top, top + ph);
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" "
        "stroke=\"black\"/>\n",
        left, top + ph, left + pw);
    for (int i = 0; i <= 4; ++i) {
        const double v = max_tf * i / 4;
        const double yy = top + ph - ph * i / 4;
        s += text(left - 6, yy + 4, fmt::format("{:.0f}", v), 10, "end");
    }
    // Rotated, left of the tick labels (which end at left - 6): a horizontal title was wider
    // than the margin, clipped at the edge and drawn over the labels.
    s += vertical_text(20, top + ph / 2, "TFLOPs/GPU", 11);
    s += text(w / 2, h - 16, "weak scaling: global batch grows with the GPU count", 11, "middle");
    s += "</svg>\n";
    return s;
}

void write_text_file(const std::string& path, const std::string& content) {
    std::ofstream out(path, std::ios::binary);
    MT_CHECK(out.good(), "[sim] cannot write '{}'", path);
    out << content;
    MT_CHECK(out.good(), "[sim] failed writing '{}'", path);
}

}  // namespace moetron::sim
