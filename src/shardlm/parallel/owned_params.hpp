// A rank's owned parameters as fp32 values, whichever way its strategy stores them:
// fp32 masters (OwnedSlice::master), or, for the frozen units of a bf16/fp16 run, once
// in the compute type (OwnedSlice::stored). Initialisation, Hugging Face import,
// checkpoints and the finite check read and write parameters through these, so a
// frozen base held at 2 bytes per value needs no case of its own there.
//
// Host memory only: the slices of a host strategy, or of HostOwnedState on a device.
#pragma once

#include <cstdint>
#include <functional>

#include "shardlm/model/model.hpp"
#include "shardlm/parallel/owned_state.hpp"

namespace shardlm {

// Elements [first, first + n) of the unit (inside [s.begin, s.end)) as fp32: copied
// from the master, or widened (exactly) from the compute-type storage.
void read_owned_params(const OwnedSlice& s, int64_t first, int64_t n, float* out);
// Sets them from fp32 values: copied into the master, or rounded to nearest even into
// the compute-type storage (the value a compute copy of that master would hold).
void write_owned_params(const OwnedSlice& s, int64_t first, int64_t n, const float* values);
// All owned parameters zero.
void zero_owned_params(const OwnedSlice& s);
// The family's init (Model::init_range) of the owned slice of flat unit `unit`.
void init_owned_params(const Model& model, int unit, uint64_t seed, const OwnedSlice& s);
// Calls visit(first, n, values) over the owned parameters as fp32, in consecutive
// pieces (compute-type storage is widened through a bounded staging buffer).
void for_each_owned_params(const OwnedSlice& s,
                           const std::function<void(int64_t first, int64_t n, const float*)>& visit);

}  // namespace shardlm
