#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The ctypes mirror of snap.h (integration/python/libsnap/_capi.py) against
the header itself: compile a probe with the C compiler CMake uses, print the
size and offset of every field of struct snap_config, snap_region and
snap_region_info and the value of every enum and limit, and compare with
ctypes. A header change not made in Python fails here. Also: every C field
of snap_config is a Python setting and a SNAP_* variable named in
docs/design/configuration.md's table.

usage: test_abi.py --cc CC --src SOURCE_DIR --out DIR
"""
import argparse
import ctypes
import os
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--cc", required=True)
ap.add_argument("--src", required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(args.src, "integration", "python"))
from libsnap import _capi as C  # noqa: E402

structs = {"snap_config": C.SnapConfig, "snap_region": C.SnapRegion, "snap_region_info": C.SnapRegionInfo}
consts = {}
consts.update({f"SNAP_DTYPE_{k.upper()}": v for k, v in C.DTYPE.items()})
consts.update({f"SNAP_KIND_{k.upper()}": v for k, v in C.KIND.items()})
# The codec names come from the header (types.h's enum), each paired with its
# spelling in the mirror (C.CODEC, SNAP_CODEC_PARAM's words); the values
# compared are the mirror's, so a codec added, renumbered or removed on either
# side fails here.
CODEC_SPELLING = {"NONE": "none", "LOSSLESS": "lossless", "LOSSY_ABS": "abs", "LOSSY_REL": "rel"}
with open(os.path.join(args.src, "common", "include", "snap", "types.h")) as f:
    header_codecs = re.findall(r"^\s*SNAP_CODEC_(\w+?)\s*(?:=|,)", f.read(), re.M)
header_codecs = [c for c in header_codecs if c != "COUNT_"]
abi_bad = []
if not header_codecs:
    abi_bad.append("no SNAP_CODEC_* enum found in common/include/snap/types.h")
for c in header_codecs:
    word = CODEC_SPELLING.get(c)
    if word is None or word not in C.CODEC:
        abi_bad.append(f"SNAP_CODEC_{c} (types.h) has no entry in the Python mirror's CODEC {C.CODEC}")
    else:
        consts[f"SNAP_CODEC_{c}"] = C.CODEC[word]
if sorted(CODEC_SPELLING[c] for c in header_codecs if c in CODEC_SPELLING) != sorted(C.CODEC):
    abi_bad.append(f"the mirror's CODEC {sorted(C.CODEC)} is not the header's {header_codecs}")
consts.update({"SNAP_DEVICE_HOST": C.DEVICE_HOST, "SNAP_DEVICE_CUDA": C.DEVICE_CUDA,
               "SNAP_MAX_NDIM": C.MAX_NDIM, "SNAP_NAME_MAX": C.NAME_MAX, "SNAP_JOB_MAX": C.JOB_MAX,
               "SNAP_PATH_MAX": C.PATH_MAX, "SNAP_DTYPE_COUNT_": len(C.DTYPE), "SNAP_KIND_COUNT_": len(C.KIND),
               "SNAP_CODEC_COUNT_": len(C.CODEC), "SNAP_DEVICE_COUNT_": 2})
consts.update({name: code for code, name in C.ERRORS.items()})

lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <snap/snap.h>", "int main(void) {"]
for s, py in structs.items():
    lines.append(f'printf("size {s} %zu\\n", sizeof(struct {s}));')
    for f, _ in py._fields_:
        lines.append(f'printf("field {s}.{f} %zu %zu\\n", offsetof(struct {s}, {f}), '
                     f'sizeof(((struct {s} *)0)->{f}));')
for k in consts:
    lines.append(f'printf("const {k} %lld\\n", (long long)({k}));')
lines.append('printf("const SNAP_STEP_LATEST %llu\\n", (unsigned long long)SNAP_STEP_LATEST);')
lines += ["return 0;", "}"]
os.makedirs(args.out, exist_ok=True)
src, exe = os.path.join(args.out, "abi_probe.c"), os.path.join(args.out, "abi_probe")
with open(src, "w") as f:
    f.write("\n".join(lines) + "\n")
# The probe only reads the header: no sanitizer or library needed.
subprocess.run([args.cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(args.src, "libsnap", "include"),
                "-I", os.path.join(args.src, "common", "include"),
                "-o", exe, src], check=True)
out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n")

bad = list(abi_bad)
checked = 0
for line in out:
    p = line.split()
    if not p:
        continue
    if p[0] == "size":
        py = ctypes.sizeof(structs[p[1]])
        if py != int(p[2]):
            bad.append(f"sizeof(struct {p[1]}): C {p[2]}, ctypes {py}")
    elif p[0] == "field":
        s, f = p[1].split(".")
        d = getattr(structs[s], f)
        if (d.offset, d.size) != (int(p[2]), int(p[3])):
            bad.append(f"struct {s}.{f}: C offset {p[2]} size {p[3]}, ctypes offset {d.offset} size {d.size}")
    elif p[0] == "const":
        want = C.STEP_LATEST if p[1] == "SNAP_STEP_LATEST" else consts[p[1]]
        if int(p[2]) != want:
            bad.append(f"{p[1]}: C {p[2]}, Python {want}")
    checked += 1

# Every C field is in the mirror (a field added to the header but not here
# shifts nothing when appended, so compare the names too).
# snap.h and the two headers it includes for the structs proto/ shares.
hdr = "".join(open(os.path.join(args.src, *p)).read() for p in (
    ("libsnap", "include", "snap", "snap.h"), ("common", "include", "snap", "config.h"),
    ("common", "include", "snap", "region.h")))
VERSION = tuple(int(re.search(r"#define SNAP_VERSION_%s (\d+)" % k, hdr).group(1)) for k in ("MAJOR", "MINOR", "PATCH"))
for s, py in structs.items():
    body = re.search(r"struct %s \{(.*?)\n\};" % s, hdr, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    cnames = re.findall(r"\b(\w+)\s*(?:\[[^\]]*\])?\s*;", body)
    pnames = [f for f, _ in py._fields_]
    if cnames != pnames:
        bad.append(f"struct {s}: C fields {cnames}, ctypes {pnames}")

# One config: the C fields are the Python settings and (upper-cased) SNAP_*
# variables documented in docs/design/configuration.md (rank/world_size/local_rank and the
# codec bounds ride on their variables).
design = open(os.path.join(args.src, "docs", "design", "configuration.md")).read()
for f, _ in C.SnapConfig._fields_:
    if f.endswith("_bound") or f == "size":
        continue
    var = "SNAP_" + f.upper()
    if var not in design:
        bad.append(f"snap_config.{f}: {var} is not in docs/design/configuration.md")
cfg, py = C.config({"chunk_size": "1M", "copy_threads": 3, "codec_optim": "rel:1e-3", "job": "abi",
                     "flush_dir": "/x"})
d = C.config_dict(cfg, py)
if (d["chunk_size"], d["copy_threads"], d["codec_optim"], d["codec_optim_bound"], d["job"], d["flush_dir"]) != \
        (1 << 20, 3, 3, 1e-3, "abi", "/x"):
    bad.append(f"settings by C name did not reach the struct: {d}")
if cfg.size != ctypes.sizeof(C.SnapConfig):
    bad.append(f"snap_config_init_size left size {cfg.size}, not {ctypes.sizeof(C.SnapConfig)}")
# Enumerated settings by name, as SNAP_RESTORE_VERIFY spells them.
if C.config({"restore_verify": "inline"})[0].restore_verify != C.RESTORE_VERIFY.index("inline"):
    bad.append("restore_verify 'inline' did not reach the struct")
try:
    C.config({"restore_verify": "later"})
    bad.append("restore_verify 'later' was accepted")
except ValueError as e:
    if "restore_verify" not in str(e):
        bad.append(f"the error for a bad restore_verify does not name it: {e}")
# autostart: True/False over the struct's 0 = default (on), as SNAP_AUTOSTART=0|1.
if (C.config({"autostart": False})[0].autostart, C.config({"autostart": True})[0].autostart,
        C.config({})[0].autostart if os.environ.get("SNAP_AUTOSTART") is None else 0) != (-1, 1, 0):
    bad.append("autostart False/True/default did not reach the struct as SNAP_AUTOSTART_OFF/ON/DEFAULT")
try:
    C.config({"autostart": 5})
    bad.append("autostart 5 was accepted")
except ValueError as e:
    if "autostart" not in str(e):
        bad.append(f"the error for a bad autostart does not name it: {e}")
try:
    C.config({"chunk_size": "4Q"})
    bad.append("chunk_size '4Q' was accepted")
except ValueError as e:
    if "chunk_size" not in str(e):
        bad.append(f"the error for a malformed chunk_size does not name it: {e}")
for wrong, why in (({"no_such_field": 1}, "an unknown setting"), ({"mem_limit": "1G"}, "a daemon setting")):
    try:
        C.config(wrong)
        bad.append(why + " was accepted")
    except TypeError as e:
        if "mem_limit" in wrong and "snapsmp" not in str(e):
            bad.append(f"the error for a daemon setting does not send the user to snapsmp: {e}")
# The daemon's settings are still one config: each is a SNAP_* variable in the docs.
for f in C.DAEMON_SETTINGS:
    if "SNAP_" + f.upper() not in design:
        bad.append(f"snapsmp setting {f}: SNAP_{f.upper()} is not in docs/design/configuration.md")
L = C.lib()
if L.snap_version() != 10000 * VERSION[0] + 100 * VERSION[1] + VERSION[2] or \
        L.snap_version_string().decode() != "%d.%d.%d" % VERSION:
    bad.append(f"snap_version {L.snap_version()} / {L.snap_version_string()} differ from snap.h's {VERSION}")

if bad:
    print("ABI MISMATCH between snap.h and integration/python/libsnap/_capi.py:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print(f"abi: {checked} sizes, offsets and constants match snap.h ({args.cc})")
