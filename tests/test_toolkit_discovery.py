"""Where nvcc comes from, as its error messages name it."""

import os

import pytest

from ptxbackend.compilers import nvcc as nvcc_module
from ptxbackend.errors import CompilerNotFoundError


def test_nvcc_from_the_variable_is_named_as_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVCC", str(tmp_path / "nope"))
    with pytest.raises(CompilerNotFoundError, match=r"given by the environment \(PTXBACKEND_NVCC\)"):
        nvcc_module.find_nvcc(str(tmp_path / "nope"))


DEFAULT_NVCC = os.path.join(nvcc_module.DEFAULT_TOOLKIT, "bin", "nvcc")


@pytest.mark.skipif(not os.access(DEFAULT_NVCC, os.X_OK), reason="no toolkit at /usr/local/cuda on this machine")
def test_a_toolkit_at_the_default_place_is_found_and_compiles_when_nothing_names_one(tmp_path, monkeypatch):
    """The installers' /usr/local/cuda, not on PATH: found as CuPy finds it, and it builds."""
    import ptxbackend
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("gcc", "g++", "cc", "c++", "sh"):  # nvcc's host compiler, and nothing of CUDA's
        found = __import__("shutil").which(tool)
        if found:
            os.symlink(found, str(bare / tool))
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("PTXBACKEND_NVCC", raising=False)
    assert nvcc_module.find_nvcc() == DEFAULT_NVCC
    from conftest import SAXPY
    built = ptxbackend.compile(SAXPY, target="compute_75", compiler="nvcc")
    assert built.producer.startswith("nvcc-") and b".entry" in built.image


def test_the_default_place_is_not_searched_when_a_variable_names_a_toolkit(tmp_path, monkeypatch):
    """CUDA_PATH (or CUDA_HOME) naming a directory without nvcc is the user's word: no guess overrides it."""
    fake = tmp_path / "default" / "bin"
    fake.mkdir(parents=True)
    (fake / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nvcc").chmod(0o755)
    monkeypatch.setattr(nvcc_module, "DEFAULT_TOOLKIT", str(tmp_path / "default"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PTXBACKEND_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert nvcc_module.find_nvcc() == str(fake / "nvcc")
    for variable in ("CUDA_PATH", "CUDA_HOME"):
        monkeypatch.setenv(variable, str(tmp_path / "elsewhere"))
        with pytest.raises(CompilerNotFoundError) as info:
            nvcc_module.find_nvcc()
        assert "elsewhere" in str(info.value) and str(fake) not in str(info.value)
        monkeypatch.delenv(variable)
