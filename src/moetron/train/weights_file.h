// A minimal weights file: the trained parameters for `moetron sample`, written by
// `moetron train --save-final PATH`. Not a checkpoint (no optimizer state, data position or
// step): those come with the checkpoint format.
//
// Layout, version 1 (integers little-endian):
//   char[8]  magic "MTWEIGHT"
//   uint32   version = 1
//   uint32   num_entries
//   uint64   num_floats (total elements of all entries)
//   uint32   description length, then that many bytes: the model config it was saved from
//            (describe_model_config), quoted in errors
//   per entry: uint32 name length, name bytes, uint32 ndim, int64 dims[ndim]
//   float32  the entries' elements, entry after entry, in the order listed
// Loading checks the entry list against the model's (names and shapes, in order) and that the
// file ends exactly after the last element.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moetron/model/model.h"

namespace moetron {

inline constexpr char kWeightsMagic[8] = {'M', 'T', 'W', 'E', 'I', 'G', 'H', 'T'};
inline constexpr uint32_t kWeightsVersion = 1;

// entries index the flat buffer params (Model::param_entries(), Model::params()). Written
// atomically (atomic_file.h): path holds the old file or the whole new one.
void save_weights(const std::string& path, const std::vector<ParamEntry>& entries,
                  const float* params, std::string_view model_description);
// Throws naming the file and the problem (missing, not a weights file, another model's
// weights, truncated, trailing bytes). params is written only when the whole file checks out.
void load_weights(const std::string& path, const std::vector<ParamEntry>& entries, float* params,
                  std::string_view model_description);

void save_weights(const std::string& path, Model& model);
void load_weights(const std::string& path, Model& model);

}  // namespace moetron
