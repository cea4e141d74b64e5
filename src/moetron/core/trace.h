// A timeline of one training step, written as a Chrome trace (JSON "trace event format", which
// Perfetto and chrome://tracing open): one process per rank, one thread per track.
//
// Tracks: `compute` (what the step's thread runs: forward/backward, optimizer), `communication`
// (each collective from the moment it is posted to the moment it completes, so an asynchronous
// one overlaps compute visibly) and `waiting` (the step's thread blocked in a collective: the
// communication that is not hidden).
//
// Recording is a few stores into a buffer sized at construction; nothing allocates while a step
// runs. Events past the capacity are counted as dropped, never stored. One thread records (the
// step's); the progress thread never does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moetron {

enum class TraceTrack : uint8_t { compute, communication, waiting };
inline constexpr int kNumTraceTracks = 3;
std::string_view trace_track_name(TraceTrack track);

struct TraceEvent {
    const char* name = "";   // static storage (a literal, or a name that outlives the recorder)
    const char* group = "";  // communication group, "" for compute
    TraceTrack track = TraceTrack::compute;
    double begin_s = 0;  // Timer::now_s() clock
    double end_s = 0;
    uint64_t bytes = 0;  // payload of a collective (communicator.h's counters' convention)
};

class TraceRecorder {
  public:
    explicit TraceRecorder(size_t capacity = 1 << 16);

    // Recording is off until begin(); begin() clears the previous events and sets the origin
    // that timestamps are written relative to.
    void begin(double origin_s);
    void end() { enabled_ = false; }
    bool enabled() const { return enabled_; }

    void record(const TraceEvent& event) {
        if (!enabled_) return;
        if (size_ == events_.size()) {
            ++dropped_;
            return;
        }
        events_[size_++] = event;
    }

    size_t size() const { return size_; }
    size_t dropped() const { return dropped_; }
    const TraceEvent& event(size_t i) const { return events_[i]; }

    // This rank's events as trace-event JSON objects separated by commas (no brackets), with
    // pid = rank and one thread per track, named; timestamps in microseconds since the origin.
    std::string events_json(int rank) const;

  private:
    std::vector<TraceEvent> events_;
    size_t size_ = 0;
    size_t dropped_ = 0;
    double origin_s_ = 0;
    bool enabled_ = false;
};

// {"traceEvents": [...]} from the ranks' events_json fragments (empty fragments skipped).
std::string chrome_trace_document(const std::vector<std::string>& rank_fragments);

// Records [begin, end of scope) on the compute track.
class TraceScope {
  public:
    TraceScope(TraceRecorder* recorder, const char* name);
    ~TraceScope();
    TraceScope(const TraceScope&) = delete;
    TraceScope& operator=(const TraceScope&) = delete;

  private:
    TraceRecorder* recorder_;
    const char* name_;
    double begin_s_;
};

}  // namespace moetron
