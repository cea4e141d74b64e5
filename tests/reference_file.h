// Reader for the reference dumps under tests/data (written by tools/reference/make_reference.py):
// named tensors from an independent PyTorch implementation that the C++ model checks itself
// against. Header-only; every malformed input is a moetron::Error naming the file (and tensor).
//
// File format, all little-endian:
//   magic    8 bytes  "MTREF\0\0\0"
//   version  uint32   = 1
//   count    uint32   number of tensors
//   count times:
//     name_len uint32, name (utf-8, name_len bytes)
//     dtype    uint8    0 = f32, 1 = i32, 2 = f64
//     ndim     uint8    (0 = a scalar of one element)
//     dims     int64 x ndim
//     data     prod(dims) elements, row-major
// Nothing may follow the last tensor. Names and conventions: tools/reference/README.md.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "moetron/core/error.h"

namespace moetron::testing {

enum class ReferenceDType : uint8_t { f32 = 0, i32 = 1, f64 = 2 };

struct ReferenceTensor {
    std::string name;
    ReferenceDType dtype = ReferenceDType::f32;
    std::vector<int64_t> shape;
    std::vector<float> f32;    // filled when dtype == f32
    std::vector<int32_t> i32;  // filled when dtype == i32
    std::vector<double> f64;   // filled when dtype == f64

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
};

class ReferenceFile {
  public:
    static constexpr char kMagic[8] = {'M', 'T', 'R', 'E', 'F', '\0', '\0', '\0'};
    static constexpr uint32_t kVersion = 1;

    static ReferenceFile load(const std::string& path) {
        static_assert(std::endian::native == std::endian::little, "the format is little-endian");
        std::ifstream in(path, std::ios::binary);
        MT_CHECK(in.good(),
                 "[reference] cannot open '{}' (regenerate it with "
                 "tools/reference/make_reference.py)",
                 path);
        std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
        ReferenceFile file;
        file.path_ = path;
        Cursor cur{bytes, 0, path};

        char magic[8];
        cur.read(magic, sizeof magic, "the magic bytes");
        MT_CHECK(std::memcmp(magic, kMagic, sizeof magic) == 0,
                 "[reference] '{}' is not a moetron reference file (bad magic; expected "
                 "\"MTREF\\0\\0\\0\")",
                 path);
        const uint32_t version = cur.get<uint32_t>("the version");
        MT_CHECK(version == kVersion,
                 "[reference] '{}' has format version {}, this reader reads version {}", path,
                 version, kVersion);
        const uint32_t count = cur.get<uint32_t>("the tensor count");

        for (uint32_t i = 0; i < count; ++i) {
            const std::string what = "tensor #" + std::to_string(i);
            ReferenceTensor t;
            const uint32_t name_len = cur.get<uint32_t>(what + "'s name length");
            MT_CHECK(name_len > 0 && name_len <= 4096,
                     "[reference] '{}': {} has an implausible name length {}", path, what,
                     name_len);
            t.name.resize(name_len);
            cur.read(t.name.data(), name_len, what + "'s name");
            const std::string named = what + " '" + t.name + "'";
            const uint8_t dtype = cur.get<uint8_t>(named + "'s dtype");
            MT_CHECK(dtype <= 2, "[reference] '{}': {} has unknown dtype code {}", path, named,
                     dtype);
            t.dtype = static_cast<ReferenceDType>(dtype);
            const uint8_t ndim = cur.get<uint8_t>(named + "'s rank");
            MT_CHECK(ndim <= 8, "[reference] '{}': {} has implausible rank {}", path, named, ndim);
            t.shape.resize(ndim);
            int64_t numel = 1;
            for (uint8_t d = 0; d < ndim; ++d) {
                t.shape[d] = cur.get<int64_t>(named + "'s shape");
                MT_CHECK(t.shape[d] >= 0 && t.shape[d] <= (int64_t{1} << 40),
                         "[reference] '{}': {} has a bad dimension {}", path, named, t.shape[d]);
                numel *= t.shape[d];
                MT_CHECK(numel <= (int64_t{1} << 40), "[reference] '{}': {} is implausibly large",
                         path, named);
            }
            const size_t n = static_cast<size_t>(numel);
            switch (t.dtype) {
                case ReferenceDType::f32:
                    t.f32.resize(n);
                    cur.read(t.f32.data(), n * sizeof(float), named + "'s data");
                    break;
                case ReferenceDType::i32:
                    t.i32.resize(n);
                    cur.read(t.i32.data(), n * sizeof(int32_t), named + "'s data");
                    break;
                case ReferenceDType::f64:
                    t.f64.resize(n);
                    cur.read(t.f64.data(), n * sizeof(double), named + "'s data");
                    break;
            }
            MT_CHECK(!file.index_.contains(t.name), "[reference] '{}': tensor '{}' appears twice",
                     path, t.name);
            file.index_.emplace(t.name, file.tensors_.size());
            file.tensors_.push_back(std::move(t));
        }
        MT_CHECK(cur.pos == bytes.size(),
                 "[reference] '{}': {} unexpected bytes after the last of {} tensors", path,
                 bytes.size() - cur.pos, count);
        return file;
    }

    bool has(const std::string& name) const { return index_.contains(name); }

    const ReferenceTensor& get(const std::string& name) const {
        auto it = index_.find(name);
        MT_CHECK(it != index_.end(), "[reference] '{}' has no tensor '{}'", path_, name);
        return tensors_[it->second];
    }

    // get() that also checks the shape, so a model/reference mismatch names the tensor.
    const ReferenceTensor& get(const std::string& name, const std::vector<int64_t>& shape) const {
        const ReferenceTensor& t = get(name);
        MT_CHECK(t.shape == shape, "[reference] '{}': tensor '{}' has shape [{}], expected [{}]",
                 path_, name, fmt::join(t.shape, ", "), fmt::join(shape, ", "));
        return t;
    }

    // A one-element tensor of any dtype as a double: the "config.*" and "meta.*" entries.
    double scalar(const std::string& name) const {
        const ReferenceTensor& t = get(name);
        MT_CHECK(t.numel() == 1, "[reference] '{}': tensor '{}' is not a scalar", path_, name);
        switch (t.dtype) {
            case ReferenceDType::f32:
                return t.f32[0];
            case ReferenceDType::i32:
                return t.i32[0];
            case ReferenceDType::f64:
                return t.f64[0];
        }
        return 0;  // unreachable: dtype was validated on load
    }

    // In file order.
    std::vector<std::string> names() const {
        std::vector<std::string> out;
        out.reserve(tensors_.size());
        for (const ReferenceTensor& t : tensors_) out.push_back(t.name);
        return out;
    }

    const std::string& path() const { return path_; }

  private:
    struct Cursor {
        const std::vector<char>& bytes;
        size_t pos;
        const std::string& path;

        void read(void* dst, size_t n, const std::string& what) {
            MT_CHECK(n <= bytes.size() - pos,
                     "[reference] '{}' is truncated: reading {} needs {} bytes at offset {}, "
                     "the file has {} bytes",
                     path, what, n, pos, bytes.size());
            if (n > 0) std::memcpy(dst, bytes.data() + pos, n);
            pos += n;
        }
        template <class T>
        T get(const std::string& what) {
            T v;
            read(&v, sizeof v, what);
            return v;
        }
    };

    std::string path_;
    std::vector<ReferenceTensor> tensors_;
    std::map<std::string, size_t> index_;
};

}  // namespace moetron::testing
