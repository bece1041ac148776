// Element types of the cache and bit-exact conversions between them.
//
// The conversions are PAGEDKV_HOST_DEVICE and work on raw bit patterns, so the CPU backend and
// the GPU produce identical bytes (round to nearest even everywhere; fp8 saturates to +-448).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "pagedkv/macros.hpp"

namespace pagedkv {

/// Element type of a pool or of an input/output tensor.
enum class DType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat8E4M3 = 3,  // OCP e4m3fn: no infinities, max finite 448, NaN = 0x7f / 0xff
};

inline constexpr int kNumDTypes = 4;

/// Size of one element in bytes.
PAGEDKV_HOST_DEVICE constexpr size_t dtype_size(DType t) {
  return t == DType::kFloat32 ? 4 : (t == DType::kFloat8E4M3 ? 1 : 2);
}

/// "fp16", "bf16", "fp32", "fp8_e4m3".
const char* dtype_name(DType t);

/// Parses the names above (and "float16", "bfloat16", "float32", "fp8"); false if unknown.
bool parse_dtype(const char* name, DType* out);

namespace detail {

PAGEDKV_HOST_DEVICE uint32_t float_bits(float f) {
#if PAGEDKV_DEVICE_COMPILE && defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

PAGEDKV_HOST_DEVICE float bits_float(uint32_t u) {
#if PAGEDKV_DEVICE_COMPILE && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

}  // namespace detail

// ---- fp16 (IEEE binary16) ----

/// binary16 bits to float (exact).
PAGEDKV_HOST_DEVICE float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return detail::bits_float(bits);
}

/// float to binary16 bits, round to nearest even; overflow gives infinity, NaN stays NaN.
PAGEDKV_HOST_DEVICE uint16_t float_to_half_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {               // result is subnormal or zero (|f| < 2^-14)
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal: zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // in [14, 24]
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = ((abs >> 13) - ((127u - 15u) << 10)) & 0xffffu;
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

// ---- bf16 ----

/// bfloat16 bits to float (exact).
PAGEDKV_HOST_DEVICE float bf16_bits_to_float(uint16_t b) {
  return detail::bits_float(static_cast<uint32_t>(b) << 16);
}

/// float to bfloat16 bits, round to nearest even; NaN stays NaN.
PAGEDKV_HOST_DEVICE uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// ---- fp8 e4m3 (OCP "fn": bias 7, no inf, max 448) ----

/// e4m3 bits to float (exact).
PAGEDKV_HOST_DEVICE float fp8_e4m3_bits_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t mant = v & 0x7u;
  if (exp == 0xf && mant == 0x7) return detail::bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // subnormal: mant * 2^-9
    const float mag = static_cast<float>(mant) * 0.001953125f;
    return sign ? -mag : mag;
  }
  return detail::bits_float(sign | (exp + 127u - 7u) << 23 | mant << 20);
}

/// float to e4m3 bits, round to nearest even, saturating to +-448; NaN gives 0x7f/0xff.
PAGEDKV_HOST_DEVICE uint8_t float_to_fp8_e4m3_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): 448
  if (abs < 0x3c800000u) {               // |f| < 2^-6: subnormal range, step 2^-9
    if (abs < 0x3a000000u) return sign;  // < 2^-11 (half the smallest subnormal): zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141u - exp;  // value = mant * 2^(exp-150); want units of 2^-9
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint8_t>(sign | result);
  }
  uint32_t result = ((abs >> 20) - ((127u - 7u) << 3)) & 0xffu;
  const uint32_t rem = abs & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (result & 1u))) ++result;
  if (result > 0x7eu) result = 0x7eu;  // rounding up past 448 saturates
  return static_cast<uint8_t>(sign | result);
}

/// Reads element `i` of a buffer of type `t` as float.
PAGEDKV_HOST_DEVICE float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat8E4M3:
    default:
      return fp8_e4m3_bits_to_float(static_cast<const uint8_t*>(base)[i]);
  }
}

/// Writes `v` as element `i` of a buffer of type `t` (rounding as above).
PAGEDKV_HOST_DEVICE void store_from_float(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_half_bits(v);
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v);
      break;
    case DType::kFloat32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kFloat8E4M3:
    default:
      static_cast<uint8_t*>(base)[i] = float_to_fp8_e4m3_bits(v);
      break;
  }
}

}  // namespace pagedkv
