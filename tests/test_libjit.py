"""`warm --libs` in parallel: the fatbin images of a real library, found, classified, split, refused.

The libraries are real: built here with nvcc (one PTX-only, one SASS-only), and cuDNN 7.1 from
cupy-cuda80 7.8.0 where this machine has it (PTXBACKEND_TEST_CUDNN7, default
/tmp/ptxb-cudnn7-build/libcudnn.so.7).  Each refusal is tested on a copy of a built library that
is valid in every other respect.  The GPU test runs the whole path on a GPU.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import REPO
from ptxbackend.gpu import fatbin
from ptxbackend.deploy import parallel_jit as libjit
from ptxbackend.gpu.fatbin import FatbinError

CUDNN7 = os.environ.get("PTXBACKEND_TEST_CUDNN7", "/tmp/ptxb-cudnn7-build/libcudnn.so.7")

KERNELS = {
    "add.cu": 'extern "C" __global__ void add1(float *x, int n)\n'
              '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }\n'
              '// The library\'s own use of its kernel, through its own CUDA runtime: the GPU test\'s check.\n'
              'extern "C" int ptxb_touch(void) { float *p; if (cudaMalloc(&p, 1024)) return 1;\n'
              '  add1<<<1, 256>>>(p, 256); int rc = (int)cudaDeviceSynchronize(); cudaFree(p); return rc; }\n',
    "mul.cu": 'extern "C" __global__ void mul2(float *x, int n)\n'
              '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }\n',
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, nvcc13):
    """{'ptx': path of a PTX-only (compute_75) library, 'sass': a SASS-only (sm_80, sm_90) one, 'rdc': the
    PTX-only one built with relocatable device code}."""
    work = tmp_path_factory.mktemp("libjit")
    sources = []
    for name, text in KERNELS.items():
        (work / name).write_text(text)
        sources.append(str(work / name))
    libs = {}
    # compute_75: the oldest PTX target CUDA 13's nvcc still emits (compute_52 needs an older nvcc).
    sass = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    ptx = ["-gencode", "arch=compute_75,code=compute_75"]
    for kind, gencode in (("ptx", ptx), ("sass", sass), ("rdc", ["-rdc=true"] + ptx)):
        out = str(work / ("lib%s.so" % kind))
        subprocess.check_call([nvcc13, "-shared", "-Xcompiler", "-fPIC"] + gencode + ["-o", out] + sources,
                              cwd=str(work))
        libs[kind] = out
    return libs


def _copy(tmp_path, path, name="libcopy.so"):
    target = str(tmp_path / name)
    shutil.copyfile(path, target)
    return target


def _patch(path, offset, fmt, *values):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(struct.pack(fmt, *values))


def _shdr(path, index):
    """File offset of section header ``index`` of a 64-bit ELF."""
    with open(path, "rb") as handle:
        head = handle.read(64)
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, = struct.unpack_from("<H", head, 0x3A)
    return shoff + index * shentsize


def _section_index(path, wanted):
    with open(path, "rb") as handle:
        sections = fatbin._section_headers(handle, os.path.getsize(path), path)
    return [s[0] for s in sections].index(wanted)


def _refusal(path):
    """The one-line FatbinError that reading ``path`` raises."""
    with pytest.raises(FatbinError) as exc:
        fatbin.read_images(path)
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# --------------------------------------------------------------------------- finding and classifying

def test_ptx_only_library_needs_the_jit_on_newer_gpus(built):
    images = fatbin.read_images(built["ptx"])
    with_ptx = [i for i in images if i.archs("ptx")]
    assert len(with_ptx) >= 2  # one image per .cu file
    for image in with_ptx:
        assert image.archs("ptx") == [75] and image.archs("sass") == []
        assert image.ptx_bytes > 100
        assert image.needs(90) == "jit" and image.needs(75) == "jit"
        assert image.needs(70) == "none"  # compute_75 PTX is too new for a 7.0 GPU


def test_sass_only_library_needs_no_jit_where_its_machine_code_runs(built):
    images = [i for i in fatbin.read_images(built["sass"]) if i.archs("sass")]
    assert len(images) >= 2
    for image in images:
        assert image.archs("sass") == [80, 90] and image.archs("ptx") == [] and image.ptx_bytes == 0
        assert image.needs(90) == "sass" and image.needs(86) == "sass"  # same major, not newer
        assert image.needs(75) == "none" and image.needs(100) == "none"  # no PTX to JIT anywhere else


def test_relocatable_images_are_left_to_the_runtime_that_links_them(built):
    """-rdc: the PTX sits in __nv_relfatbin, linked by the library's runtime at load time (cuLink*), so a
    plain load of each image would fill cache entries nobody looks up."""
    images = fatbin.read_images(built["rdc"])
    relocatable = [i for i in images if i.section == "__nv_relfatbin" and i.archs("ptx") == [75]]
    assert len(relocatable) >= 2
    assert all(i.needs(90) == "relocatable" for i in relocatable)
    assert libjit.plan(images, 90)["jit"] == []


def test_images_lie_where_the_file_says(built):
    with open(built["ptx"], "rb") as handle:
        data = handle.read()
    for image in fatbin.read_images(built["ptx"]):
        assert data[image.offset:image.offset + 4] == struct.pack("<I", fatbin.MAGIC)
        assert image.size >= 16  # nvcc also emits an empty image (the device link's) for -shared


def test_shares_are_balanced_by_ptx_size_largest_first():
    images = [fatbin.Image(n, 100, [fatbin.Entry("ptx", 52, size)]) for n, size in enumerate([50, 40, 30, 20, 10, 10])]
    shares = libjit.shares(images, 3, 90)
    assert [[i.ptx_bytes for i in share] for share in shares] == [[50, 10], [40, 10], [30, 20]]
    assert len(libjit.shares(images[:2], 16, 90)) == 2  # never more workers than images
    assert libjit.shares([], 4, 90) == []


def test_only_the_ptx_the_driver_picks_counts():
    image = fatbin.Image(0, 100, [fatbin.Entry("ptx", 50, 700), fatbin.Entry("ptx", 60, 900),
                                  fatbin.Entry("sass", 60, 5000)])
    assert (image.jit_bytes(90), image.jit_bytes(52), image.jit_bytes(35)) == (900, 700, 0)


def test_plan_groups_by_what_the_driver_does(built):
    images = fatbin.read_images(built["ptx"]) + fatbin.read_images(built["sass"])
    groups = libjit.plan(images, 90)
    assert len(groups["jit"]) >= 2 and len(groups["sass"]) >= 2
    assert sum(len(g) for g in groups.values()) == len(images)


@pytest.mark.skipif(not os.path.isfile(CUDNN7), reason="cuDNN 7.1 of cupy-cuda80 7.8.0 not on this machine")
def test_cudnn7_holds_ptx_only_images_for_the_h200():
    images = fatbin.read_images(CUDNN7)
    groups = libjit.plan(images, 90)
    # Measured on cupy-cuda80 7.8.0's libcudnn.so.7 (sha256 f7f1afa9...): 233 images in .nv_fatbin, 184
    # with PTX the H200 can JIT (none with sm_90 SASS), 49 with only SASS for older GPUs.
    assert (len(images), len(groups["jit"]), len(groups["sass"]), len(groups["none"])) == (233, 184, 0, 49)
    assert sum(i.ptx_bytes for i in groups["jit"]) == 269211580  # uncompressed PTX; 51.6 MB stored
    assert sum(i.jit_bytes(90) for i in groups["jit"]) == 269197390  # what the driver compiles: one per image


# --------------------------------------------------------------------------- refusals

def test_not_an_elf_file(tmp_path):
    path = tmp_path / "libfake.so"
    path.write_text("INPUT(libm.so.6)\n" * 10)  # a linker script, as some lib*.so are
    assert "not an ELF file" in _refusal(str(path))


@pytest.mark.parametrize("field, offset, fmt, value, says", [
    ("EI_DATA: big-endian", 5, "<B", 2, "big-endian"),
    ("e_shentsize", 0x3A, "<H", 0, "section headers of 0 bytes"),
    ("e_shstrndx", 0x3E, "<H", 999, "section-name table index 999"),
])
def test_elf_header_field_out_of_range(tmp_path, built, field, offset, fmt, value, says):
    path = _copy(tmp_path, built["ptx"])
    _patch(path, offset, fmt, value)
    assert says in _refusal(path), field


def test_section_name_table_outside_the_file(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    with open(path, "rb") as handle:
        head = handle.read(64)
    strndx, = struct.unpack_from("<H", head, 0x3E)
    _patch(path, _shdr(path, strndx) + 32, "<Q", 1 << 50)  # sh_size: never allocated
    assert "section-name table" in _refusal(path)


def test_fatbin_section_outside_the_file(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    _patch(path, _shdr(path, _section_index(path, ".nv_fatbin")) + 32, "<Q", 1 << 50)
    assert "(.nv_fatbin) claims" in _refusal(path)


def test_a_fatbin_section_without_file_bytes_is_not_read(tmp_path, built):
    """SHT_NOBITS occupies no file bytes, so its size is not checked against the file: it must not be read."""
    path = _copy(tmp_path, built["ptx"])
    header = _shdr(path, _section_index(path, ".nv_fatbin"))
    _patch(path, header + 4, "<I", 8)  # sh_type = SHT_NOBITS
    _patch(path, header + 32, "<Q", 1 << 50)
    assert fatbin.read_images(path) == []


def test_truncated_copy(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) * 2 // 3)
    assert "past the end" in _refusal(path)


def test_garbage_between_images(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    second = fatbin.read_images(path)[1]
    _patch(path, second.offset, "<I", 0xDEADBEEF)  # an image's magic overwritten
    assert "neither zero padding nor a fatbin header" in _refusal(path)


def test_image_larger_than_its_section(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    first = fatbin.read_images(path)[0]
    _patch(path, first.offset + 8, "<Q", 1 << 40)
    assert "fatbin image at offset %d claims" % first.offset in _refusal(path)


def test_image_header_cut_by_the_section_end(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    last = fatbin.read_images(path)[-1]
    header = _shdr(path, _section_index(path, ".nv_fatbin"))
    with open(path, "rb") as handle:
        handle.seek(header + 24)
        section_offset, = struct.unpack("<Q", handle.read(8))
    _patch(path, header + 32, "<Q", last.offset - section_offset + 8)  # the section ends inside its header
    assert "fatbin header at offset %d is cut short" % last.offset in _refusal(path)


def _parse_in_child(path):
    """read_images in a child with a time limit: a parse that never ends fails the test instead of hanging it."""
    code = "import sys; from ptxbackend.gpu import fatbin\ntry: fatbin.read_images(sys.argv[1])\n" \
           "except fatbin.FatbinError as exc: print(exc)"
    return subprocess.check_output([sys.executable, "-c", code, path], timeout=60, cwd=REPO).decode()


def test_image_header_of_zero_bytes_ends(tmp_path, built):
    """An image claiming no header and no payload would be found again at the same place forever."""
    path = _copy(tmp_path, built["ptx"])
    empty = [i for i in fatbin.read_images(path) if not i.entries][0]  # nvcc's empty device-link image
    _patch(path, empty.offset + 6, "<H", 0)
    assert "fatbin image at offset %d claims 0 + 0 bytes" % empty.offset in _parse_in_child(path)


def test_entry_header_cut_by_the_image_end(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    first = fatbin.read_images(path)[0]  # not the last: the next image's bytes follow it
    with open(path, "rb") as handle:
        handle.seek(first.offset)
        _, _, header_size, payload = struct.unpack("<IHHQ", handle.read(16))
    _patch(path, first.offset + 8, "<Q", payload + 16)  # 16 bytes more: too few for another entry header
    assert "fatbin entry header at offset %d runs past" % (first.offset + header_size + payload) in _refusal(path)


def test_entry_larger_than_its_image(tmp_path, built):
    path = _copy(tmp_path, built["ptx"])
    image = [i for i in fatbin.read_images(path) if i.archs("ptx")][0]
    _patch(path, image.offset + 16 + 8, "<Q", 1 << 40)  # the first entry's stored size
    assert "fatbin entry at offset %d claims" % (image.offset + 16) in _refusal(path)


def test_entry_header_of_zero_bytes_ends(tmp_path, built):
    """An entry claiming no header and no payload would be read again forever: a hang, not an error."""
    path = _copy(tmp_path, built["ptx"])
    image = [i for i in fatbin.read_images(path) if i.archs("ptx")][0]
    _patch(path, image.offset + 16 + 4, "<IQ", 0, 0)  # header size, stored size
    assert "fatbin entry at offset %d claims 0 + 0 bytes" % (image.offset + 16) in _parse_in_child(path)


@pytest.mark.parametrize("bundle", [False, True], ids=["warm", "driver-jit-bundle"])
def test_cli_names_a_malformed_library_in_one_line(tmp_path, built, bundle):
    """Both `warm --libs` and `warm --libs --driver-jit-bundle` read the images (the parallel path)."""
    path = _copy(tmp_path, built["ptx"], "libbroken.so")
    extra = ["--driver-jit-bundle", str(tmp_path / "jit.tgz")] if bundle else []
    second = fatbin.read_images(path)[1]
    _patch(path, second.offset, "<I", 0)
    _patch(path, second.offset + 4, "<I", 0x12345678)
    env = dict(os.environ, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"), CUDA_CACHE_PATH=str(tmp_path / "jit"))
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "warm", "--libs", path, "--jobs", "2"] + extra, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, cwd=REPO)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "neither zero padding nor a fatbin header" in failed[0]


def test_jobs_must_be_a_number_of_processes(tmp_path, built):
    for bad in ("0", "-2", "many"):
        proc = subprocess.run([sys.executable, "-m", "ptxbackend", "warm", "--libs", built["ptx"], "--jobs", bad],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, cwd=REPO,
                              env=dict(os.environ, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache")))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "argument --jobs: %r is not a number of processes (1 or more)" % bad in proc.stderr


def test_workers_that_cannot_start_are_reported(tmp_path, built):
    """A worker that fails (here: no usable driver) is one line in the report, not a traceback or a hang."""
    env = dict(os.environ, PTXBACKEND_LIBCUDA=str(tmp_path / "libcuda-missing.so.1"))
    report = libjit.warm(built["ptx"], fatbin.read_images(built["ptx"]), env, 2, 90)
    assert report["jobs"] == 2 and report["loaded"] == 0 and len(report["failed_workers"]) == 2
    assert all("libcuda-missing" in line and "\n" not in line for line in report["failed_workers"])


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.skipif("not __import__('conftest').gpu_available()", reason="needs an NVIDIA GPU and driver")
def test_parallel_warm_fills_the_cache_the_library_itself_reads(tmp_path, built):
    """warm --libs --jobs 2 JITs the PTX-only library's images; its own runtime then JITs nothing."""
    jit = str(tmp_path / "jit")
    env = dict(os.environ, CUDA_CACHE_PATH=jit, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CUDA_CACHE_DISABLE", None)
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "warm", "--libs", built["ptx"], "--jobs", "2"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 workers" in proc.stdout and "0 refused" in proc.stdout and "WARNING" not in proc.stdout
    filled = _files(jit)
    assert filled
    # The library's own kernel launch (its CUDA runtime) in a fresh process: a hit writes no new entry.
    touch = "import ctypes, sys; sys.exit(ctypes.CDLL(sys.argv[1]).ptxb_touch())"
    subprocess.check_call([sys.executable, "-c", touch, built["ptx"]], env=env)
    assert _files(jit) - filled == set(), "the library's runtime JIT-compiled again: the cache keys differ"
    # The control: over an empty cache, the same launch JITs and writes an entry.
    empty = str(tmp_path / "jit-empty")
    subprocess.check_call([sys.executable, "-c", touch, built["ptx"]], env=dict(env, CUDA_CACHE_PATH=empty))
    assert _files(empty)


def _files(top):
    """The files of a driver JIT cache (its index aside, which a hit may rewrite)."""
    return set(os.path.relpath(os.path.join(base, name), top) for base, _dirs, names in os.walk(top)
               for name in names if name != "index")


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('conftest').gpu_available()", reason="needs an NVIDIA GPU and driver")
def test_worker_refuses_a_range_that_is_no_longer_a_fatbin(built):
    image = [i for i in fatbin.read_images(built["ptx"]) if i.archs("ptx")][0]
    request = {"path": built["ptx"], "ranges": [[image.offset + 1, image.size], [image.offset, image.size]]}
    proc = subprocess.run([sys.executable, "-m", "ptxbackend.deploy.parallel_jit"], input=json.dumps(request),
                          stdout=subprocess.PIPE, universal_newlines=True, cwd=REPO, check=True)
    report = json.loads(proc.stdout)
    assert (report["loaded"], report["refused"]) == (1, 1) and "no longer a fatbin" in report["errors"][0]


def _report(first_growth, failed=()):
    """A warm_library result as the parallel path returns it (the numbers of a cuDNN-sized library)."""
    workers = [{"worker": n, "loaded": 46, "refused": 0, "seconds": 100.0 + n, "errors": []} for n in range(4)]
    parallel = {"images": 233, "skipped_sass": 0, "skipped_no_code": 49, "to_load": 184, "loaded": 184,
                "refused": 0, "ptx_bytes": 269211580, "jobs": 4, "workers": workers, "worker_seconds_sum": 406.0,
                "wall_s": 104.0, "device_cc": 90, "failed_workers": list(failed), "errors": [],
                "jit_cache_growth_bytes": 300 << 20}
    return {"parallel": parallel, "first": {"first_call_s": 2.5, "total_s": 3.0}, "first_growth_bytes": first_growth}


def test_report_says_what_the_parallel_jit_did(capsys):
    from ptxbackend.cli.commands import _print_parallel
    _print_parallel(_report(first_growth=0))
    out = capsys.readouterr().out
    assert "233 fatbin images, 0 skipped (SASS for this GPU), 49 skipped (no code it can use), 0 left to the " \
           "library's start (-rdc, linked at load), 184 loaded" in out
    assert "256.7 MiB of PTX; 4 workers 100.0/101.0/102.0/103.0 s, sum 406.0 s" in out and "wall 104.0 s" in out
    assert "own start then took 2.50 s and grew the JIT cache 0.0 MiB" in out and "WARNING" not in out


def test_report_says_plainly_when_the_library_still_jit_compiled(capsys):
    """The library's own start wrote as much JIT output again: the workers' loads missed its cache keys."""
    from ptxbackend.cli.commands import _print_parallel
    _print_parallel(_report(first_growth=290 << 20))
    out = capsys.readouterr().out
    assert "WARNING: the library's own start still JIT-compiled" in out and "keys did not match" in out


def test_report_names_a_failed_worker_and_warns(capsys):
    from ptxbackend.cli.commands import _print_parallel
    _print_parallel(_report(first_growth=0, failed=["CUDA_ERROR_OUT_OF_MEMORY: out of memory"]))
    out = capsys.readouterr().out
    assert "    CUDA_ERROR_OUT_OF_MEMORY: out of memory" in out and "a worker failed" in out
