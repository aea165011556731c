# SPDX-License-Identifier: BSD-3-Clause
"""snapsmp's files call one way: each only into lower layers (smp_internal.h).

Reads the symbol tables of snapsmp's objects and its static libraries' (nm),
links every undefined symbol of one file to the file that defines it, and
fails naming each call that goes to the same or a higher layer (a call loop
in the making), and each object missing from the table below (a new file
must be given its layer). A self-test first feeds the checker a loop, so
the check can fail.
usage: check_smp_layers.py NM OBJECT... (lists separated by ';' are split)
"""
import os
import subprocess
import sys

# file -> layer; mirror of the table at the top of smp/smp_internal.h
LAYERS = {
    "main": 8,
    "daemon": 7,
    "requests": 6, "export": 6, "scrub": 6,
    "mesh": 5, "meshscrub": 5,
    "persist": 4, "meshflush": 4, "filereq": 4, "repair": 4, "meshheal": 4,
    "flush": 3, "files": 3, "rehydrate": 3, "protect": 3, "recover": 3, "meshcap": 3,
    "meshrec": 2, "capgen": 2, "filescan": 2, "fileflush": 2,
    "log": 1, "reply": 1, "meshutil": 1, "meshmap": 1, "config": 1, "fileent": 1,
    "store": 0, "slots": 0, "reserve": 0, "meshfiles": 0, "metrics": 0,
}
# calls allowed inside one layer (the library snapstore: slots uses store and
# reserve, store stops reserve's thread)
SAME_LAYER_OK = {("slots", "store"), ("slots", "reserve"), ("store", "reserve")}


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


def violations(files):
    """files: name -> (defined, undefined). Returns problem strings."""
    owner = {}
    for name, (defined, _) in files.items():
        for s in defined:
            owner[s] = name
    bad = []
    for name, (_, undefined) in sorted(files.items()):
        if name not in LAYERS:
            bad.append(f"{name}.c is not in the layer table (smp_internal.h, {__file__})")
            continue
        for s in sorted(undefined):
            to = owner.get(s)
            if to is None or to == name or to not in LAYERS:
                continue
            if LAYERS[to] < LAYERS[name] or (name, to) in SAME_LAYER_OK:
                continue
            bad.append(f"{name}.c (layer {LAYERS[name]}) calls {s} of {to}.c (layer {LAYERS[to]})")
    return bad


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    nm = sys.argv[1]
    objs = [o for a in sys.argv[2:] for o in a.split(";") if o]
    # The checker itself: a loop like the one persist.c had with daemon.c is found.
    loop = {"daemon": ({"reply_err"}, {"persist_tick"}), "persist": ({"persist_tick"}, {"reply_err"})}
    if not any("persist.c (layer 4) calls reply_err" in v for v in violations(loop)):
        print("FAIL: the checker does not see a persist -> daemon call")
        return 1
    files = {}
    for o in objs:
        name = os.path.basename(o)
        for ext in (".o", ".obj", ".c"):
            if name.endswith(ext):
                name = name[: -len(ext)]
        files[name] = symbols(nm, o)
    for need in ("daemon", "mesh", "persist", "log"):
        if need not in files:
            print(f"FAIL: no object for {need}.c among {sorted(files)}")
            return 1
    bad = violations(files)
    for b in bad:
        print("FAIL:", b)
    if bad:
        return 1
    print(f"smp layers: {len(files)} objects, every call goes to a lower layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
