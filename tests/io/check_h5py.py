# SPDX-License-Identifier: BSD-3-Clause
"""Independent reader check: h5py (with Debian's LZ4 filter plugin) reads
every rank file and every export bit-exact against the bytes io_roundtrip
left in OUT/expect, and finds the documented attributes and types. Values
are compared as bits (NaN is data: bf16 bits from any source hold NaNs).
h5py missing: exits 77 before reading anything (the independent reader is
the test); torch missing: the bf16 view is an optional case, counted."""
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import Skips, skip_test  # noqa: E402

try:
    import h5py
    import numpy as np
except ImportError as e:
    skip_test("check_h5py", f"the independent reader is missing: {e} (Debian: python3-h5py)")
try:
    import torch
except ImportError:
    torch = None
skips = Skips()
TORCH = skips.optional("the bf16 view through torch.bfloat16", "torch in this Python", torch is not None)

out = sys.argv[1]
fails = []


def expect(path):
    with open(path, "rb") as f:
        return f.read()


def check_types(name, ds):
    dt = ds.attrs["dtype"].decode() if isinstance(ds.attrs["dtype"], bytes) else ds.attrs["dtype"]
    want = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32, "f64": np.float64,
            "u8": np.uint8, "bool": np.uint8, "i64": np.int64, "u16": np.uint16, "u32": np.uint32}[dt]
    if ds.dtype != np.dtype(want).newbyteorder("<"):
        fails.append(f"{name}: dtype attr {dt} but h5py sees {ds.dtype}")
    return dt


nfiles = 0
for step_dir in sorted(glob.glob(os.path.join(out, "flush/jobA/step-*"))):
    for rank_file in sorted(glob.glob(os.path.join(step_dir, "rank-*.h5"))):
        rank = os.path.basename(rank_file)[:-3]
        nfiles += 1
        with h5py.File(rank_file, "r") as f:
            assert f.attrs["format"] in (b"snapio", "snapio"), f.attrs["format"]
            for dsname, ds in f.items():
                want = expect(os.path.join(out, "expect", rank, dsname + ".bin"))
                got = ds[()].tobytes()
                if got != want:
                    fails.append(f"{rank_file}:{dsname}: bytes differ ({len(got)} vs {len(want)})")
                check_types(f"{rank_file}:{dsname}", ds)
                for a in ("name", "kind", "dtype", "step", "global_shape", "shard_offset", "crc32c", "codec"):
                    if a not in ds.attrs:
                        fails.append(f"{rank_file}:{dsname}: attribute {a} missing")
                shard = tuple(int(x) for x in ds.attrs["shard_offset"])
                if len(shard) != ds.ndim:
                    fails.append(f"{rank_file}:{dsname}: shard_offset rank {len(shard)} != {ds.ndim}")
                codec = ds.attrs["codec"]
                codec = codec.decode() if isinstance(codec, bytes) else codec
                if codec == "lz4" and 32004 not in [ds.id.get_create_plist().get_filter(i)[0]
                                                   for i in range(ds.id.get_create_plist().get_nfilters())]:
                    fails.append(f"{rank_file}:{dsname}: lz4 codec without filter 32004")

nexp = 0
for exp in sorted(glob.glob(os.path.join(out, "export-*.h5"))):
    nexp += 1
    with h5py.File(exp, "r") as f:
        for dsname, ds in f.items():
            want = expect(os.path.join(out, "expect", "global", dsname + ".bin"))
            got = ds[()].tobytes()
            if got != want:
                fails.append(f"{exp}:{dsname}: bytes differ ({len(got)} vs {len(want)})")
            if tuple(int(x) for x in ds.attrs["global_shape"]) != ds.shape:
                fails.append(f"{exp}:{dsname}: shape {ds.shape} != global_shape")
            dt = check_types(f"{exp}:{dsname}", ds)
            if dt == "bf16":
                # the documented way to view bf16: uint16 bits -> torch.bfloat16
                if TORCH:
                    t = torch.from_numpy(ds[()].view(np.int16)).view(torch.bfloat16).float()
                    ref = (np.asarray(ds[()], dtype="<u2").astype("<u4") << 16).ravel()
                    if not np.array_equal(t.numpy().ravel().view("<u4"), ref):
                        fails.append(f"{exp}:{dsname}: bf16 view differs")
        if "virtual" in exp and not any(f[k].is_virtual for k in f):
            fails.append(f"{exp}: no virtual dataset")

if nfiles < 6 or nexp < 6:
    fails.append(f"expected >= 6 rank files and 6 exports, found {nfiles} and {nexp}")
for m in fails:
    print("FAIL", m)
print(f"check_h5py: {nfiles} rank files, {nexp} exports, {len(fails)} failures, {skips.summary()}")
sys.exit(1 if fails else 0)
