"""Builds wdsmp's native core from src/ext (Cython); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "wdsmp._tarsplit",
        ["src/ext/_tarsplit.pyx"],
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3))
