#include "moetron/train/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/kernels/backend.h"

namespace moetron {

namespace {

// The fixed members of a JSONL line (about 40 numbers and keys) take under 2 KiB; each list entry
// at most kListEntryBytes ("," and a number of up to 7 significant digits with sign and exponent).
constexpr size_t kFixedLineBytes = 4096;
constexpr size_t kListEntryBytes = 16;

// Appends formatted text to a fixed buffer; text past its end is cut (and counted), never
// allocated.
class LineWriter {
  public:
    LineWriter(char* data, size_t capacity) : data_(data), capacity_(capacity) {}

    template <class... Args>
    void add(fmt::format_string<Args...> format, Args&&... args) {
        const size_t room = capacity_ - size_;
        const auto result =
            fmt::format_to_n(data_ + size_, room, format, std::forward<Args>(args)...);
        size_ += std::min(result.size, room);
        cut_ = cut_ || result.size > room;
    }
    // A JSON member "key":value; JSON has no NaN or infinity, so those become null.
    void json_number(const char* key, double value) {
        if (std::isfinite(value)) {
            add(",\"{}\":{:.7g}", key, value);
        } else {
            add(",\"{}\":null", key);
        }
    }
    size_t size() const { return size_; }
    bool cut() const { return cut_; }

  private:
    char* data_;
    size_t capacity_;
    size_t size_ = 0;
    bool cut_ = false;
};

// The time left, as a person reads it: 45s, 12m05s, 3h02m.
void add_duration(LineWriter& w, double seconds) {
    const auto s = static_cast<int64_t>(std::llround(std::clamp(seconds, 0.0, 1e9)));
    if (s < 60) {
        w.add("{}s", s);
    } else if (s < 3600) {
        w.add("{}m{:02}s", s / 60, s % 60);
    } else {
        w.add("{}h{:02}m", s / 3600, s % 3600 / 60);
    }
}

}  // namespace

double measure_gemm_peak_gflops(int64_t n, double seconds) {
    MT_CHECK(n > 0 && seconds > 0, "[metrics] GEMM peak needs n > 0 and seconds > 0");
    const auto count = static_cast<size_t>(n * n);
    std::vector<float> a(count, 0.5f), b(count, 0.25f), c(count, 0.0f);
    cpu_backend().matmul(c.data(), a.data(), b.data(), n, n, n, false, false, 0.0f,
                         kFp32Gemm);  // warm-up: threads, caches
    const double flops =
        2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    double best_s = 1e30;
    Timer total;
    int runs = 0;
    while (runs < 3 || total.elapsed_s() < seconds) {
        Timer t;
        cpu_backend().matmul(c.data(), a.data(), b.data(), n, n, n, false, false, 0.0f, kFp32Gemm);
        best_s = std::min(best_s, t.elapsed_s());
        ++runs;
    }
    return flops / best_s / 1e9;
}

MetricsLog::MetricsLog(int64_t total_steps, int64_t print_every, const std::string& jsonl_path,
                       bool terminal, std::FILE* out, int64_t longest_list)
    : total_steps_(total_steps),
      print_every_(std::max<int64_t>(1, print_every)),
      terminal_(terminal),
      out_(out),
      jsonl_path_(jsonl_path),
      longest_list_(std::max<int64_t>(0, longest_list)),
      // Two lists per line at most (the stages' busy and idle times, or one of expert loads).
      line_(kFixedLineBytes + 2 * kListEntryBytes * static_cast<size_t>(longest_list_)) {
    if (!jsonl_path.empty()) {
        jsonl_ = std::fopen(jsonl_path.c_str(), "w");
        MT_CHECK(jsonl_ != nullptr, "[metrics] cannot create the JSONL log '{}': {}", jsonl_path,
                 detail::errno_message());
    }
}

MetricsLog::~MetricsLog() {
    if (jsonl_) std::fclose(jsonl_);  // finish() reports errors; a destructor must not throw
}

void MetricsLog::write_out(const char* text, size_t size) {
    MT_CHECK(std::fwrite(text, 1, size, out_) == size, "[metrics] writing the log failed: {}",
             detail::errno_message());
}

void MetricsLog::log_step(const StepRecord& r) {
    compute_s_ += r.step_s;
    ++steps_logged_;
    // The mean step so far times the steps left (validation and logging not counted).
    const double eta_s = compute_s_ / static_cast<double>(steps_logged_) *
                         static_cast<double>(std::max<int64_t>(0, total_steps_ - r.step));
    const bool validated = !std::isnan(r.val_loss);
    const bool plain_line =
        validated || r.step == 1 || r.step == total_steps_ || r.step % print_every_ == 0;
    if (plain_line && (!terminal_ || validated)) {
        LineWriter w(line_.data(), line_.size());
        if (terminal_ && bar_open_) w.add("\r\x1b[K");
        w.add("step {:>{}}/{} | loss {:.4f}", r.step, fmt::formatted_size("{}", total_steps_),
              total_steps_, r.loss);
        if (validated) w.add(" | val {:.4f}", r.val_loss);
        if (r.mtp_loss != 0) w.add(" | mtp {:.4f}", r.mtp_loss);
        w.add(" | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s | {:.3f} TFLOP/s", r.lr, r.grad_norm,
              r.tokens_per_s, r.model_tflops);
        if (r.mfu > 0) w.add(" | MFU {:.1f}%", 100 * r.mfu);
        if (r.expert_load_max_over_mean > 0)
            w.add(" | load max/mean {:.2f} min/mean {:.2f}", r.expert_load_max_over_mean,
                  r.expert_load_min_over_mean);
        if (r.rank_load_max_over_mean > 0)
            w.add(" | ranks max/mean {:.2f}", r.rank_load_max_over_mean);
        if (r.rebalanced)
            w.add(" | rebalanced: {:.0f} slots moved in {:.1f} ms, ranks {:.2f} -> {:.2f}",
                  r.rebalance_migrated_slots, r.rebalance_migration_s * 1e3, r.rebalance_before,
                  r.rebalance_after);
        if (r.moe_extra_rounds > 0)
            w.add(" | MoE over capacity: {} layers, {} extra rounds", r.moe_overflowed_layers,
                  r.moe_extra_rounds);
        if (r.expert_comm_s + r.tp_comm_s + r.dp_comm_s > 0)
            w.add(" | compute {:.1f} ms, waiting on a2a {:.1f} tp {:.1f} dp {:.1f} ms",
                  r.compute_only_s * 1e3, r.expert_comm_s * 1e3, r.tp_comm_s * 1e3,
                  r.dp_comm_s * 1e3);
        if (!r.stage_busy_s.empty()) {
            w.add(" | pp busy");
            for (double s : r.stage_busy_s) w.add(" {:.1f}", s * 1e3);
            w.add(" idle");
            for (double s : r.stage_idle_s) w.add(" {:.1f}", s * 1e3);
            w.add(" ms (bubble {:.0f}%)", 100 * r.bubble_fraction());
        }
        w.add(" | {:.1f} ms", r.step_s * 1e3);
        // A log read while the run goes on (mpirun, a pipe, a file) needs the time left as much
        // as the bar does.
        if (r.step < total_steps_) {
            w.add(" | eta ");
            add_duration(w, eta_s);
        }
        w.add("\n");
        write_out(line_.data(), w.size());
        bar_open_ = false;
    }
    if (terminal_) {
        constexpr int kBarWidth = 24;
        const int filled =
            static_cast<int>(kBarWidth * r.step / std::max<int64_t>(1, total_steps_));
        LineWriter w(line_.data(), line_.size());
        w.add("\r\x1b[K{:>{}}/{} [{:#<{}}{:.<{}}] loss {:.4f} | {:.0f} tok/s", r.step,
              fmt::formatted_size("{}", total_steps_), total_steps_, "", filled, "",
              kBarWidth - filled, r.loss, r.tokens_per_s);
        if (r.mfu > 0) w.add(" | MFU {:.1f}%", 100 * r.mfu);
        w.add(" | eta ");
        add_duration(w, eta_s);
        write_out(line_.data(), w.size());
        bar_open_ = true;
    }
    MT_CHECK(std::fflush(out_) == 0, "[metrics] flushing the log failed: {}",
             detail::errno_message());

    if (jsonl_) {
        const auto longest = static_cast<size_t>(longest_list_);
        MT_CHECK(r.average_expert_load.size() <= longest && r.stage_busy_s.size() <= longest,
                 "[metrics] step {} has lists of {} experts and {} stages, more than the {} the "
                 "log was planned for",
                 r.step, r.average_expert_load.size(), r.stage_busy_s.size(), longest);
        LineWriter w(line_.data(), line_.size());
        w.add("{{\"step\":{}", r.step);
        w.json_number("loss", r.loss);
        w.json_number("mtp_loss", r.mtp_loss);
        w.json_number("balance_loss", r.balance_loss);
        w.json_number("lr", r.lr);
        w.json_number("grad_norm", r.grad_norm);
        w.json_number("step_ms", r.step_s * 1e3);
        w.json_number("tokens_per_s", r.tokens_per_s);
        w.json_number("tflops", r.model_tflops);
        w.json_number("mfu", r.mfu);
        w.json_number("expert_load_max_over_mean", r.expert_load_max_over_mean);
        w.json_number("expert_load_min_over_mean", r.expert_load_min_over_mean);
        w.json_number("dispatch_intra_domain_bytes", r.dispatch_intra_domain_bytes);
        w.json_number("dispatch_inter_domain_bytes", r.dispatch_inter_domain_bytes);
        w.json_number("domains_per_token_mean", r.domains_per_token_mean);
        w.json_number("domains_per_token_max", r.domains_per_token_max);
        w.add(",\"moe_overflowed_layers\":{},\"moe_extra_rounds\":{}", r.moe_overflowed_layers,
              r.moe_extra_rounds);
        if (r.rank_load_max_over_mean > 0) {
            w.json_number("rank_load_max_over_mean", r.rank_load_max_over_mean);
            w.json_number("expert_compute_max_ms", r.expert_compute_max_s * 1e3);
            w.json_number("expert_compute_mean_ms", r.expert_compute_mean_s * 1e3);
        }
        if (r.rebalanced) {
            w.json_number("rebalance_migration_ms", r.rebalance_migration_s * 1e3);
            w.json_number("rebalance_migrated_slots", r.rebalance_migrated_slots);
            w.json_number("rebalance_rank_load_before", r.rebalance_before);
            w.json_number("rebalance_rank_load_after", r.rebalance_after);
            w.add(",\"average_expert_load\":[");
            for (size_t e = 0; e < r.average_expert_load.size(); ++e)
                w.add("{}{:.6g}", e == 0 ? "" : ",", r.average_expert_load[e]);
            w.add("]");
        }
        if (validated) w.json_number("val_loss", r.val_loss);
        if (r.expert_comm_s + r.tp_comm_s + r.dp_comm_s > 0) {  // a distributed step
            w.json_number("compute_ms", r.compute_only_s * 1e3);
            w.json_number("expert_comm_ms", r.expert_comm_s * 1e3);
            w.json_number("tp_comm_ms", r.tp_comm_s * 1e3);
            w.json_number("dp_comm_ms", r.dp_comm_s * 1e3);
            w.json_number("grad_sync_exposed_ms", r.grad_sync_exposed_s * 1e3);
        }
        // The names of parallel::collective_name, in CollectiveKind order.
        constexpr const char* kBytesKeys[] = {
            "all_reduce_bytes", "reduce_scatter_bytes", "all_gather_bytes", "all_to_all_bytes",
            "broadcast_bytes",  "barrier_bytes",        "send_recv_bytes"};
        if (!r.stage_busy_s.empty()) {
            for (const auto& [key, times] : {std::pair{"stage_busy_ms", &r.stage_busy_s},
                                             std::pair{"stage_idle_ms", &r.stage_idle_s}}) {
                w.add(",\"{}\":[", key);
                for (size_t s = 0; s < times->size(); ++s)
                    w.add("{}{:.4g}", s == 0 ? "" : ",", (*times)[s] * 1e3);
                w.add("]");
            }
            w.json_number("bubble_fraction", r.bubble_fraction());
        }
        for (size_t k = 0; k < r.payload_bytes.size(); ++k)
            if (r.payload_bytes[k] > 0) w.add(",\"{}\":{}", kBytesKeys[k], r.payload_bytes[k]);
        w.add("}}\n");
        MT_CHECK(!w.cut(), "[metrics] step {}'s JSONL line does not fit its {} bytes", r.step,
                 line_.size());
        MT_CHECK(std::fwrite(line_.data(), 1, w.size(), jsonl_) == w.size(),
                 "[metrics] writing the JSONL log '{}' failed: {}", jsonl_path_,
                 detail::errno_message());
    }
}

double StepRecord::bubble_fraction() const {
    double busy = 0, span = 0;
    for (size_t s = 0; s < stage_busy_s.size(); ++s) {
        busy += stage_busy_s[s];
        span = std::max(span, stage_busy_s[s] + stage_idle_s[s]);
    }
    const auto stages = static_cast<double>(stage_busy_s.size());
    return span > 0 ? 1.0 - busy / (stages * span) : 0.0;
}

void MetricsLog::finish() {
    if (bar_open_) {
        write_out("\n", 1);
        bar_open_ = false;
    }
    MT_CHECK(std::fflush(out_) == 0, "[metrics] flushing the log failed: {}",
             detail::errno_message());
    if (jsonl_) {
        const int flushed = std::fflush(jsonl_);
        const int closed = std::fclose(jsonl_);
        jsonl_ = nullptr;
        MT_CHECK(flushed == 0 && closed == 0, "[metrics] writing the JSONL log '{}' failed: {}",
                 jsonl_path_, detail::errno_message());
    }
}

}  // namespace moetron
