// bench::complex<T>: constructors and compound assignment.

#pragma once

namespace bench {

template <typename T>
__device__ inline complex<T>::complex(const T& re, const T& im)
{
    data_[0] = re;
    data_[1] = im;
}

template <typename T>
__device__ inline complex<T>::complex(const complex<T>& z)
{
    data_[0] = z.real();
    data_[1] = z.imag();
}

template <typename T>
template <typename X>
__device__ inline complex<T>::complex(const complex<X>& z)
{
    data_[0] = T(z.real());
    data_[1] = T(z.imag());
}

template <typename T>
__device__ inline complex<T>& complex<T>::operator=(const complex<T>& z)
{
    data_[0] = z.real();
    data_[1] = z.imag();
    return *this;
}

template <typename T>
__device__ inline complex<T>& complex<T>::operator=(const T& re)
{
    data_[0] = re;
    data_[1] = T();
    return *this;
}

template <typename T>
__device__ inline complex<T>& complex<T>::operator+=(const complex<T>& z)
{
    data_[0] += z.real();
    data_[1] += z.imag();
    return *this;
}

template <typename T>
__device__ inline complex<T>& complex<T>::operator-=(const complex<T>& z)
{
    data_[0] -= z.real();
    data_[1] -= z.imag();
    return *this;
}

template <typename T>
__device__ inline complex<T>& complex<T>::operator*=(const complex<T>& z)
{
    T re = data_[0] * z.real() - data_[1] * z.imag();
    T im = data_[0] * z.imag() + data_[1] * z.real();
    data_[0] = re;
    data_[1] = im;
    return *this;
}

// Smith's algorithm: no overflow in the intermediate products for large |z|.
template <typename T>
__device__ inline complex<T>& complex<T>::operator/=(const complex<T>& z)
{
    T a = data_[0], b = data_[1], c = z.real(), d = z.imag();
    T ac = c < T(0) ? -c : c;
    T ad = d < T(0) ? -d : d;
    if (ac >= ad) {
        T r = d / c, den = c + d * r;
        data_[0] = (a + b * r) / den;
        data_[1] = (b - a * r) / den;
    } else {
        T r = c / d, den = c * r + d;
        data_[0] = (a * r + b) / den;
        data_[1] = (b * r - a) / den;
    }
    return *this;
}

}  // namespace bench
