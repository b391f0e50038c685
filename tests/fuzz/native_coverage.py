"""Which functions of an instrumented extension a fuzzing run reached.

Reads the addresses that sancov.c appends to ``$WDSMP_SANCOV_DUMP`` at exit and the
extension's instrumented call sites (objdump), and prints, for each function of the
extension's own code (the .pyx's functions and its C helpers), how many of its basic
blocks were reached; then the same total for the code Cython adds to every module
(argument parsing, memoryview support, module set-up). With -O3 small functions are
inlined into their callers, so the list is of what is left; the few blocks whose hook
gcc reaches by a tail jump are counted at their caller's return address, and listed
apart.

    WDSMP_SANCOV_DUMP=/tmp/tarsplit.cov tests/fuzz/run.sh tarsplit -max_total_time=600 CORPUS
    python tests/fuzz/native_coverage.py /tmp/wdsmp-fuzz-build /tmp/tarsplit.cov
"""

import collections
import os
import re
import subprocess
import sys

# The .pyx's own functions (Cython mangles in the module name) and the C beside it
# (src/ext/imgops_kernels.c, jpegregion.c).
OWN = re.compile(r"5wdsmp_\d+_(?:tarsplit|imgops|jpegregion)|^imgops_|^jpegregion_")
FUNCTION = re.compile(r"^([0-9a-f]+) <(.+)>:$")
INSTRUCTION = re.compile(r"^\s+([0-9a-f]+):\s+(.*)$")


def sites(path):
    """``{function: [the return address of each of its trace_pc calls]}`` (basic blocks)."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                             capture_output=True, text=True, check=True).stdout
    blocks = collections.defaultdict(list)
    function = caller = None
    for line in listing.splitlines():
        match = FUNCTION.match(line)
        if match:
            function = match.group(2)
            continue
        match = INSTRUCTION.match(line)
        if match is None:
            continue
        if caller is not None:  # the instruction after the call: its return address
            blocks[caller].append(int(match.group(1), 16))
            caller = None
        if match.group(2).startswith("call") and "<__sanitizer_cov_trace_pc>" in match.group(2):
            caller = function
    return blocks


def main(build, dump):
    reached = collections.defaultdict(set)
    with open(dump) as stream:
        for line in stream:
            name, offset = line.split()
            reached[name].add(int(offset, 16))
    for name in sorted(reached):
        blocks = sites(os.path.join(build, "wdsmp", name))
        print(f"{name}:")
        totals = {True: [0, 0], False: [0, 0]}
        for function in sorted(blocks, key=lambda f: (not OWN.search(f), f)):
            addresses = blocks[function]
            hit = sum(a in reached[name] for a in addresses)
            own = bool(OWN.search(function))
            totals[own][0] += hit
            totals[own][1] += len(addresses)
            if own:
                short = re.sub(r"5wdsmp_\d+_(?:tarsplit|imgops|jpegregion)_", "", function)
                print(f"  {hit:5d} of {len(addresses):5d}  {short}")
        print(f"  own code: {totals[True][0]} of {totals[True][1]} basic blocks reached; "
              f"Cython's support code: {totals[False][0]} of {totals[False][1]}")
        known = {a for addresses in blocks.values() for a in addresses}
        elsewhere = len(reached[name] - known)
        if elsewhere:  # a block ending in a tail jump to the hook: counted at its caller's return address
            print(f"  and {elsewhere} reached through a tail jump to the hook (not attributed)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
