#pragma once
// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors), readable and writable by
// the reference Python/Rust library, plus the random generator's state as a StateDict so it can ride along.
//
//   asc::StateDict sd = model->state_dict();
//   sd.merge(asc::generator_state_dict(asc::default_generator()), "rng.");
//   asc::save_safetensors("ckpt.safetensors", sd, {{"step", "1000"}});
//
//   std::map<std::string, std::string> meta;
//   asc::StateDict back = asc::load_safetensors("ckpt.safetensors", &meta);   // CPU tensors
//   asc::load_generator_state(asc::default_generator(), back.sub("rng."));
//
// File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
// (padded with spaces to a multiple of 8), then the raw little-endian data of every tensor, tightly packed; the
// offsets are relative to the start of the data and must cover it exactly (no holes, no overlaps).
// dtypes: F32 F64 I64 BOOL (1 byte, 0 or 1) BF16 F16 (raw 16-bit patterns; the CPU backend stores but does not
// compute with them). Every malformed file is an asc::Error naming the file and the problem.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/state_dict.h"

namespace asc {

// Writes `tensors` (any device: copied to host; non-contiguous ones packed) to `path`. Goes through
// `path + ".tmp"` and a rename, so a crash never leaves a half-written checkpoint under `path`.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file into CPU tensors (requires_grad false), ordered by their data offsets. The header's
// "__metadata__" goes to `*metadata` when given.
StateDict load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// The same, to / from memory. `what` names the source in error messages.
std::vector<uint8_t> serialize_safetensors(const StateDict& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
StateDict deserialize_safetensors(std::span<const uint8_t> bytes,
                                  std::map<std::string, std::string>* metadata = nullptr,
                                  const std::string& what = "<memory>");

// Generator state as {"seed", "offset"}: 0-d int64 tensors holding the uint64 bit patterns.
StateDict generator_state_dict(const Generator& gen);
// Restores it; validates both entries (present, int64, one element, nothing else) before changing `gen`.
void load_generator_state(Generator& gen, const StateDict& state);

}  // namespace asc
