// bench::log and log10 for complex<T>.

#pragma once

namespace bench {

template <typename T>
__device__ inline complex<T> log(const complex<T>& z)
{
    return complex<T>(detail::r_log(abs(z)), arg(z));
}

template <typename T>
__device__ inline complex<T> log10(const complex<T>& z)
{
    // 1 / ln(10)
    return log(z) * T(0.43429448190325182765);
}

}  // namespace bench
