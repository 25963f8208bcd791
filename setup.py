"""The one compiled part: the optional C module behind tessera.ptx's accelerated path (tessera/ptx/fast.py;
the PyYAML CLoader pattern). Metadata lives in pyproject.toml; without a C compiler the build skips it
(optional=True) and the pure-Python reference path gives the same results."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tessera.ptx._fastscan", ["tessera/ptx/_fastscan.c"], optional=True,
                             extra_compile_args=["-O2"])])
