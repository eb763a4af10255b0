"""Build script.  Metadata lives in setup.cfg; this file only adds the start-up hook.

``ptxbackend.pth`` (and the PEP 829 ``ptxbackend.start`` that replaces it from
Python 3.15) must land in site-packages itself, where ``site`` reads them.
``data_files`` would put them in the environment root, so they are copied into
the build directory (wheels, ``pip install .``), the develop directory (legacy
``pip install -e .``) and the editable wheel (PEP 660 ``pip install -e .``).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.command.install_lib import install_lib

HOOK_FILES = ("ptxbackend.pth", "ptxbackend.start")
# What the .pth line imports at every interpreter start.
START_MODULES = ("_ptxbackend_pth.py", "_ptxbackend_env.py")
HERE = os.path.dirname(os.path.abspath(__file__))


def copy_hook_files(command, directory):
    for name in HOOK_FILES:
        command.copy_file(os.path.join(HERE, name), os.path.join(directory, name))


class BuildPyWithHook(build_py):
    def run(self):
        build_py.run(self)
        if not getattr(self, "editable_mode", False):
            copy_hook_files(self, self.build_lib)


class DevelopWithHook(develop):
    def run(self):
        develop.run(self)
        copy_hook_files(self, self.install_dir)


class InstallLibWithHook(install_lib):
    """``setup.py install`` (what pip 21 on Python 3.6 runs without the ``wheel`` package): lists the
    hook files among the installed ones, so ``pip uninstall`` removes them, and byte-compiles the
    modules the hook imports at every interpreter start even under PYTHONDONTWRITEBYTECODE (which
    makes distutils skip every module: +9-10 ms per start without the ``.pyc``)."""

    def run(self):
        install_lib.run(self)
        if self.compile and not self.dry_run:
            import py_compile
            from importlib.util import cache_from_source
            for name in START_MODULES:
                path = os.path.join(self.install_dir, name)
                if os.path.isfile(path):
                    py_compile.compile(path, cfile=cache_from_source(path), doraise=True)

    def get_outputs(self):
        hook = [os.path.join(self.install_dir, name) for name in HOOK_FILES]
        return install_lib.get_outputs(self) + [p for p in hook if os.path.isfile(p)]


commands = {"build_py": BuildPyWithHook, "develop": DevelopWithHook, "install_lib": InstallLibWithHook}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64 (Python 3.6): pip uses `develop` for editable installs
    editable_wheel = None

if editable_wheel is not None:
    class EditableWheelWithHook(editable_wheel):
        def _create_wheel_file(self, bdist_wheel):
            wheel_path = editable_wheel._create_wheel_file(self, bdist_wheel)
            from zipfile import ZIP_DEFLATED
            try:
                from wheel.wheelfile import WheelFile
            except ImportError:
                from setuptools._vendor.wheel.wheelfile import WheelFile
            with WheelFile(wheel_path, "a", ZIP_DEFLATED) as archive:
                for name in HOOK_FILES:
                    archive.write(os.path.join(HERE, name), name)
            return wheel_path

    commands["editable_wheel"] = EditableWheelWithHook

setup(cmdclass=commands)
