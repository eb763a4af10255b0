// bench::complex<T>: the declarations (definitions in complex_inl.h and arithmetic.h).

#pragma once

namespace bench {

template <typename T>
struct complex {
public:
    typedef T value_type;

    __device__ complex(const T& re = T(), const T& im = T());
    __device__ complex(const complex<T>& z);
    template <typename X>
    __device__ explicit complex(const complex<X>& z);

    __device__ complex<T>& operator=(const complex<T>& z);
    __device__ complex<T>& operator=(const T& re);

    __device__ complex<T>& operator+=(const complex<T>& z);
    __device__ complex<T>& operator-=(const complex<T>& z);
    __device__ complex<T>& operator*=(const complex<T>& z);
    __device__ complex<T>& operator/=(const complex<T>& z);

    __device__ T real() const { return data_[0]; }
    __device__ T imag() const { return data_[1]; }
    __device__ void real(T re) { data_[0] = re; }
    __device__ void imag(T im) { data_[1] = im; }

private:
    T data_[2];
};

template <typename T> __device__ T abs(const complex<T>& z);
template <typename T> __device__ T arg(const complex<T>& z);
template <typename T> __device__ T norm(const complex<T>& z);
template <typename T> __device__ complex<T> conj(const complex<T>& z);
template <typename T> __device__ complex<T> proj(const complex<T>& z);
template <typename T> __device__ complex<T> polar(const T& m, const T& theta = T());

template <typename T> __device__ complex<T> exp(const complex<T>& z);
template <typename T> __device__ complex<T> log(const complex<T>& z);
template <typename T> __device__ complex<T> log10(const complex<T>& z);
template <typename T> __device__ complex<T> pow(const complex<T>& x, const complex<T>& y);
template <typename T> __device__ complex<T> pow(const complex<T>& x, const T& y);
template <typename T> __device__ complex<T> pow(const T& x, const complex<T>& y);
template <typename T> __device__ complex<T> sqrt(const complex<T>& z);

}  // namespace bench
