// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord/TensorBoard event
// files frame their records; Debian packages no C/C++ CRC32C library, so a small
// table-driven one. Check value: crc32c("123456789") = 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardlm {

uint32_t crc32c(const void* data, size_t size);

// TFRecord's masked CRC: rotated right by 15 bits plus 0xa282ead8 (a CRC of data that
// holds CRCs stays informative).
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace shardlm
