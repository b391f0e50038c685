"""Builds wdsmp's native core from src/ext (Cython and C); everything else is in pyproject.toml.

``wdsmp.native._jpegregion`` links the system's libjpeg-turbo: it is built only when a
small test program using its region functions compiles and links here, and
skipped otherwise (with a notice), in which case wdsmp decodes whole JPEGs with
simplejpeg.
"""

import os
import tempfile

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

# The extension that needs libjpeg-turbo's headers and library.
JPEG_REGION = "wdsmp.native._jpegregion"

# 2.1 or later: earlier releases have bugs in jpeg_skip_scanlines (see its ChangeLog).
_JPEG_PROBE = """\
#include <stddef.h>
#include <stdio.h>
#include <jpeglib.h>
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
#error "libjpeg-turbo 2.1 or later is needed"
#endif
int main(void)
{
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr err;
    JDIMENSION x = 0, w = 0;
    cinfo.err = jpeg_std_error(&err);
    jpeg_create_decompress(&cinfo);
    if (0) {
        jpeg_mem_src(&cinfo, NULL, 0);
        jpeg_crop_scanline(&cinfo, &x, &w);
        jpeg_skip_scanlines(&cinfo, 1);
    }
    jpeg_destroy_decompress(&cinfo);
    return 0;
}
"""


def _libjpeg_turbo_usable(compiler):
    """Whether the probe above compiles and links with ``-ljpeg``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as stream:
            stream.write(_JPEG_PROBE)
        try:
            objects = compiler.compile([source], output_dir=tmp)
            # LDFLAGS as the extensions get them (a sanitizer build needs its runtime here too).
            compiler.link_executable(objects, "probe", output_dir=tmp, libraries=["jpeg"],
                                     extra_preargs=os.environ.get("LDFLAGS", "").split())
        except (CompileError, LinkError):  # the compiler has printed why
            return False
    return True


class BuildExt(build_ext):
    """build_ext that drops ``wdsmp.native._jpegregion`` when libjpeg-turbo is not usable, and builds
    the extensions side by side, one per CPU, unless ``--parallel`` says otherwise (a build is
    four large generated C files: about half the time on 2 cores)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    def build_extensions(self):
        if not _libjpeg_turbo_usable(self.compiler):
            self.warn(f"libjpeg-turbo 2.1+ headers and library not found; not building {JPEG_REGION}: "
                      "FastLoader will decode whole JPEGs (install libjpeg-turbo's -dev package and "
                      "reinstall wdsmp to get region decoding)")
            self.extensions = [ext for ext in self.extensions if ext.name != JPEG_REGION]
        super().build_extensions()


# Each .pyx wraps the hand-written C beside it (src/ext/*.c without the leading
# underscore of Cython's generated files); depends lists the headers, for sdists
# and for rebuilding when one changes.
extensions = [
    Extension(
        "wdsmp.native._tarsplit",
        ["src/ext/_tarsplit.pyx"],
        extra_compile_args=["-O3"],
    ),
    Extension(
        "wdsmp.native._imgops",
        ["src/ext/_imgops.pyx", "src/ext/imgops_kernels.c"],
        include_dirs=["src/ext"],
        depends=["src/ext/imgops_kernels.h"],
        # No FMA contraction: the filter taps are computed in double exactly as
        # the pure-Python twin computes them, so both pick the same weights.
        extra_compile_args=["-O3", "-ffp-contract=off"],
    ),
    Extension(
        "wdsmp.native._pilimage",
        ["src/ext/_pilimage.pyx"],
        extra_compile_args=["-O3"],
    ),
    Extension(
        JPEG_REGION,
        ["src/ext/_jpegregion.pyx", "src/ext/jpegregion.c"],
        include_dirs=["src/ext"],
        depends=["src/ext/jpegregion.h"],
        libraries=["jpeg"],
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3), cmdclass={"build_ext": BuildExt})
