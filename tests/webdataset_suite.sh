#!/usr/bin/env bash
# Run webdataset 1.0.2's own test suite against wdsmp.
#
#   bash tests/webdataset_suite.sh [--against wdsmp|webdataset] [WORKDIR] [-- PYTEST ARGS]
#
# Downloads webdataset's source distribution with pip (network needed; not part of
# the regular suite or CI), unpacks its tests/ into WORKDIR (default
# /tmp/wdsmp-webdataset-suite), rewrites their imports from webdataset to wdsmp,
# writes the data files and conftest.py the distribution lacks
# (tests/webdataset_suite_data.py), serves the "remote" shards on 127.0.0.1 with
# http.server (the tests' storage.googleapis.com URLs are pointed there), and runs
# pytest. `--against webdataset` runs the same tests, data and server against
# webdataset itself (when it is installed), which checks the data. No webdataset
# code is kept in this repository: it lives in WORKDIR only.
set -euo pipefail

VERSION=1.0.2
AGAINST=wdsmp
if [[ "${1:-}" == "--against" ]]; then
    AGAINST=$2
    shift 2
fi
WORKDIR=/tmp/wdsmp-webdataset-suite
if [[ $# -gt 0 && "$1" != "--" ]]; then
    WORKDIR=$1
    shift
fi
[[ "${1:-}" == "--" ]] && shift
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python}

case "$AGAINST" in
    wdsmp | webdataset) ;;
    *) echo "--against takes wdsmp or webdataset, not $AGAINST" >&2; exit 2 ;;
esac

SDIST=$WORKDIR/webdataset-$VERSION.tar.gz
mkdir -p "$WORKDIR"
if [[ ! -f $SDIST ]]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "webdataset==$VERSION" -d "$WORKDIR"
fi
ROOT=$WORKDIR/$AGAINST
rm -rf "$ROOT"
mkdir -p "$ROOT"
tar -xzf "$SDIST" -C "$ROOT" --strip-components=1 "webdataset-$VERSION/tests"

PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export WDSMP_SUITE_REMOTE="http://127.0.0.1:$PORT/"
# The tests' fixed URLs: the data bucket (served here) and a file that must be missing.
sed -i -E \
    -e "s#https?://storage.googleapis.com/webdataset/testdata/#${WDSMP_SUITE_REMOTE}#g" \
    -e "s#https?://storage.googleapis.com/nvdata-openimages/#${WDSMP_SUITE_REMOTE}#g" \
    "$ROOT"/tests/*.py
if [[ $AGAINST == wdsmp ]]; then
    sed -i -E 's/^(\s*)(import|from) webdataset\b/\1\2 wdsmp/' "$ROOT"/tests/*.py
fi

PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$REPO/tests/webdataset_suite_data.py" "$ROOT"

"$PYTHON" -m http.server --bind 127.0.0.1 --directory "$ROOT/remote" "$PORT" >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$WDSMP_SUITE_REMOTE')" 2>/dev/null && break
    sleep 0.1
done

cd "$ROOT"
status=0
if [[ $AGAINST == wdsmp ]]; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
[[ $# -gt 0 ]] || set -- tests
# tests/__init__.py (written above) makes `tests` this directory's package, ahead of any other.
"$PYTHON" -m pytest -p no:cacheprovider -q -rfEs --disable-warnings --rootdir "$ROOT" "$@" || status=$?
exit $status
