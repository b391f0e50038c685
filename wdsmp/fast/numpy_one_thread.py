"""A spawned worker's first import: numpy, with its BLAS started on one thread.

OpenBLAS, in numpy's wheels, starts a thread per core as it loads, and they
spin a while: about 0.1 s of CPU per worker, taken from the cores that make
the first batches (``benchmarks/RESULTS.md``). Workers multiply no matrices; a
user's stage that does gets one BLAS thread per worker, as DataLoader's
workers get one torch thread. The variables are set only while numpy loads:
what the workers, and the processes a stage starts, find in their environment
is the user's, and a variable the user set is kept.
"""

import os

_THREAD_COUNTS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _load_numpy() -> None:
    set_here = [name for name in _THREAD_COUNTS if name not in os.environ]
    for name in set_here:
        os.environ[name] = "1"
    try:
        import numpy  # noqa: F401  (loaded now, with the counts above)
    finally:
        for name in set_here:
            os.environ.pop(name, None)


_load_numpy()
