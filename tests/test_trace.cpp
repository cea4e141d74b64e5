// The step timeline (core/trace.h) and the communicator wrapper that feeds it
// (parallel/traced_communicator.h), on one process.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moetron/core/timer.h"
#include "moetron/core/trace.h"
#include "moetron/parallel/local_communicator.h"
#include "moetron/parallel/traced_communicator.h"

namespace moetron {
namespace {

TEST(TraceRecorder, RecordsOnlyWhileEnabledAndCountsWhatDoesNotFit) {
    TraceRecorder recorder(2);
    recorder.record({.name = "before"});
    EXPECT_EQ(recorder.size(), 0u);
    recorder.begin(0.0);
    for (const char* name : {"a", "b", "c"}) recorder.record({.name = name});
    recorder.end();
    recorder.record({.name = "after"});
    EXPECT_EQ(recorder.size(), 2u);
    EXPECT_EQ(recorder.dropped(), 1u);
    EXPECT_STREQ(recorder.event(1).name, "b");
    recorder.begin(0.0);  // a new step starts empty
    EXPECT_EQ(recorder.size(), 0u);
    EXPECT_EQ(recorder.dropped(), 0u);
}

TEST(TraceRecorder, WritesAChromeTraceWithNamedTracksPerRank) {
    TraceRecorder recorder(8);
    recorder.begin(10.0);
    recorder.record({.name = "forward + backward", .begin_s = 10.001, .end_s = 10.003});
    recorder.record({.name = "all_reduce",
                     .group = "dp",
                     .track = TraceTrack::communication,
                     .begin_s = 10.002,
                     .end_s = 10.004,
                     .bytes = 4096});
    recorder.end();
    const std::string doc =
        chrome_trace_document({recorder.events_json(0), "", recorder.events_json(3)});
    const nlohmann::json trace = nlohmann::json::parse(doc);
    int spans = 0, thread_names = 0;
    for (const auto& e : trace.at("traceEvents")) {
        if (e.at("ph") == "M" && e.at("name") == "thread_name") ++thread_names;
        if (e.at("ph") != "X") continue;
        ++spans;
        if (e.at("name") == "all_reduce") {
            EXPECT_EQ(e.at("tid"), 1);
            EXPECT_NEAR(e.at("ts").get<double>(), 2000.0, 1e-3);  // microseconds from the origin
            EXPECT_NEAR(e.at("dur").get<double>(), 2000.0, 1e-3);
            EXPECT_EQ(e.at("args").at("bytes"), 4096);
            EXPECT_EQ(e.at("args").at("group"), "dp");
        } else {
            EXPECT_EQ(e.at("tid"), 0);
            EXPECT_FALSE(e.contains("args"));
        }
    }
    EXPECT_EQ(spans, 4);  // two events, two ranks
    EXPECT_EQ(thread_names, 2 * kNumTraceTracks);
}

TEST(TraceScope, TimesItsScopeOnlyWhenRecording) {
    TraceRecorder recorder(4);
    { const TraceScope idle(&recorder, "idle"); }
    { const TraceScope no_recorder(nullptr, "none"); }
    recorder.begin(Timer::now_s());
    const double before = Timer::now_s();
    { const TraceScope scope(&recorder, "work"); }
    ASSERT_EQ(recorder.size(), 1u);
    EXPECT_STREQ(recorder.event(0).name, "work");
    EXPECT_GE(recorder.event(0).begin_s, before);
    EXPECT_GE(recorder.event(0).end_s, recorder.event(0).begin_s);
}

TEST(TracedCommunicator, ChargesItsTrafficClassAndRecordsBothTracks) {
    parallel::CommWaitTotals totals;
    TraceRecorder recorder(16);
    parallel::TracedCommunicator comm(std::make_unique<parallel::LocalCommunicator>("ep"),
                                      parallel::TrafficClass::expert_dispatch, &totals, &recorder);
    recorder.begin(Timer::now_s());
    std::vector<float> data(256, 1.0f);
    comm.all_reduce_sum(data.data(), data.size(), DType::f32, kHostStream);  // blocking
    parallel::CollectiveHandle h =
        comm.all_reduce_sum_async(data.data(), 64, DType::f32, kHostStream);
    h.wait();
    EXPECT_FALSE(std::isnan(h.completed_at_s()));
    recorder.end();

    EXPECT_GT(totals[parallel::TrafficClass::expert_dispatch], 0.0);
    EXPECT_EQ(totals[parallel::TrafficClass::data_parallel], 0.0);
    EXPECT_EQ(comm.counters(parallel::CollectiveKind::all_reduce).calls, 2u);
    // Blocking: one communication and one waiting span of 1 KiB; async: a communication span of
    // 256 B, and a waiting span only if wait() blocked (a local collective completes at once).
    ASSERT_GE(recorder.size(), 3u);
    EXPECT_EQ(recorder.event(0).track, TraceTrack::communication);
    EXPECT_EQ(recorder.event(0).bytes, 1024u);
    EXPECT_STREQ(recorder.event(0).group, "ep");
    EXPECT_EQ(recorder.event(1).track, TraceTrack::waiting);
    EXPECT_EQ(recorder.event(2).track, TraceTrack::communication);
    EXPECT_EQ(recorder.event(2).bytes, 256u);
    EXPECT_LE(recorder.event(2).begin_s, recorder.event(2).end_s);
}

// The traced communicator hands the caller's stream to the one it wraps (which refuses a device
// stream: the local communicator moves host memory).
TEST(TracedCommunicator, ForwardsTheStream) {
    parallel::CommWaitTotals totals;
    parallel::TracedCommunicator comm(std::make_unique<parallel::LocalCommunicator>("ep"),
                                      parallel::TrafficClass::expert_dispatch, &totals, nullptr);
    int cuda_stream_object = 0;
    const Stream device{Device::cuda, &cuda_stream_object};
    std::vector<float> data(4, 1.0f), out(4);
    std::vector<int> four = {4}, zero = {0};
    EXPECT_THROW(comm.all_reduce_sum(data.data(), 4, DType::f32, device), Error);
    EXPECT_THROW((void)comm.all_reduce_sum_async(data.data(), 4, DType::f32, device), Error);
    EXPECT_THROW(comm.reduce_scatter_sum(out.data(), data.data(), 4, DType::f32, device), Error);
    EXPECT_THROW(
        (void)comm.reduce_scatter_sum_async(out.data(), data.data(), 4, DType::f32, device), Error);
    EXPECT_THROW(comm.all_gather(out.data(), data.data(), 4, DType::f32, device), Error);
    EXPECT_THROW((void)comm.all_gather_async(out.data(), data.data(), 4, DType::f32, device),
                 Error);
    EXPECT_THROW(
        comm.all_to_all_v(out.data(), four, zero, data.data(), four, zero, DType::f32, device),
        Error);
    EXPECT_THROW((void)comm.all_to_all_v_async(out.data(), four, zero, data.data(), four, zero,
                                               DType::f32, device),
                 Error);
    EXPECT_THROW(comm.broadcast(data.data(), 4, DType::f32, 0, device), Error);
    EXPECT_THROW((void)comm.broadcast_async(data.data(), 4, DType::f32, 0, device), Error);
    comm.all_reduce_sum(data.data(), 4, DType::f32, kHostStream);
}

TEST(TracedCommunicator, SplitGroupsStayTracedInTheSameClass) {
    parallel::CommWaitTotals totals;
    parallel::TracedCommunicator comm(std::make_unique<parallel::LocalCommunicator>("tp"),
                                      parallel::TrafficClass::tensor_parallel, &totals, nullptr);
    std::unique_ptr<parallel::Communicator> sub = comm.split(0, 0, "tp-sub");
    ASSERT_NE(dynamic_cast<parallel::TracedCommunicator*>(sub.get()), nullptr);
    sub->barrier();
    EXPECT_GT(totals[parallel::TrafficClass::tensor_parallel], 0.0);
    EXPECT_EQ(totals.total_s(), totals[parallel::TrafficClass::tensor_parallel]);
}

}  // namespace
}  // namespace moetron
