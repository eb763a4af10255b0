// bench::complex<T>: operators and the basic functions.

#pragma once

namespace bench {

template <typename T>
__device__ inline complex<T> operator+(const complex<T>& a, const complex<T>& b)
{
    return complex<T>(a.real() + b.real(), a.imag() + b.imag());
}

template <typename T>
__device__ inline complex<T> operator+(const complex<T>& a, const T& b)
{
    return complex<T>(a.real() + b, a.imag());
}

template <typename T>
__device__ inline complex<T> operator-(const complex<T>& a, const complex<T>& b)
{
    return complex<T>(a.real() - b.real(), a.imag() - b.imag());
}

template <typename T>
__device__ inline complex<T> operator-(const complex<T>& a, const T& b)
{
    return complex<T>(a.real() - b, a.imag());
}

template <typename T>
__device__ inline complex<T> operator-(const complex<T>& a)
{
    return complex<T>(-a.real(), -a.imag());
}

template <typename T>
__device__ inline complex<T> operator*(const complex<T>& a, const complex<T>& b)
{
    complex<T> out(a);
    out *= b;
    return out;
}

template <typename T>
__device__ inline complex<T> operator*(const complex<T>& a, const T& b)
{
    return complex<T>(a.real() * b, a.imag() * b);
}

template <typename T>
__device__ inline complex<T> operator/(const complex<T>& a, const complex<T>& b)
{
    complex<T> out(a);
    out /= b;
    return out;
}

template <typename T>
__device__ inline complex<T> operator/(const complex<T>& a, const T& b)
{
    return complex<T>(a.real() / b, a.imag() / b);
}

template <typename T>
__device__ inline bool operator==(const complex<T>& a, const complex<T>& b)
{
    return a.real() == b.real() && a.imag() == b.imag();
}

template <typename T>
__device__ inline bool operator!=(const complex<T>& a, const complex<T>& b)
{
    return !(a == b);
}

template <typename T>
__device__ inline T abs(const complex<T>& z)
{
    return detail::r_hypot(z.real(), z.imag());
}

template <typename T>
__device__ inline T arg(const complex<T>& z)
{
    return detail::r_atan2(z.imag(), z.real());
}

template <typename T>
__device__ inline T norm(const complex<T>& z)
{
    return z.real() * z.real() + z.imag() * z.imag();
}

template <typename T>
__device__ inline complex<T> conj(const complex<T>& z)
{
    return complex<T>(z.real(), -z.imag());
}

// Infinities project onto the real axis (C99 cproj).
template <typename T>
__device__ inline complex<T> proj(const complex<T>& z)
{
    if (!detail::is_finite(z.real()) || !detail::is_finite(z.imag())) {
        return complex<T>(detail::infinity(T()), detail::copy_sign(T(0), z.imag()));
    }
    return z;
}

template <typename T>
__device__ inline complex<T> polar(const T& m, const T& theta)
{
    T s, c;
    detail::r_sincos(theta, &s, &c);
    return complex<T>(m * c, m * s);
}

}  // namespace bench
