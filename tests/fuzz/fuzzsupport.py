"""What wdsmp's fuzz targets share: which wdsmp they test, seeds, and native coverage.

A target runs against the installed wdsmp by default; atheris then sees only Python
coverage (the twins, tarformat, the target itself). With ``--native=DIR`` it runs
against the copy that ``build.sh DIR`` built: the extensions compiled with
AddressSanitizer and gcc's ``-fsanitize-coverage=trace-pc,trace-cmp``, each linked with
``sancov.c``, which hands their basic-block counts and integer comparisons to the
libFuzzer inside atheris. ``run.sh`` sets that up (the ASan runtime must be loaded first).

Everything else on the command line goes to libFuzzer as atheris passes it
(``-max_total_time=600``, ``-runs=N``, corpus directories, crash files to replay).
"""

import ctypes
import os
import shutil
import sys
import tempfile

import atheris

__all__ = ["Feedback", "NativeCoverage", "fuzz", "load_wdsmp"]


def _take_option(argv, name):
    """Remove ``--name=VALUE`` from argv (libFuzzer must not see it); VALUE or None."""
    value = None
    for arg in list(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
            argv.remove(arg)
    return value


def _asan_loaded():
    with open("/proc/self/maps") as maps:
        return any("libasan" in line for line in maps)


def load_wdsmp(argv, modules):
    """Import ``modules`` (names under ``wdsmp``), Python code instrumented for atheris,
    from the build named by ``--native=DIR`` in argv or else from the installed wdsmp.

    Returns ``(module objects, NativeCoverage or None)``.
    """
    build = _take_option(argv, "native")
    if build is not None:
        build = os.path.abspath(build)
        if not os.path.isfile(os.path.join(build, "sites.txt")):
            sys.exit(f"--native={build}: not a build of tests/fuzz/build.sh")
        if not _asan_loaded():
            sys.exit("--native needs the ASan runtime loaded first: "
                     "LD_PRELOAD=$(gcc -print-file-name=libasan.so) (tests/fuzz/run.sh does it)")
        sys.path.insert(0, build)
    import importlib

    with atheris.instrument_imports(include=["wdsmp"]):
        loaded = [importlib.import_module(f"wdsmp.{name}") for name in modules]
    import wdsmp

    where = os.path.dirname(os.path.dirname(os.path.abspath(wdsmp.__file__)))
    if build is not None and where != build:
        sys.exit(f"wdsmp was imported from {where}, not from the build {build}")
    print(f"fuzzing wdsmp from {where}" + (" (ASan, native coverage)" if build else " (Python coverage only)"),
          file=sys.stderr)
    return loaded, (NativeCoverage(build) if build is not None else None)


class NativeCoverage:
    """Registers instrumented extensions with libFuzzer once it is loaded (atheris loads
    it when fuzzing starts, so :meth:`start` is called from the first input)."""

    def __init__(self, build):
        with open(os.path.join(build, "sites.txt")) as stream:
            self.sites = {name: int(count) for name, count in (line.split() for line in stream)}
        self.extensions = []
        self.started = False

    def add(self, extension):
        """Count ``extension`` (a module of the build) once fuzzing starts."""
        self.extensions.append(extension)

    def start(self):
        if self.started:
            return
        self.started = True
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "core_with_libfuzzer" in line}
        if len(paths) != 1:
            sys.exit(f"cannot tell which library is libFuzzer: {sorted(paths)}")
        libfuzzer = paths.pop().encode()
        for extension in self.extensions:
            name = extension.__name__.rsplit(".", 1)[1]
            register = ctypes.CDLL(extension.__file__).wdsmp_cov_register
            register.argtypes = [ctypes.c_char_p, ctypes.c_long]
            if register(libfuzzer, self.sites[name]) != 0:
                sys.exit(f"could not register {extension.__file__} with libFuzzer")


class Feedback:
    """Coverage for what no instrumentation sees: ``feedback(label)`` counts one of
    ``size`` extra libFuzzer counters, one per distinct label (labels past ``size``
    share them), so an input that produces a new label (say, a new libjpeg-turbo
    error message) is kept like one that reaches new code. Make it before fuzzing
    starts: atheris allocates the counters reserved by then."""

    def __init__(self, size=1024):
        self.pool = [atheris._reserve_counter() for _ in range(size)]
        self.counters = {}

    def __call__(self, label):
        counter = self.counters.get(label)
        if counter is None:
            counter = self.counters[label] = self.pool[len(self.counters) % len(self.pool)]
        atheris._trace_branch(counter)


def _remove_at_exit(path):
    """Remove ``path`` when the process exits: libFuzzer ends with C's exit(), which runs
    C exit handlers but not Python's atexit."""

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def remove(_):
        shutil.rmtree(path, ignore_errors=True)

    _remove_at_exit.keep = getattr(_remove_at_exit, "keep", []) + [remove]  # the callback must outlive us
    ctypes.CDLL(None).__cxa_atexit(remove, None, None)


def fuzz(argv, test_one_input, seeds, coverage=None):
    """Run libFuzzer on ``test_one_input``.

    ``seeds`` (a list of bytes) are written to a temporary directory, given to libFuzzer
    as a corpus directory after those on the command line (new inputs go to the first
    one named, created if missing; with none named, to the temporary one) and removed at
    exit (not after an ASan report or a signal), and kept in the corpus even where they
    add no coverage (``-keep_seed=1``, unless the command line says otherwise: what the
    seeds differ in may be invisible to the instrumentation); not when the command line
    names only files, which libFuzzer then runs once each (a crash to replay).
    """
    positional = [arg for arg in argv[1:] if not arg.startswith("-")]
    for arg in positional:
        if not os.path.exists(arg):
            os.makedirs(arg)  # a corpus directory to start
    seed_dir = None
    if not positional or any(os.path.isdir(arg) for arg in positional):
        seed_dir = tempfile.mkdtemp(prefix="wdsmp-fuzz-seeds-")
        for i, seed in enumerate(seeds):
            with open(os.path.join(seed_dir, f"seed-{i:03d}"), "wb") as stream:
                stream.write(seed)
        argv = argv + [seed_dir]
        if not any(arg.startswith("-keep_seed=") for arg in argv):
            argv.append("-keep_seed=1")

    started = []

    def target(data):
        if not started:  # libFuzzer is loaded by now
            started.append(True)
            if seed_dir is not None:
                _remove_at_exit(seed_dir)
            if coverage is not None:
                coverage.start()
        try:
            test_one_input(data)
        except BaseException:  # a finding: the interpreter is finalized before C's exit handlers run
            if seed_dir is not None:
                shutil.rmtree(seed_dir, ignore_errors=True)
            raise

    atheris.Setup(argv, target)
    atheris.Fuzz()
