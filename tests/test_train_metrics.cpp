// train/metrics: the plain-line rhythm, the terminal bar, the JSONL records, the GEMM peak.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/train/metrics.h"

namespace moetron {
namespace {

StepRecord record(int64_t step) {
    StepRecord r;
    r.step = step;
    r.loss = 2.5;
    r.lr = 1e-3;
    r.grad_norm = 0.5;
    r.step_s = 0.01;
    r.tokens_per_s = 1000;
    r.model_tflops = 0.001;
    r.mfu = 0.25;
    return r;
}

std::string read_all(std::FILE* f) {
    std::rewind(f);
    std::string text;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
    return text;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

TEST(MetricsLog, PlainLinesAtFirstEveryNthValidationAndLastStep) {
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    {
        MetricsLog log(20, /*print_every=*/5, "", /*terminal=*/false, out);
        for (int64_t s = 1; s <= 20; ++s) {
            StepRecord r = record(s);
            if (s == 7) r.val_loss = 2.25;
            log.log_step(r);
        }
        log.finish();
    }
    const std::vector<std::string> lines = lines_of(read_all(out));
    std::fclose(out);
    ASSERT_EQ(lines.size(), 6u);  // steps 1, 5, 7 (validation), 10, 15, 20
    EXPECT_EQ(lines[0].rfind("step  1/20 | loss 2.5000", 0), 0u) << lines[0];
    EXPECT_NE(lines[2].find("step  7/20 | loss 2.5000 | val 2.2500"), std::string::npos);
    EXPECT_NE(lines[5].find("MFU 25.0%"), std::string::npos) << lines[5];
    EXPECT_EQ(lines[1].find('\r'), std::string::npos) << "no terminal codes in plain mode";
}

// The time left on plain lines (a pipe, a log file, mpirun), as on the bar: the mean step time
// so far times the steps left, in minutes and hours once it is long.
TEST(MetricsLog, PlainLinesCarryTheTimeLeft) {
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    {
        MetricsLog log(2000, /*print_every=*/1000, "", /*terminal=*/false, out);
        for (int64_t s = 1; s <= 2000; ++s) {
            StepRecord r = record(s);
            r.step_s = s <= 1000 ? 2.0 : 4.0;  // the mean grows to 3 s over the second half
            log.log_step(r);
        }
        log.finish();
    }
    const std::vector<std::string> lines = lines_of(read_all(out));
    std::fclose(out);
    ASSERT_EQ(lines.size(), 3u);  // steps 1, 1000, 2000
    EXPECT_NE(lines[0].find(" ms | eta 1h06m"), std::string::npos) << lines[0];   // 1999 x 2 s
    EXPECT_NE(lines[1].find(" ms | eta 33m20s"), std::string::npos) << lines[1];  // 1000 x 2 s
    EXPECT_EQ(lines[2].find("eta"), std::string::npos) << "nothing is left: " << lines[2];
    std::FILE* short_run = std::tmpfile();
    ASSERT_NE(short_run, nullptr);
    {
        MetricsLog log(20, 5, "", /*terminal=*/false, short_run);
        log.log_step(record(1));  // 19 steps of 10 ms left
        log.finish();
    }
    const std::string text = read_all(short_run);
    std::fclose(short_run);
    EXPECT_NE(text.find(" | 10.0 ms | eta 0s\n"), std::string::npos) << text;
}

TEST(MetricsLog, TerminalModeRedrawsOneBarLine) {
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    {
        MetricsLog log(4, 1, "", /*terminal=*/true, out);
        for (int64_t s = 1; s <= 4; ++s) log.log_step(record(s));
        log.finish();
    }
    const std::string text = read_all(out);
    std::fclose(out);
    EXPECT_NE(text.find("\r\x1b[K4/4 [########################] loss 2.5000"), std::string::npos)
        << text;
    EXPECT_EQ(text.back(), '\n');
    EXPECT_EQ(lines_of(text).size(), 1u) << "the bar stays on one line";
}

TEST(MetricsLog, JsonlHasOneObjectPerStepAndNullForNonFinite) {
    const std::string path = ::testing::TempDir() + "moetron_metrics_test.jsonl";
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    {
        MetricsLog log(2, 1, path, false, out);
        StepRecord r = record(1);
        r.grad_norm = std::numeric_limits<double>::infinity();
        log.log_step(r);
        r = record(2);
        r.val_loss = 2.0;
        log.log_step(r);
        log.finish();
    }
    std::fclose(out);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<std::string> lines = lines_of(text.str());
    std::remove(path.c_str());
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0].rfind("{\"step\":1,\"loss\":2.5,", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find("\"grad_norm\":null"), std::string::npos) << lines[0];
    EXPECT_EQ(lines[0].find("val_loss"), std::string::npos);
    EXPECT_NE(lines[1].find("\"val_loss\":2"), std::string::npos) << lines[1];
    EXPECT_NE(lines[1].find("\"tokens_per_s\":1000"), std::string::npos) << lines[1];
    // One process: no communication breakdown.
    EXPECT_EQ(lines[1].find("expert_comm_ms"), std::string::npos) << lines[1];
}

// A rebalance step of a model with many experts: the line is planned for them, so it stays whole
// JSON (a fixed 8 KiB buffer cut it mid-number once there were more than about 700 experts).
TEST(MetricsLog, ARebalanceLineOfThousandsOfExpertsIsWholeJson) {
    const std::string path = ::testing::TempDir() + "moetron_metrics_experts_test.jsonl";
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    constexpr int64_t kExperts = 4096;
    {
        MetricsLog log(1, 1, path, false, out, kExperts);
        StepRecord r = record(1);
        r.rank_load_max_over_mean = 1.25;
        r.rebalanced = true;
        r.average_expert_load.assign(kExperts, 123456.789);
        log.log_step(r);
        log.finish();
    }
    std::fclose(out);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::remove(path.c_str());
    const std::vector<std::string> lines = lines_of(text.str());
    ASSERT_EQ(lines.size(), 1u);
    const auto parsed = nlohmann::json::parse(lines[0], nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(parsed.is_discarded()) << lines[0].substr(lines[0].size() - 80);
    EXPECT_EQ(parsed["average_expert_load"].size(), static_cast<size_t>(kExperts));
}

// More entries than the log was planned for is the caller's bug: refused, never a cut line.
TEST(MetricsLog, AListLongerThanPlannedIsRefused) {
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    const std::string path = ::testing::TempDir() + "moetron_metrics_unplanned_test.jsonl";
    {
        MetricsLog log(1, 1, path, false, out, /*longest_list=*/8);
        StepRecord r = record(1);
        r.rebalanced = true;
        r.average_expert_load.assign(9, 1.0);
        EXPECT_THROW(log.log_step(r), moetron::Error);
    }
    std::fclose(out);
    std::remove(path.c_str());
}

TEST(MetricsLog, DistributedStepsCarryTheirTimeAndBytesBreakdown) {
    const std::string path = ::testing::TempDir() + "moetron_metrics_breakdown.jsonl";
    std::FILE* devnull = std::fopen("/dev/null", "w");
    ASSERT_NE(devnull, nullptr);
    {
        MetricsLog log(1, 1, path, false, devnull);
        StepRecord r;
        r.step = 1;
        r.step_s = 0.010;
        r.compute_only_s = 0.006;
        r.expert_comm_s = 0.003;
        r.dp_comm_s = 0.001;
        r.grad_sync_exposed_s = 0.0005;
        r.payload_bytes[3] = 12345;  // all_to_all
        log.log_step(r);
        log.finish();
    }
    std::fclose(devnull);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::remove(path.c_str());
    const std::string line = text.str();
    for (const char* field :
         {"\"compute_ms\":6", "\"expert_comm_ms\":3", "\"tp_comm_ms\":0", "\"dp_comm_ms\":1",
          "\"grad_sync_exposed_ms\":0.5", "\"all_to_all_bytes\":12345"})
        EXPECT_NE(line.find(field), std::string::npos) << field << " missing in " << line;
    EXPECT_EQ(line.find("all_reduce_bytes"), std::string::npos) << "zero counts are left out";
}

// A pipeline's step: each stage's busy and idle time on the line and in the JSONL record.
TEST(MetricsLog, PipelineStepsCarryEachStagesBusyAndIdleTime) {
    const std::string path = ::testing::TempDir() + "moetron_metrics_pipeline.jsonl";
    std::FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    {
        MetricsLog log(1, 1, path, false, out, /*longest_list=*/2);  // two stages
        StepRecord r = record(1);
        r.stage_busy_s = {0.006, 0.004};
        r.stage_idle_s = {0.002, 0.004};
        EXPECT_DOUBLE_EQ(r.bubble_fraction(), 0.375);
        log.log_step(r);
        log.finish();
    }
    const std::string text = read_all(out);
    std::fclose(out);
    EXPECT_NE(text.find("pp busy 6.0 4.0 idle 2.0 4.0 ms (bubble 38%)"), std::string::npos) << text;
    std::ifstream in(path);
    std::stringstream jsonl;
    jsonl << in.rdbuf();
    std::remove(path.c_str());
    for (const char* field :
         {"\"stage_busy_ms\":[6,4]", "\"stage_idle_ms\":[2,4]", "\"bubble_fraction\":0.375"})
        EXPECT_NE(jsonl.str().find(field), std::string::npos)
            << field << " missing in " << jsonl.str();
    // Without a pipeline, none of it.
    EXPECT_DOUBLE_EQ(record(1).bubble_fraction(), 0.0);
}

// A stage that ends its share early (1F1B's last stage, one backward before the first) waits out
// the step outside the pipeline's waits: the bubble counts that tail, as moetron simulate's
// 1 - mean(busy) / makespan does, not only the waits each stage measured.
TEST(MetricsLog, BubbleCountsTheTailOfAStageThatFinishesEarly) {
    StepRecord r = record(1);
    r.stage_busy_s = {0.006, 0.003};  // stage 0 runs 8 ms, stage 1 only 4 ms of the step
    r.stage_idle_s = {0.002, 0.001};
    EXPECT_DOUBLE_EQ(r.bubble_fraction(), 1.0 - 0.009 / (2 * 0.008));
}

TEST(MetricsLog, UnwritableJsonlPathIsAnError) {
    EXPECT_THROW(MetricsLog(1, 1, "/nonexistent-dir/log.jsonl", false), Error);
}

TEST(GemmPeak, MeasuresAPositiveRate) {
    const double gflops = measure_gemm_peak_gflops(/*n=*/128, /*seconds=*/0.01);
    EXPECT_GT(gflops, 0.1);
    EXPECT_TRUE(std::isfinite(gflops));
}

}  // namespace
}  // namespace moetron
