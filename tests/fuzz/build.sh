#!/usr/bin/env bash
# Builds the copy of wdsmp that the fuzz targets load with --native=DIR: the native
# core compiled with AddressSanitizer and gcc's coverage hooks
# (-fsanitize-coverage=trace-pc,trace-cmp), each extension linked with sancov.c, which
# hands its basic-block counts and comparisons to libFuzzer. DIR/sites.txt records each
# extension's number of instrumented basic blocks. DIR/forward.so (forward.c) is for
# run.sh to preload. Needs gcc, objdump and Cython.
#
#   tests/fuzz/build.sh DIR
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:?usage: tests/fuzz/build.sh DIR}
python=${PYTHON:-python}

rm -rf "$dir"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cp -r "$repo/wdsmp" "$repo/src" "$repo/setup.py" "$dir"/
rm -f "$dir"/wdsmp/*.so "$dir"/src/ext/_*.c  # Cython's output, not the C beside the .pyx
find "$dir" -name __pycache__ -prune -exec rm -rf {} +

gcc -O2 -Wall -fPIC -c "$repo/tests/fuzz/sancov.c" -o "$dir/sancov.o"
gcc -O2 -Wall -fPIC -shared "$repo/tests/fuzz/forward.c" -o "$dir/forward.so"
# sancov.o goes into LDFLAGS so that setup.py's libjpeg-turbo probe, compiled with the
# same CFLAGS, links too (and so _jpegregion is built here wherever it is built at all).
(cd "$dir" && CFLAGS="-fsanitize=address -fsanitize-coverage=trace-pc,trace-cmp -fno-omit-frame-pointer -g" \
    LDFLAGS="-fsanitize=address $dir/sancov.o" "$python" setup.py -q build_ext --inplace >/dev/null)

for so in "$dir"/wdsmp/_*.so; do
    echo "$(basename "$so" | cut -d. -f1) $(objdump -d "$so" | grep -c 'call.*<__sanitizer_cov_trace_pc>')"
done > "$dir/sites.txt"
echo "built $dir: instrumented basic blocks per extension:"
sed 's/^/  /' "$dir/sites.txt"
