"""Builds wdsmp's native core from src/ext (Cython); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "wdsmp._tarsplit",
        ["src/ext/_tarsplit.pyx"],
        extra_compile_args=["-O3"],
    ),
    Extension(
        "wdsmp._imgops",
        ["src/ext/_imgops.pyx"],
        # No FMA contraction: the filter taps are computed in double exactly as
        # the pure-Python twin computes them, so both pick the same weights.
        extra_compile_args=["-O3", "-ffp-contract=off"],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3))
