# SPDX-License-Identifier: BSD-3-Clause
"""snapsmp's files call one way: down the folders of smp/README.md, and
inside one folder without a loop.

Reads the folder table of smp/README.md (which folder may call which), the
symbol tables of snapsmp's objects and its static libraries' (nm), links
every undefined symbol of one file to the file that defines it, and fails
naming each call into a folder the caller's folder may not call, each loop
of calls among the files of one folder, and each object in a folder the
table does not list. A self-test first feeds the checker an upward call and
a loop, so the check can fail.
usage: check_smp_layers.py README NM OBJECT... (lists separated by ';' are split)
       check_smp_layers.py --loops-only NM OBJECT...  (one folder: only loops fail;
       libsnap's files)
"""
import os
import re
import subprocess
import sys

TOP = "."


def read_table(readme):
    """folder -> set of folders it may call ('*': all), from the README's table."""
    may = {}
    for line in open(readme, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        folder = cells[0].strip("`").rstrip("/") or TOP
        calls = {c.rstrip("/") for c in re.findall(r"`([^`]+)`", cells[2])}
        may[folder] = {"*"} if "every folder" in cells[2] else calls
    return may


def symbols(nm, obj):
    out = subprocess.run([nm, obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRV":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
    return defined, undefined


def loops(edges):
    """Each cycle of a directed graph {node: set(nodes)}, as a list of nodes."""
    found, state, path = [], {}, []

    def visit(n):
        state[n] = 1
        path.append(n)
        for t in sorted(edges.get(n, ())):
            if state.get(t) == 1:
                found.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t)
        path.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


def violations(may, files):
    """files: 'folder/name' -> (defined, undefined). Returns problem strings."""
    owner = {s: f for f, (d, _) in files.items() for s in d}
    bad, inside = [], {}
    for f, (_, undefined) in sorted(files.items()):
        folder = os.path.dirname(f) or TOP
        if folder not in may:
            bad.append(f"{f}.c is in {folder}/, which the folder table of smp/README.md does not list")
            continue
        for s in sorted(undefined):
            to = owner.get(s)
            if to is None or to == f:
                continue
            tfolder = os.path.dirname(to) or TOP
            if tfolder == folder:
                inside.setdefault(f, set()).add(to)
            elif "*" not in may[folder] and tfolder not in may[folder]:
                bad.append(f"{f}.c ({folder}/) calls {s} of {to}.c ({tfolder}/), "
                           f"which {folder}/ may not call")
    for cyc in loops(inside):
        bad.append("a loop of calls inside one folder: " + " -> ".join(c + ".c" for c in cyc))
    return bad


def object_name(path):
    """'.../snapsmp.dir/mesh/mesh.c.o' -> 'mesh/mesh'; top-level files -> 'daemon'."""
    m = re.search(r"\.dir/(.*)$", path.replace(os.sep, "/"))
    name = m.group(1) if m else os.path.basename(path)
    for ext in (".o", ".obj"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return name[:-2] if name.endswith(".c") else name


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    loops_only = sys.argv[1] == "--loops-only"
    may = {TOP: set()} if loops_only else read_table(sys.argv[1])
    for need in () if loops_only else (TOP, "store", "base", "mesh"):
        if need not in may:
            print(f"FAIL: the folder table of {sys.argv[1]} has no row for {need}/ (read {sorted(may)})")
            return 1
    nm = sys.argv[2]
    objs = [o for a in sys.argv[3:] for o in a.split(";") if o]
    # The checker itself: an upward call and a loop inside a folder are found.
    if loops_only:
        planted = {"a": ({"a_f"}, {"b_f"}), "b": ({"b_f"}, {"a_f"})}
        want = ["a.c -> b.c -> a.c"]
    else:
        planted = {"store/slots": ({"slots_x"}, {"smp_logf"}), "base/log": ({"smp_logf"}, set()),
                   "mesh/a": ({"a_f"}, {"b_f"}), "mesh/b": ({"b_f"}, {"a_f"})}
        want = ["store/slots.c (store/) calls smp_logf", "mesh/a.c -> mesh/b.c -> mesh/a.c"]
    seen = violations(may, planted)
    if not all(any(w in v for v in seen) for w in want):
        print("FAIL: the checker misses a planted upward call or loop:", seen)
        return 1
    files = {object_name(o): symbols(nm, o) for o in objs}
    files = {os.path.basename(f) if loops_only else f: v for f, v in files.items()}
    for need in ("client", "save") if loops_only else ("daemon", "mesh/mesh", "flush/persist", "base/log"):
        if need not in files:
            print(f"FAIL: no object for {need}.c among {sorted(files)}")
            return 1
    bad = violations(may, files)
    for b in bad:
        print("FAIL:", b)
    if bad:
        return 1
    if loops_only:
        print(f"{len(files)} objects, no loop of calls between them")
    else:
        print(f"smp layers: {len(files)} objects in {len(may)} folders, every call goes down the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
