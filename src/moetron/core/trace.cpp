#include "moetron/core/trace.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"

namespace moetron {

std::string_view trace_track_name(TraceTrack track) {
    switch (track) {
        case TraceTrack::compute:
            return "compute";
        case TraceTrack::communication:
            return "communication";
        case TraceTrack::waiting:
            return "waiting on communication";
    }
    return "unknown";
}

TraceRecorder::TraceRecorder(size_t capacity) : events_(capacity) {
    MT_CHECK(capacity > 0, "[trace] capacity must be > 0");
}

void TraceRecorder::begin(double origin_s) {
    size_ = 0;
    dropped_ = 0;
    origin_s_ = origin_s;
    enabled_ = true;
}

std::string TraceRecorder::events_json(int rank) const {
    std::string out;
    // Process and thread names, and a fixed track order (Perfetto sorts threads by tid).
    out += nlohmann::json{{"ph", "M"},
                          {"pid", rank},
                          {"name", "process_name"},
                          {"args", {{"name", fmt::format("rank {}", rank)}}}}
               .dump();
    for (int t = 0; t < kNumTraceTracks; ++t) {
        out += ',';
        out += nlohmann::json{{"ph", "M"},
                              {"pid", rank},
                              {"tid", t},
                              {"name", "thread_name"},
                              {"args", {{"name", trace_track_name(static_cast<TraceTrack>(t))}}}}
                   .dump();
    }
    for (size_t i = 0; i < size_; ++i) {
        const TraceEvent& e = events_[i];
        nlohmann::json event = {{"ph", "X"},
                                {"pid", rank},
                                {"tid", static_cast<int>(e.track)},
                                {"name", e.name},
                                {"ts", (e.begin_s - origin_s_) * 1e6},
                                {"dur", (e.end_s - e.begin_s) * 1e6}};
        if (e.track != TraceTrack::compute)
            event["args"] = {{"group", e.group}, {"bytes", e.bytes}};
        out += ',';
        out += event.dump();
    }
    if (dropped_ > 0) {
        out += ',';
        out +=
            nlohmann::json{
                {"ph", "i"}, {"pid", rank},
                {"tid", 0},  {"s", "p"},
                {"ts", 0},   {"name", fmt::format("{} events dropped (buffer full)", dropped_)}}
                .dump();
    }
    return out;
}

std::string chrome_trace_document(const std::vector<std::string>& rank_fragments) {
    std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
    bool first = true;
    for (const std::string& fragment : rank_fragments) {
        if (fragment.empty()) continue;
        if (!first) out += ',';
        out += fragment;
        first = false;
    }
    out += "]}\n";
    return out;
}

TraceScope::TraceScope(TraceRecorder* recorder, const char* name)
    : recorder_(recorder != nullptr && recorder->enabled() ? recorder : nullptr),
      name_(name),
      begin_s_(recorder_ != nullptr ? Timer::now_s() : 0.0) {}

TraceScope::~TraceScope() {
    if (recorder_ != nullptr)
        recorder_->record({.name = name_,
                           .track = TraceTrack::compute,
                           .begin_s = begin_s_,
                           .end_s = Timer::now_s()});
}

}  // namespace moetron
