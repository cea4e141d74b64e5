#include "moetron/cli/plan_progress.h"

#include <fmt/format.h>

namespace moetron::cli {

namespace {

// A terminal redraws at most this often: faster is flicker, not information.
constexpr double kRedrawEveryS = 0.1;

}  // namespace

PlanProgressPrinter::PlanProgressPrinter(std::FILE* out, size_t terminal_columns,
                                         double line_every_s)
    : out_(out),
      terminal_columns_(terminal_columns),
      line_every_s_(terminal_columns > 0 ? kRedrawEveryS : line_every_s) {}

void PlanProgressPrinter::write(const std::string& text) {
    // Progress is advice: a closed or full stderr must not stop the search, so write errors are
    // not checked here (the plan itself goes to stdout, whose writes the command checks).
    std::fputs(text.c_str(), out_);
    std::fflush(out_);
}

void PlanProgressPrinter::update(const sim::PlanProgress& p, double elapsed_s) {
    evaluated_ = p.evaluated;
    if (elapsed_s - last_line_s_ < line_every_s_) return;
    last_line_s_ = elapsed_s;
    std::string line = fmt::format(
        "plan: {}/{} layouts ({:.0f}%) in {:.0f} s", p.evaluated, p.total,
        p.total > 0 ? 100.0 * static_cast<double>(p.evaluated) / static_cast<double>(p.total) : 0.0,
        elapsed_s);
    // The figure before the layout: a line cut to the terminal's width loses the layout's tail.
    if (p.best != nullptr)
        line += fmt::format("; best {:.1f} TFLOPs/GPU: {} mbs{}", p.best->result.tflops_per_gpu,
                            p.best->result.layout.str(), p.best->result.options.micro_batch);
    if (terminal_columns_ > 0) {
        if (line.size() >= terminal_columns_) line.resize(terminal_columns_ - 1);
        write("\r\x1b[K" + line);
        line_open_ = true;
    } else {
        write(line + "\n");
    }
}

void PlanProgressPrinter::finish(double elapsed_s) {
    write(fmt::format("{}plan: evaluated {} layouts in {:.1f} s\n", line_open_ ? "\r\x1b[K" : "",
                      evaluated_, elapsed_s));
    line_open_ = false;
}

}  // namespace moetron::cli
