// bench::exp for complex<T> (after cexp/cexpf: the special cases first).

#pragma once

namespace bench {

template <typename T>
__device__ inline complex<T> exp(const complex<T>& z)
{
    T x = z.real(), y = z.imag();
    if (y == T(0)) {
        return complex<T>(detail::r_exp(x), y);
    }
    if (x == T(0)) {
        T s, c;
        detail::r_sincos(y, &s, &c);
        return complex<T>(c, s);
    }
    if (!detail::is_finite(y)) {
        if (detail::is_nan(x) || x > T(0)) {
            return complex<T>(x, y - y);
        }
        return complex<T>(T(0), T(0));
    }
    return polar(detail::r_exp(x), y);
}

}  // namespace bench
