// NF4: the 4-bit NormalFloat data type of QLoRA (Dettmers et al. 2023, "QLoRA:
// Efficient Finetuning of Quantized LLMs"), as bitsandbytes stores it: a tensor
// flattened row-major is cut into blocks of kNf4BlockSize values; each block keeps its
// absmax (fp32) and per value the index of the code nearest to value / absmax.
//
// Storage of one tensor of n values, in 4-byte words (the flat units' element):
//   words [0, blocks)          absmax of each block (fp32 bits), blocks = ceil(n / 64)
//   then ceil(n / 2) bytes     two codes per byte, the earlier value in the high nibble
//                              (bitsandbytes' order), zero-padded to a whole word.
// 64 values take 4 + 32 bytes: 0.5625 bytes per value.
//
// Quantize: q = argmin_i |x / absmax - kNf4Codes[i]| (x / absmax in fp32); a value
// exactly halfway between two codes takes the lower code (bitsandbytes' decision tree
// compares x > midpoint). A block of zeros has absmax 0 and all codes 7 (0.0).
// Dequantize: x' = kNf4Codes[q] * absmax in fp32 (what bitsandbytes computes).
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

inline constexpr int64_t kNf4BlockSize = 64;

// The 16 code values (bitsandbytes csrc/kernels.cu, the QLoRA paper's appendix).
inline constexpr float kNf4Codes[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

inline int64_t nf4_blocks(int64_t n) { return (n + kNf4BlockSize - 1) / kNf4BlockSize; }
// 4-byte words one tensor of n values occupies.
inline int64_t nf4_storage_words(int64_t n) { return nf4_blocks(n) + ((n + 1) / 2 + 3) / 4; }

// The code index nearest to v (v = x / absmax, in [-1, 1]), ties to the lower code.
int nf4_code_index(float v);

// Quantizes n finite fp32 values into nf4_storage_words(n) words at out (multi-threaded).
void nf4_quantize(const float* x, int64_t n, void* out);
// Dequantizes a tensor of n values stored at `in` into out (fp32, bf16 or fp16:
// the fp32 value code * absmax converted once), multi-threaded.
void nf4_dequantize(const void* in, int64_t n, TypedPtr out);

}  // namespace shardlm::cpu
