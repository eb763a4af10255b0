// bench::pow and sqrt for complex<T>.

#pragma once

namespace bench {

template <typename T>
__device__ inline complex<T> pow(const complex<T>& x, const complex<T>& y)
{
    if (x.real() == T(0) && x.imag() == T(0)) {
        return complex<T>(T(0), T(0));
    }
    return exp(log(x) * y);
}

template <typename T>
__device__ inline complex<T> pow(const complex<T>& x, const T& y)
{
    if (x.imag() == T(0) && x.real() > T(0)) {
        return complex<T>(detail::r_pow(x.real(), y), T(0));
    }
    return polar(detail::r_pow(abs(x), y), arg(x) * y);
}

template <typename T>
__device__ inline complex<T> pow(const T& x, const complex<T>& y)
{
    return pow(complex<T>(x, T(0)), y);
}

// The principal root, computed without cancellation for either sign of the real part.
template <typename T>
__device__ inline complex<T> sqrt(const complex<T>& z)
{
    T a = z.real(), b = z.imag();
    if (a == T(0) && b == T(0)) {
        return complex<T>(T(0), b);
    }
    T t = detail::r_sqrt((a < T(0) ? -a : a) / T(2) + abs(z) / T(2));
    if (a >= T(0)) {
        return complex<T>(t, b / (T(2) * t));
    }
    return complex<T>((b < T(0) ? -b : b) / (T(2) * t), detail::copy_sign(t, b));
}

}  // namespace bench
