#include "moetron/core/arena.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "moetron/core/checked_math.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace {

size_t round_up(size_t x, size_t a) {
    return checked_add(x, a - 1, "[arena] planned size") / a * a;
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

size_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page_bytes = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_bytes <= 0) return 0;
    return static_cast<size_t>(pages) * static_cast<size_t>(page_bytes);
}

std::string format_bytes(double bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 6) bytes /= 1024.0, ++unit;
    return unit == 0 ? fmt::format("{:.0f} bytes", bytes)
                     : fmt::format("{:.1f} {}", bytes, units[unit]);
}

void check_fits_in_host_memory(size_t bytes, std::string_view what, std::string_view hint) {
    const size_t available = physical_memory_bytes();
    if (available == 0 || bytes <= available) return;
    MT_USER_THROW("{} needs {} ({} bytes), more than this machine's {} of memory{}{}", what,
                  format_bytes(static_cast<double>(bytes)), bytes,
                  format_bytes(static_cast<double>(available)), hint.empty() ? "" : ": ", hint);
}

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
    const size_t bytes = checked_mul(static_cast<size_t>(shape.numel()), dtype_size_bytes(dtype),
                                     "[arena] size of '" + name + "'");
    const size_t offset = round_up(total_bytes_, alignment_bytes_);
    total_bytes_ = checked_add(offset, bytes, "[arena] planned size of arena '" + name_ + "'");
    index_.emplace(name, entries_.size());
    entries_.push_back({std::move(name), shape, dtype, offset, bytes});
    return entries_.size() - 1;
}

size_t ArenaPlan::index_of(std::string_view name) const {
    auto it = index_.find(std::string(name));
    MT_CHECK(it != index_.end(), "[arena] no tensor '{}' in arena '{}'", name, name_);
    return it->second;
}

Arena::Arena(const ArenaPlan& plan, MemoryResource& memory) : plan_(plan), memory_(&memory) {
    if (memory.device() == Device::cpu)
        check_fits_in_host_memory(plan.total_bytes(), "[arena] arena '" + plan.name() + "'");
    base_ = memory.allocate(plan.total_bytes(), plan.alignment_bytes());
}

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
