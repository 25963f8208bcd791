"""The one compiled part: the optional C scanner behind tessera.ptx's fast path (the PyYAML CLoader
pattern). Metadata lives in pyproject.toml; without a C compiler the build skips it (optional=True) and
tessera/ptx/lower.py runs in pure Python with the same results."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tessera.ptx._fastscan", ["tessera/ptx/_fastscan.c"], optional=True,
                             extra_compile_args=["-O2"])])
