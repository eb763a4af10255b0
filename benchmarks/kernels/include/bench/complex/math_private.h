// Bit access to IEEE floats and real-valued helpers overloaded for float and double, in the manner
// of FreeBSD's math_private.h that thrust's complex functions build on.

#pragma once

namespace bench {
namespace detail {

union ieee_float_shape {
    float value;
    unsigned int word;
};

union ieee_double_shape {
    double value;
    struct {
        unsigned int lsw;
        unsigned int msw;
    } parts;
};

__device__ inline unsigned int get_float_word(float f)
{
    ieee_float_shape u;
    u.value = f;
    return u.word;
}

__device__ inline float set_float_word(unsigned int w)
{
    ieee_float_shape u;
    u.word = w;
    return u.value;
}

__device__ inline void extract_words(unsigned int& hi, unsigned int& lo, double d)
{
    ieee_double_shape u;
    u.value = d;
    hi = u.parts.msw;
    lo = u.parts.lsw;
}

__device__ inline double insert_words(unsigned int hi, unsigned int lo)
{
    ieee_double_shape u;
    u.parts.msw = hi;
    u.parts.lsw = lo;
    return u.value;
}

__device__ inline bool is_finite(float x) { return (get_float_word(x) & 0x7f800000u) != 0x7f800000u; }
__device__ inline bool is_finite(double x)
{
    unsigned int hi, lo;
    extract_words(hi, lo, x);
    return (hi & 0x7ff00000u) != 0x7ff00000u;
}
__device__ inline bool is_nan(float x) { return x != x; }
__device__ inline bool is_nan(double x) { return x != x; }
__device__ inline float infinity(float) { return set_float_word(0x7f800000u); }
__device__ inline double infinity(double) { return insert_words(0x7ff00000u, 0u); }
__device__ inline float copy_sign(float x, float y) { return copysignf(x, y); }
__device__ inline double copy_sign(double x, double y) { return ::copysign(x, y); }

// The global math functions, chosen by overload so the templates need no std::.
__device__ inline float r_exp(float x) { return expf(x); }
__device__ inline double r_exp(double x) { return ::exp(x); }
__device__ inline float r_log(float x) { return logf(x); }
__device__ inline double r_log(double x) { return ::log(x); }
__device__ inline float r_sqrt(float x) { return sqrtf(x); }
__device__ inline double r_sqrt(double x) { return ::sqrt(x); }
__device__ inline float r_hypot(float x, float y) { return hypotf(x, y); }
__device__ inline double r_hypot(double x, double y) { return ::hypot(x, y); }
__device__ inline float r_atan2(float y, float x) { return atan2f(y, x); }
__device__ inline double r_atan2(double y, double x) { return ::atan2(y, x); }
__device__ inline float r_pow(float x, float y) { return powf(x, y); }
__device__ inline double r_pow(double x, double y) { return ::pow(x, y); }
__device__ inline void r_sincos(float x, float* s, float* c) { sincosf(x, s, c); }
__device__ inline void r_sincos(double x, double* s, double* c) { ::sincos(x, s, c); }

}  // namespace detail
}  // namespace bench
