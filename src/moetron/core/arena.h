// Arenas: one allocation per purpose (parameters, gradients, optimizer state, activations,
// communication buffers). Sizes are planned before the first step from a list of named tensors
// (ArenaPlan), then the Arena makes one allocation and hands out views. Nothing is allocated in
// the step loop. Offsets are aligned to 64 bytes on the host (a cache line, AVX-512) and to 256
// bytes on a GPU (cudaMalloc's guarantee, what vectorized loads want).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron {

inline constexpr size_t kHostAlignmentBytes = 64;
inline constexpr size_t kDeviceAlignmentBytes = 256;

struct ArenaEntry {
    std::string name;
    Shape shape;
    DType dtype;
    size_t offset_bytes;
    size_t size_bytes;
};

class ArenaPlan {
  public:
    explicit ArenaPlan(std::string name, size_t alignment_bytes = kHostAlignmentBytes);

    // Adds a tensor and returns its index. Names must be unique within a plan.
    size_t add(std::string name, Shape shape, DType dtype = DType::f32);

    const std::string& name() const { return name_; }
    size_t alignment_bytes() const { return alignment_bytes_; }
    size_t total_bytes() const { return total_bytes_; }
    const std::vector<ArenaEntry>& entries() const { return entries_; }
    // Index of a named entry; throws naming the plan and the missing tensor.
    size_t index_of(std::string_view name) const;

  private:
    std::string name_;
    size_t alignment_bytes_;
    size_t total_bytes_ = 0;
    std::vector<ArenaEntry> entries_;
    std::unordered_map<std::string, size_t> index_;
};

// Where an arena's one allocation comes from. The host resource lives here; the CUDA backend
// provides a device resource so that core never includes CUDA headers.
class MemoryResource {
  public:
    virtual ~MemoryResource() = default;
    virtual void* allocate(size_t bytes, size_t alignment_bytes) = 0;
    virtual void deallocate(void* p, size_t bytes) = 0;
    virtual void zero(void* p, size_t bytes) = 0;
    virtual Device device() const = 0;
};

// This machine's physical memory in bytes (sysconf), or 0 where it cannot say.
size_t physical_memory_bytes();

// "12.5 GiB": byte counts in messages.
std::string format_bytes(double bytes);

// Refuses, before anything is allocated, an amount of host memory that cannot possibly fit: more
// than the machine's physical memory. `what` says what needs it ("arena 'activations'"); `hint`
// what to change (may be empty).
void check_fits_in_host_memory(size_t bytes, std::string_view what, std::string_view hint = {});

// Page-aligned-enough host memory from std::aligned_alloc, zero-filled (which also commits the
// pages, so the first step does not pay for page faults).
MemoryResource& host_memory();

class Arena {
  public:
    Arena() = default;
    Arena(const ArenaPlan& plan, MemoryResource& memory);
    ~Arena();
    Arena(Arena&& other) noexcept;
    Arena& operator=(Arena&& other) noexcept;
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;

    TensorView view(size_t index) const;
    TensorView view(std::string_view name) const { return view(plan_.index_of(name)); }
    void* base() const { return base_; }
    size_t size_bytes() const { return plan_.total_bytes(); }
    const ArenaPlan& plan() const { return plan_; }
    void zero();

  private:
    ArenaPlan plan_{""};
    MemoryResource* memory_ = nullptr;
    void* base_ = nullptr;
};

}  // namespace moetron
