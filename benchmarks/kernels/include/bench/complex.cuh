// Synthetic stand-in for cupy/complex.cuh (see carray.cuh): a complex type for device code,
// split over several headers the way thrust's is.

#pragma once

#include <bench/complex/complex.h>
#include <bench/complex/math_private.h>
#include <bench/complex/complex_inl.h>
#include <bench/complex/arithmetic.h>
#include <bench/complex/cexp.h>
#include <bench/complex/clog.h>
#include <bench/complex/cpow.h>
