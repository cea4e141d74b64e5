// moetron plan's progress while it searches (tens of seconds for a large model): layouts
// evaluated of the total and the best so far, on stderr, so that stdout holds the plan alone.
// On a terminal one line is redrawn in place; otherwise (a pipe, a log file) a line every
// line_every_s, so that a log shows the search is alive. Both end with a line saying how many
// layouts were evaluated in how long.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "moetron/sim/planner.h"

namespace moetron::cli {

class PlanProgressPrinter {
  public:
    // terminal_columns: the terminal's width, which a redrawn line must not reach (a line that
    // wraps leaves its first rows behind); 0 off a terminal.
    PlanProgressPrinter(std::FILE* out, size_t terminal_columns, double line_every_s = 5.0);

    // elapsed_s: since the search began (the caller's clock, so that tests choose it).
    void update(const sim::PlanProgress& progress, double elapsed_s);
    void finish(double elapsed_s);

  private:
    void write(const std::string& text);

    std::FILE* out_;
    size_t terminal_columns_;
    double line_every_s_;
    double last_line_s_ = 0;  // when the last line was written
    bool line_open_ = false;  // a terminal line without its newline
    int64_t evaluated_ = 0;
};

}  // namespace moetron::cli
