#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The project's structure, checked (docs/design/components.md, "Components and their
dependencies"):

1. Every #include "snap/X.h" names a header in some component's include/
   folder, and the component that includes it may depend on that one
   (DEPENDS below is the table in docs/design/components.md; the two must agree).
2. Every other quoted #include names a file of the includer's own component:
   no component reaches into another's private headers.
3. No CMakeLists.txt makes a src/ folder, or a folder of loose private
   headers, PUBLIC.
4. One CRC32C: only common/src/crc32c.c calls ISA-L's crc32_iscsi or holds
   the Castagnoli polynomial.
5. libsnap.so exports only snap_* symbols, exactly those libsnap.map lists,
   and each is declared SNAP_API in a public header (given the library).
6. tools/: a command's file (tools/snaptool/cmd/*.c, a snapbench benchmark's
   bench_*.c) calls no function of another command's file, and no tools/
   files call each other in a circle (read from the sources: non-static
   definitions, and where another file names them).

usage: check_layering.py SOURCE_DIR [libsnap.so]
"""
import os
import re
import subprocess
import sys

# component -> the components whose include/ headers it may use (besides its own).
DEPENDS = {
    "common": set(),
    "kernels": {"common"},
    "ec": {"common"},
    "io": {"common", "kernels"},
    "proto": {"common", "kernels"},
    "libsnap": {"common", "kernels", "proto"},
    "smp": {"common", "kernels", "proto", "ec", "io", "libsnap"},
    "integration": {"common", "kernels", "proto", "libsnap", "io", "smp"},
    "tools": {"common", "kernels", "proto", "libsnap", "ec", "io", "smp"},
}
# What another component may take from libsnap/include: the public API header only.
LIBSNAP_PUBLIC = {"snap/snap.h"}
COMPONENTS = list(DEPENDS)

src = os.path.abspath(sys.argv[1])
lib = sys.argv[2] if len(sys.argv) > 2 else None
bad = []


def rel(p):
    return os.path.relpath(p, src)


def sources(top):
    for d, dirs, files in os.walk(os.path.join(src, top)):
        dirs[:] = [x for x in dirs if x not in ("build", "__pycache__")]
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                yield os.path.join(d, f)


# Public headers: component/include/snap/*.h
provider = {}
for comp in COMPONENTS:
    inc = os.path.join(src, comp, "include", "snap")
    if os.path.isdir(inc):
        for f in os.listdir(inc):
            name = "snap/" + f
            if name in provider:
                bad.append(f"{name} is provided by both {provider[name]} and {comp}")
            provider[name] = comp

inc_re = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
checked = 0
for comp in COMPONENTS:
    own_names = {os.path.basename(p) for p in sources(comp)}
    # a component's own header by its path from the component's root ("mesh/mesh.h" in smp/)
    own_paths = {os.path.relpath(p, os.path.join(src, comp)) for p in sources(comp)}
    for path in sources(comp):
        text = open(path, errors="replace").read()
        for name in inc_re.findall(text):
            checked += 1
            if name.startswith("snap/"):
                owner = provider.get(name)
                if owner is None:
                    bad.append(f"{rel(path)}: #include \"{name}\" is in no component's include/snap/")
                elif owner != comp and owner not in DEPENDS[comp]:
                    bad.append(f"{rel(path)}: {comp} includes {name} of {owner}, which it may not depend on")
                elif owner == "libsnap" and comp != "libsnap" and name not in LIBSNAP_PUBLIC:
                    bad.append(f"{rel(path)}: {name} is libsnap's, not its public API")
            elif name not in own_paths and (os.path.basename(name) not in own_names or "/" in name):
                bad.append(f"{rel(path)}: #include \"{name}\" is not a header of {comp}/ (another component's "
                           "private header, or a path into one)")

# 3. PUBLIC include folders are include/ folders (or a dependency's).
pub_re = re.compile(r"target_include_directories\(\s*(\S+)\s+PUBLIC([^)]*)\)", re.S)
for d, dirs, files in os.walk(src):
    dirs[:] = [x for x in dirs if x not in ("build", ".git", "tests")]
    if "CMakeLists.txt" in files:
        p = os.path.join(d, "CMakeLists.txt")
        for target, body in pub_re.findall(open(p).read()):
            for item in body.split():
                if item in ("PRIVATE", "INTERFACE"):
                    break
                if "HDF5" in item or "ZFP" in item:
                    continue
                if not re.search(r"/include>?$", item):
                    bad.append(f"{rel(p)}: target {target} makes {item} PUBLIC (only include/ folders may be)")

# 4. One CRC32C.
crc_hits = []
for comp in COMPONENTS:
    for path in sources(comp):
        text = open(path, errors="replace").read()
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
        if re.search(r"\bcrc32_iscsi\s*\(|0x82F63B78", code, re.I):
            crc_hits.append(rel(path))
if crc_hits != ["common/src/crc32c.c"]:
    bad.append(f"CRC32C must be implemented once, in common/src/crc32c.c; found in {crc_hits}")

# 5. The exported symbols.
if lib:
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    syms = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[1] in "TtWwDdBbRr"}
    syms.discard("LIBSNAP_0.4")
    syms = {s for s in syms if not s.startswith("LIBSNAP_")}
    stray = sorted(s for s in syms if not s.startswith("snap_"))
    if stray:
        bad.append(f"libsnap.so exports non-snap_ symbols: {stray}")
    mapped = set()
    for m in re.findall(r"global:(.*?)(?:local:|\})", open(os.path.join(src, "libsnap", "libsnap.map")).read(), re.S):
        mapped |= {s.strip() for s in m.replace("\n", " ").split(";") if s.strip()}
    if syms != mapped:
        bad.append(f"libsnap.so exports {sorted(syms - mapped)} not in libsnap.map; map names "
                   f"{sorted(mapped - syms)} it does not export")
    declared = set()
    for h in ("libsnap/include/snap/snap.h", "common/include/snap/error.h", "common/include/snap/types.h",
              "common/include/snap/config.h", "common/include/snap/region.h"):
        declared |= set(re.findall(r"SNAP_API\s+[\w\s\*]*?\b(snap_\w+)\s*\(", open(os.path.join(src, h)).read()))
    if declared != mapped:
        bad.append(f"SNAP_API in the public headers {sorted(declared - mapped)} not in libsnap.map; "
                   f"map names {sorted(mapped - declared)} not declared SNAP_API")

# 6. tools/: one command per file, and the files of a program call each
# other in no circle.
def tools_calls(src):
    """File -> the other tools/ files whose functions or globals it uses."""
    files = [p for p in sources("tools") if p.endswith(".c")]
    code, defs = {}, {}
    for p in files:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", open(p, errors="replace").read(), flags=re.S)
        text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
        code[p] = text
        for name in re.findall(r"^(?!static\b)[A-Za-z_][^\n;{}()=]*?\b(\w+)\s*\([^;{}]*\)\s*\{", text, re.M):
            defs.setdefault(name, p)
        for name in re.findall(r"^(?!static\b|extern\b|typedef\b|struct\b|union\b|enum\b)[A-Za-z_]\w*"
                               r"(?:\s+\w+)*\s+\**(\w+)\s*(?:\[[^\]]*\])?\s*(?:=[^;]*)?;", text, re.M):
            defs.setdefault(name, p)
    defs.pop("main", None)   # each program's own
    calls = {p: {} for p in files}
    words = {p: set(re.findall(r"\b\w+\b", code[p])) for p in files}
    for name, owner in sorted(defs.items()):
        for p in files:
            if p != owner and name in words[p]:
                calls[p].setdefault(owner, []).append(name)
    return calls


def is_command(p):
    """A command's own file: snaptool's cmd/, or a snapbench benchmark (bench_<name>.c with its cmd_bench_)."""
    r = rel(p)
    if r.startswith("tools/snaptool/cmd/"):
        return True
    return r.startswith("tools/bench/bench_") and "cmd_bench_" in open(p, errors="replace").read()


calls = tools_calls(src)
for p, used in sorted(calls.items()):
    for owner, names in sorted(used.items()):
        if is_command(p) and is_command(owner):
            bad.append(f"{rel(p)} uses {', '.join(names)} of {rel(owner)}: a command calls no other command; "
                       "move what both need into the program's shared files")
# No circle: a depth-first walk of the file graph.
state = {}


def walk(p, path):
    state[p] = 1
    for owner in sorted(calls[p]):
        if state.get(owner) == 1:
            cyc = path[path.index(owner):] + [owner]
            bad.append("tools/ files call each other in a circle: " + " -> ".join(rel(x) for x in cyc))
        elif owner not in state:
            walk(owner, path + [owner])
    state[p] = 2


for p in sorted(calls):
    if p not in state:
        walk(p, [p])

# The table above is the one in docs/design/components.md.
design = open(os.path.join(src, "docs", "design", "components.md")).read()
for comp, deps in DEPENDS.items():
    m = re.search(r"^\|\s*`%s/`\s*\|[^|]*\|\s*([^|]*)\|" % comp, design, re.M)
    if not m:
        bad.append(f"docs/design/components.md's dependency table has no row for {comp}/")
        continue
    listed = set(re.findall(r"`(\w+)/`", m.group(1)))
    if listed != deps:
        bad.append(f"docs/design/components.md says {comp}/ uses {sorted(listed)}; this check allows {sorted(deps)}")

if bad:
    print("LAYERING VIOLATIONS:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print(f"layering: {checked} includes in {len(COMPONENTS)} components follow the dependency table; "
      f"one CRC32C; tools/: no command calls another, no call circle among {len(calls)} files; "
      f"{'libsnap.so exports only the mapped snap_* API' if lib else 'exports not checked'}")
