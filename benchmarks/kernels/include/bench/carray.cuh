// Synthetic stand-in for Chainer 1.24's cupy/carray.cuh, for the warm-start benchmark's
// "headers" row.  What matters there is the shape of the include tree a hit has to re-validate:
// one header reached through an absolute -I directory that pulls in eight more, as CuPy v1's
// does.  Device-side only, no standard library headers, so that nvcc 11.2, nvcc 13 and NVRTC
// all accept it.

#pragma once

#include <bench/complex.cuh>

// Strides are in bytes, as in CuPy: a view may step by any multiple of the element size.
template <typename T, int ndim>
class CArray {
public:
    enum { ndim_ = ndim };

    __device__ long long size() const { return size_; }
    __device__ const long long* shape() const { return shape_; }
    __device__ const long long* strides() const { return strides_; }
    __device__ T* data() const { return data_; }

    __device__ T& operator[](const long long* idx) {
        char* ptr = reinterpret_cast<char*>(data_);
        for (int dim = 0; dim < ndim; ++dim) {
            ptr += strides_[dim] * idx[dim];
        }
        return *reinterpret_cast<T*>(ptr);
    }

    __device__ T operator[](const long long* idx) const {
        return (*const_cast<CArray<T, ndim>*>(this))[idx];
    }

    // A flat index in C order, turned into an offset one dimension at a time.
    __device__ T& operator[](long long i) {
        char* ptr = reinterpret_cast<char*>(data_);
        for (int dim = ndim; --dim > 0;) {
            ptr += strides_[dim] * (i % shape_[dim]);
            i /= shape_[dim];
        }
        if (ndim > 0) {
            ptr += strides_[0] * i;
        }
        return *reinterpret_cast<T*>(ptr);
    }

    __device__ T operator[](long long i) const {
        return (*const_cast<CArray<T, ndim>*>(this))[i];
    }

private:
    T* data_;
    long long size_;
    long long shape_[ndim];
    long long strides_[ndim];
};

template <typename T>
class CArray<T, 0> {
public:
    enum { ndim_ = 0 };

    __device__ long long size() const { return size_; }
    __device__ const long long* shape() const { return 0; }
    __device__ const long long* strides() const { return 0; }
    __device__ T* data() const { return data_; }

    __device__ T& operator[](const long long*) { return *data_; }
    __device__ T operator[](const long long*) const { return *data_; }
    __device__ T& operator[](long long) { return *data_; }
    __device__ T operator[](long long) const { return *data_; }

private:
    T* data_;
    long long size_;
};

template <int ndim>
class CIndexer {
public:
    enum { ndim_ = ndim };

    __device__ long long size() const { return size_; }

    __device__ void set(long long i) {
        long long a = i;
        for (int dim = ndim; --dim > 0;) {
            long long s = shape_[dim];
            index_[dim] = a % s;
            a /= s;
        }
        if (ndim > 0) {
            index_[0] = a;
        }
    }

    __device__ const long long* get() const { return index_; }

private:
    long long size_;
    long long shape_[ndim];
    long long index_[ndim];
};

template <>
class CIndexer<0> {
public:
    enum { ndim_ = 0 };

    __device__ long long size() const { return size_; }
    __device__ void set(long long) {}
    __device__ const long long* get() const { return 0; }

private:
    long long size_;
};

// Never called, so the kernels that include this tree compile to the same code as without it;
// it is here so that every compiler instantiates (and so checks) the templates above in full.
__device__ inline void bench_carray_instantiate(CArray<float, 2>& a, const CArray<bench::complex<double>, 1>& b,
                                                CArray<int, 0>& c, CIndexer<2>& ix, CIndexer<0>& ix0,
                                                long long i)
{
    ix.set(i);
    ix0.set(i);
    bench::complex<double> z = b[ix.get()[1]];
    bench::complex<float> w(a[ix.get()], a[i]);
    w = bench::sqrt(w) + bench::exp(w) * bench::log(w) - bench::pow(w, 2.5f);
    z = bench::pow(z, z) / bench::polar(bench::abs(z), bench::arg(z)) + bench::log10(z);
    c[i] = (int)(bench::norm(w) + bench::conj(z).imag() + bench::proj(w).real());
    a[ix.get()] = bench::complex<float>(z).real() * (float)ix0.size();
}
