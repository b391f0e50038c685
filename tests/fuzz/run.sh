#!/usr/bin/env bash
# Runs one fuzz target against the instrumented build (build.sh), under AddressSanitizer:
#
#   tests/fuzz/run.sh tarsplit|imgops|jpegregion|gzipmembers|imageheaders [libFuzzer flags] [CORPUS_DIR ...]
#
# The build goes to $WDSMP_FUZZ_BUILD (default /tmp/wdsmp-fuzz-build) and is redone when
# a source in wdsmp/ or src/ext/ is newer than it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${1:?usage: tests/fuzz/run.sh tarsplit|imgops|jpegregion|gzipmembers|imageheaders [libFuzzer flags] [CORPUS_DIR ...]}
shift
build=${WDSMP_FUZZ_BUILD:-/tmp/wdsmp-fuzz-build}

if [ ! -f "$build/sites.txt" ] || [ -n "$(find "$repo/wdsmp" "$repo/src/ext" "$here/sancov.c" "$here/forward.c" \
        \( -name '*.py' -o -name '*.pyx' -o -name '*.c' -o -name '*.h' \) -newer "$build/sites.txt" -print -quit)" ]; then
    "$here/build.sh" "$build"
fi
# The ASan runtime is preloaded, after forward.so only (see forward.c: without it atheris
# counts no Python coverage), hence verify_asan_link_order=0, and before libstdc++, which
# it must find when it starts (atheris reports a Python exception by throwing a C++ one,
# and ASan's __cxa_throw interceptor fails its check if libstdc++ came later). Leaks are
# not checked (the interpreter keeps its objects at exit); an allocation too large for
# memory returns NULL (MemoryError in Python, as without ASan) instead of stopping the run.
export LD_PRELOAD="$build/forward.so $(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=0:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
exec "${PYTHON:-python}" "$here/fuzz_$target.py" --native="$build" "$@"
