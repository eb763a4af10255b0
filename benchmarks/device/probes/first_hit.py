"""Device-only probe: where the first warm hit of a CuPy 14 kernel goes, per ptxbackend tree."""
import cProfile, io, os, pstats, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import ab
mode, tree = sys.argv[1], sys.argv[2]
ab.activate_tree(tree)
import cupy, numpy
x = cupy.asarray(numpy.linspace(-2.0, 2.0, 1024, dtype=numpy.float32)); y = cupy.empty_like(x)
cupy.cuda.runtime.deviceSynchronize()
spec = lambda i: ("float32 x", "float32 y", "y = x * %d.5f + 1.25f" % i, "fh_k%d" % i)
prof = cProfile.Profile()
t = time.perf_counter()
if mode == "prof": prof.enable()
cupy.ElementwiseKernel(*spec(0))(x, y); cupy.cuda.runtime.deviceSynchronize()
if mode == "prof": prof.disable()
first = time.perf_counter() - t
t = time.perf_counter()
for i in range(1, 41):
    cupy.ElementwiseKernel(*spec(i))(x, y)
cupy.cuda.runtime.deviceSynchronize()
rest = (time.perf_counter() - t) / 40
import ptxbackend
print("RESULT %s %s first %.1f ms rest %.3f ms (ptxbackend %s)" % (mode, tree, first * 1e3, rest * 1e3, ptxbackend.__version__))
if mode == "prof":
    s = io.StringIO(); p = pstats.Stats(prof, stream=s); p.sort_stats("cumulative").print_stats(45)
    p.sort_stats("tottime").print_stats(25); print(s.getvalue())
