#include "moetron/train/weights_file.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "moetron/core/error.h"
#include "moetron/core/strings.h"
#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/train/atomic_file.h"

namespace moetron {

static_assert(std::endian::native == std::endian::little,
              "weights files are little-endian and read without byte swapping");

namespace {

// Caps on header fields, so a corrupt file gives an error instead of a huge allocation.
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint32_t kMaxDescriptionBytes = 1 << 16;

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

class Reader {
  public:
    Reader(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
    void read(void* out, size_t bytes, const char* what) {
        const size_t got = std::fread(out, 1, bytes, f_);
        MT_CHECK(got == bytes, "[weights] '{}' is truncated: it ends inside {}{}", path_, what,
                 std::ferror(f_) ? fmt::format(" (read error: {})", detail::errno_message()) : "");
    }
    template <class T>
    T value(const char* what) {
        T v{};
        read(&v, sizeof v, what);
        return v;
    }
    std::string string(uint32_t size, const char* what) {
        std::string s(size, '\0');
        read(s.data(), size, what);
        return s;
    }

  private:
    std::FILE* f_;
    std::string path_;
};

std::string shape_of(const std::vector<int64_t>& dims) {
    std::string s = "(";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + (dims.size() == 1 ? ",)" : ")");
}

// The weights into a new file at path (save_weights stages and renames it).
void write_weights_file(const std::string& path, const std::vector<ParamEntry>& entries,
                        const float* params, std::string_view model_description) {
    FilePtr f(std::fopen(path.c_str(), "wb"));
    MT_CHECK(f != nullptr, "[weights] cannot create '{}': {}", path, detail::errno_message());
    auto write = [&](const void* data, size_t bytes) {
        MT_CHECK(std::fwrite(data, 1, bytes, f.get()) == bytes, "[weights] writing '{}' failed: {}",
                 path, detail::errno_message());
    };
    auto write_u32 = [&](uint64_t v) {
        MT_CHECK(v <= UINT32_MAX, "[weights] {} does not fit the format's 32-bit field", v);
        const auto u = static_cast<uint32_t>(v);
        write(&u, 4);
    };
    uint64_t num_floats = 0;
    for (const ParamEntry& e : entries) num_floats += static_cast<uint64_t>(e.numel);
    write(kWeightsMagic, sizeof kWeightsMagic);
    write_u32(kWeightsVersion);
    write_u32(entries.size());
    write(&num_floats, 8);
    write_u32(model_description.size());
    write(model_description.data(), model_description.size());
    for (const ParamEntry& e : entries) {
        write_u32(e.name.size());
        write(e.name.data(), e.name.size());
        write_u32(static_cast<uint64_t>(e.shape.ndim));
        write(e.shape.dims.data(), sizeof(int64_t) * static_cast<size_t>(e.shape.ndim));
    }
    for (const ParamEntry& e : entries)
        write(params + e.offset, sizeof(float) * static_cast<size_t>(e.numel));
    MT_CHECK(std::fflush(f.get()) == 0, "[weights] writing '{}' failed: {}", path,
             detail::errno_message());
    MT_CHECK(std::fclose(f.release()) == 0, "[weights] closing '{}' failed: {}", path,
             detail::errno_message());
}

}  // namespace

void save_weights(const std::string& path, const std::vector<ParamEntry>& entries,
                  const float* params, std::string_view model_description) {
    write_file_atomically(path, [&](const std::string& staging) {
        write_weights_file(staging, entries, params, model_description);
    });
}

void load_weights(const std::string& path, const std::vector<ParamEntry>& entries, float* params,
                  std::string_view model_description) {
    std::error_code ec;
    MT_USER_CHECK(std::filesystem::is_regular_file(path, ec),
                  "[weights] weights file '{}' does not exist (write one with `moetron train "
                  "--save-final PATH`)",
                  path);
    FilePtr f(std::fopen(path.c_str(), "rb"));
    MT_CHECK(f != nullptr, "[weights] cannot open '{}': {}", path, detail::errno_message());
    Reader in(f.get(), path);
    char magic[8];
    const size_t got = std::fread(magic, 1, sizeof magic, f.get());
    MT_USER_CHECK(
        got == sizeof magic && std::memcmp(magic, kWeightsMagic, sizeof magic) == 0,
        "[weights] '{}' is not a moetron weights file (it does not start with \"MTWEIGHT\")", path);
    const auto version = in.value<uint32_t>("the version");
    MT_USER_CHECK(version == kWeightsVersion,
                  "[weights] '{}' is a weights file of version {}; this build reads version {}",
                  path, version, kWeightsVersion);
    const auto num_entries = in.value<uint32_t>("the entry count");
    const auto num_floats = in.value<uint64_t>("the element count");
    const auto description_size = in.value<uint32_t>("the model description");
    MT_CHECK(description_size <= kMaxDescriptionBytes,
             "[weights] '{}' is corrupt: model description of {} bytes", path, description_size);
    const std::string saved_from = in.string(description_size, "the model description");
    const std::string mismatch = fmt::format(
        "[weights] '{}' holds the weights of another model:\n  saved from: {}\n  this model: {}\n",
        path, saved_from, model_description);
    MT_CHECK(num_entries == entries.size(), "{}  the file has {} tensors, the model {}", mismatch,
             num_entries, entries.size());

    uint64_t expected_floats = 0;
    for (const ParamEntry& e : entries) {
        const auto name_size = in.value<uint32_t>("a tensor name");
        MT_CHECK(name_size <= kMaxNameBytes, "[weights] '{}' is corrupt: tensor name of {} bytes",
                 path, name_size);
        const std::string name = in.string(name_size, "a tensor name");
        const auto ndim = in.value<uint32_t>("a tensor shape");
        MT_CHECK(ndim <= static_cast<uint32_t>(kMaxDims),
                 "[weights] '{}' is corrupt: tensor {} has {} dimensions", path, printable(name),
                 ndim);
        std::vector<int64_t> dims(ndim);
        in.read(dims.data(), sizeof(int64_t) * ndim, "a tensor shape");
        const std::vector<int64_t> model_dims(e.shape.dims.begin(),
                                              e.shape.dims.begin() + e.shape.ndim);
        MT_CHECK(name == e.name && dims == model_dims,
                 "{}  tensor {} is '{}' {} in the file but '{}' {} in the model", mismatch,
                 &e - entries.data(), name, shape_of(dims), e.name, shape_of(model_dims));
        expected_floats += static_cast<uint64_t>(e.numel);
    }
    MT_CHECK(num_floats == expected_floats,
             "[weights] '{}' is corrupt: its header counts {} elements, its tensors {}", path,
             num_floats, expected_floats);

    // Read everything before touching params, so a truncated file leaves the model as it was.
    std::vector<float> values(num_floats);
    in.read(values.data(), sizeof(float) * num_floats, "the parameter values");
    char extra;
    MT_CHECK(std::fread(&extra, 1, 1, f.get()) == 0,
             "[weights] '{}' has bytes after the last parameter value: not a file this build "
             "wrote, or two files joined",
             path);
    const float* src = values.data();
    for (const ParamEntry& e : entries) {
        std::memcpy(params + e.offset, src, sizeof(float) * static_cast<size_t>(e.numel));
        src += e.numel;
    }
}

void save_weights(const std::string& path, Model& model) {
    save_weights(path, model.param_entries(), model.params(),
                 describe_model_config(model.config()));
}

void load_weights(const std::string& path, Model& model) {
    load_weights(path, model.param_entries(), model.params(),
                 describe_model_config(model.config()));
}

}  // namespace moetron
