#include "moetron/core/arena.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace moetron {

namespace {

size_t round_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

class HostMemory final : public MemoryResource {
  public:
    void* allocate(size_t bytes, size_t alignment_bytes) override {
        if (bytes == 0) return nullptr;
        void* p = std::aligned_alloc(alignment_bytes, round_up(bytes, alignment_bytes));
        MT_CHECK(p != nullptr, "[arena] out of host memory allocating {} bytes", bytes);
        std::memset(p, 0, bytes);
        return p;
    }
    void deallocate(void* p, size_t) override { std::free(p); }
    void zero(void* p, size_t bytes) override {
        if (bytes) std::memset(p, 0, bytes);
    }
    Device device() const override { return Device::cpu; }
};

}  // namespace

MemoryResource& host_memory() {
    static HostMemory memory;  // stateless; a function-local static, not mutable global state
    return memory;
}

ArenaPlan::ArenaPlan(std::string name, size_t alignment_bytes)
    : name_(std::move(name)), alignment_bytes_(alignment_bytes) {
    MT_CHECK(alignment_bytes && (alignment_bytes & (alignment_bytes - 1)) == 0,
             "[arena] alignment {} is not a power of two", alignment_bytes);
}

size_t ArenaPlan::add(std::string name, Shape shape, DType dtype) {
    MT_CHECK(!index_.contains(name), "[arena] '{}' planned twice in arena '{}'", name, name_);
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size_bytes(dtype);
    const size_t offset = round_up(total_bytes_, alignment_bytes_);
    total_bytes_ = offset + bytes;
    index_.emplace(name, entries_.size());
    entries_.push_back({std::move(name), shape, dtype, offset, bytes});
    return entries_.size() - 1;
}

size_t ArenaPlan::index_of(std::string_view name) const {
    auto it = index_.find(std::string(name));
    MT_CHECK(it != index_.end(), "[arena] no tensor '{}' in arena '{}'", name, name_);
    return it->second;
}

Arena::Arena(const ArenaPlan& plan, MemoryResource& memory)
    : plan_(plan),
      memory_(&memory),
      base_(memory.allocate(plan.total_bytes(), plan.alignment_bytes())) {}

Arena::~Arena() {
    if (memory_ && base_) memory_->deallocate(base_, plan_.total_bytes());
}

Arena::Arena(Arena&& other) noexcept
    : plan_(std::move(other.plan_)),
      memory_(std::exchange(other.memory_, nullptr)),
      base_(std::exchange(other.base_, nullptr)) {}

Arena& Arena::operator=(Arena&& other) noexcept {
    if (this != &other) {
        if (memory_ && base_) memory_->deallocate(base_, plan_.total_bytes());
        plan_ = std::move(other.plan_);
        memory_ = std::exchange(other.memory_, nullptr);
        base_ = std::exchange(other.base_, nullptr);
    }
    return *this;
}

TensorView Arena::view(size_t index) const {
    MT_CHECK(index < plan_.entries().size(), "[arena] index {} out of {} in arena '{}'", index,
             plan_.entries().size(), plan_.name());
    const ArenaEntry& e = plan_.entries()[index];
    return {static_cast<char*>(base_) + e.offset_bytes, e.shape, e.dtype, memory_->device()};
}

void Arena::zero() {
    if (memory_ && base_) memory_->zero(base_, plan_.total_bytes());
}

}  // namespace moetron
