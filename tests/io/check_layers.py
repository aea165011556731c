# SPDX-License-Identifier: BSD-3-Clause
"""io.layers: the calls between io/src files go one way, as io_int.h says.

The table at the top of io/src/io_int.h lists the files in rows, top row
first; a file may call only files in rows below its own. This reads the
calls from the built archive (nm: each object's undefined symbols that
another object defines), so it sees what the linker sees, not what a regex
guesses. It also checks that the table names every source file of the
archive exactly once, and that no io file includes "internal.h" (the name
of libsnap's private header, which io's used to share).

usage: check_layers.py <io/src dir> <libsnapio.a>
"""
import os
import re
import subprocess
import sys


def layers(header):
    text = open(header, encoding="utf-8").read()
    block = text.split("Calls go one way", 1)
    if len(block) != 2:
        sys.exit(f"{header}: no 'Calls go one way' table")
    rows = []
    for line in block[1].split("*/", 1)[0].splitlines():
        m = re.match(r"^ \*\s+((?:[\w.-]+\.c ?)+)\s{2,}\S", line)
        if m:
            rows.append(m.group(1).split())
    if not rows:
        sys.exit(f"{header}: the layer table has no rows")
    level = {}
    for i, row in enumerate(rows):
        for f in row:
            if f in level:
                sys.exit(f"{header}: {f} is in two rows")
            level[f] = len(rows) - 1 - i  # bottom row is 0
    return level


def symbols(archive):
    out = subprocess.run(["nm", "-g", "-A", "--format=posix", archive], check=True, capture_output=True,
                         text=True).stdout
    defs, undefs = {}, {}
    for line in out.splitlines():
        m = re.match(r"^.*\[([\w.-]+)\.o\]: (\S+) (\S)", line)
        if not m:
            continue
        obj, sym, kind = m.groups()
        undefs.setdefault(obj, set())
        if kind == "U":
            undefs[obj].add(sym)
        elif kind not in "wv":
            defs[sym] = obj
    return defs, undefs


def main():
    src, archive = sys.argv[1], sys.argv[2]
    level = layers(os.path.join(src, "io_int.h"))
    defs, undefs = symbols(archive)
    bad = []
    objs = set(undefs)
    for f in sorted(objs - set(level)):
        bad.append(f"{f} is in libsnapio.a but not in io_int.h's layer table")
    for f in sorted(set(level) - objs):
        bad.append(f"{f} is in io_int.h's layer table but not in libsnapio.a")
    edges = 0
    for obj in sorted(objs & set(level)):
        for sym in sorted(undefs[obj]):
            to = defs.get(sym)
            if to is None or to == obj:
                continue
            edges += 1
            if to not in level:
                continue
            if level[to] >= level[obj]:
                bad.append(f"{obj} (row {level[obj]}) calls {sym} of {to} (row {level[to]}): not a lower row")
    for name in sorted(os.listdir(src)):
        if name.endswith((".c", ".h")):
            text = open(os.path.join(src, name), encoding="utf-8").read()
            if re.search(r'#include\s+"internal\.h"', text):
                bad.append(f'{name} includes "internal.h": io\'s private header is io_int.h')
    if edges == 0:
        bad.append("no calls between objects found: nm output not understood")
    for b in bad:
        print("FAIL:", b)
    if bad:
        sys.exit(1)
    print(f"ok: {len(level)} files in {max(level.values()) + 1} rows, {edges} cross-file references, all downward")


main()
