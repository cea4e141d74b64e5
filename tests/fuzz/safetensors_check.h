// The property the safetensors fuzzer checks, shared by the libFuzzer target
// (fuzz_safetensors.cpp) and the corpus replay in test_safetensors.cpp.
//
// Any byte string is either rejected with moetron::Error, or it opens, and then: every tensor
// reads back as exactly the bytes at its offsets, and writing the tensors and metadata again with
// SafetensorsWriter gives a file that opens to the same entries, offsets, metadata and bytes.
// Anything else (another exception type, a crash, a sanitizer report) is a bug.
//
// Each input is tried in two forms: as a file, byte for byte; and as "JSON header, NUL, data",
// from which the file is built with the right length prefix. Mutations of the JSON keep the second
// form consistent, so the fuzzer reaches the header checks instead of stopping at the prefix.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fuzz/memory_file.h"
#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"

namespace moetron::fuzz {

// Fails loudly: abort() is what both libFuzzer and ctest report as a failure.
inline void require(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "safetensors property violated: %s\n", what);
        std::abort();
    }
}

// Returns true when the input is a valid file (and the properties above hold), false when it was
// rejected with moetron::Error.
inline bool check_safetensors_bytes(const uint8_t* data, size_t size) {
    MemoryFile input;
    write_all(input.fd(), data, size, input.path());
    std::vector<SafetensorsEntry> entries;
    std::map<std::string, std::string> metadata;
    std::vector<std::vector<char>> contents;
    try {
        const SafetensorsFile file = SafetensorsFile::open(input.path());
        entries = file.tensors();
        metadata = file.metadata();
        for (const SafetensorsEntry& e : entries) {
            std::vector<char>& bytes = contents.emplace_back(e.num_bytes());
            file.read(e.name, e.dtype, e.dims, bytes.data(), bytes.size());
            if (e.dims.size() <= static_cast<size_t>(kMaxDims)) {
                // numel() multiplies in int64: UBSan reports it if the reader let an overflow by.
                const int64_t numel = e.shape().numel();
                require(static_cast<uint64_t>(numel) * dtype_size_bytes(e.dtype) == e.num_bytes(),
                        "shape matches the byte count");
            }
            require(file.data_offset() + e.end <= size, "tensor inside the input");
            require(std::equal(bytes.begin(), bytes.end(),
                               reinterpret_cast<const char*>(data) + file.data_offset() + e.begin),
                    "tensor bytes equal the input's bytes at its offsets");
        }
    } catch (const Error&) {
        return false;
    }

    // Round trip through the writer: the reader sorted the entries by offset, so writing them in
    // that order reproduces the offsets.
    SafetensorsWriter writer;
    for (size_t i = 0; i < entries.size(); ++i)
        writer.add(entries[i].name, entries[i].dtype, entries[i].dims, contents[i].data());
    for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
    MemoryFile output;
    const FileDigest digest = writer.write(output.path());
    require(digest.num_bytes == file_size_bytes(output.fd(), output.path()),
            "digest counts every byte written");
    const SafetensorsFile again = SafetensorsFile::open(output.path());
    require(again.metadata() == metadata, "metadata round-trips");
    require(again.tensors().size() == entries.size(), "tensor count round-trips");
    require(again.data_offset() % 8 == 0, "writer aligns the data buffer");
    for (size_t i = 0; i < entries.size(); ++i) {
        const SafetensorsEntry& a = entries[i];
        const SafetensorsEntry& b = again.tensors()[i];
        require(a.name == b.name && a.dtype == b.dtype && a.dims == b.dims && a.begin == b.begin &&
                    a.end == b.end,
                "entries round-trip");
        std::vector<char> bytes(b.num_bytes());
        again.read_bytes(b, bytes.data(), bytes.size());
        require(bytes == contents[i], "tensor bytes round-trip");
    }
    return true;
}

// The second form: bytes before the first NUL are the header, bytes after it the data buffer.
inline std::string file_from_header_and_data(const uint8_t* data, size_t size) {
    const auto* nul = size ? static_cast<const uint8_t*>(std::memchr(data, 0, size)) : nullptr;
    const size_t header_bytes = nul ? static_cast<size_t>(nul - data) : size;
    const uint64_t prefix = header_bytes;
    std::string file(reinterpret_cast<const char*>(&prefix), 8);
    if (size) file.append(reinterpret_cast<const char*>(data), size);
    if (nul) file.erase(8 + header_bytes, 1);
    return file;
}

// Both forms; returns whether each was a valid file.
struct FormsValid {
    bool as_file = false;
    bool as_header_and_data = false;
};
inline FormsValid check_both_forms(const uint8_t* data, size_t size) {
    FormsValid valid;
    valid.as_file = check_safetensors_bytes(data, size);
    const std::string built = file_from_header_and_data(data, size);
    valid.as_header_and_data =
        check_safetensors_bytes(reinterpret_cast<const uint8_t*>(built.data()), built.size());
    return valid;
}

}  // namespace moetron::fuzz
