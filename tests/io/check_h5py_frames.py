# SPDX-License-Identifier: BSD-3-Clause
"""Independent reader check of codec frames: h5py, with libh5z_snapcodec.so
(and Debian's LZ4 plugin) on HDF5_PLUGIN_PATH, reads every dataset of the
rank files io_frames wrote and of its exports; the values must equal what
snap_codec_decompress gave for the frames (OUT/expect/*, written by
io_frames), and frame datasets must carry the documented layout and
attributes. h5py missing: exits 77 before reading anything."""
import glob
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import skip_test  # noqa: E402

try:
    import h5py
    import numpy as np
except ImportError as e:
    skip_test("check_h5py_frames", f"the independent reader is missing: {e} (Debian: python3-h5py)")

out = sys.argv[1]
FILTER = 311
fails = []
WANT = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32, "i64": np.int64}


def s(v):
    return v.decode() if isinstance(v, bytes) else v


def expect(*parts):
    with open(os.path.join(out, "expect", *parts), "rb") as f:
        return f.read()


def filters(ds):
    p = ds.id.get_create_plist()
    return [p.get_filter(i) for i in range(p.get_nfilters())]


nframes_ds = nfiles = 0
for rank_file in sorted(glob.glob(os.path.join(out, "flush/jobF/step-*/rank-*.h5"))):
    rank = os.path.basename(rank_file)[:-3]
    nfiles += 1
    with h5py.File(rank_file, "r") as f:
        for name, ds in f.items():
            where = f"{rank_file}:{name}"
            dt = s(ds.attrs["dtype"])
            if ds.dtype != np.dtype(WANT[dt]).newbyteorder("<"):
                fails.append(f"{where}: dtype attr {dt} but h5py sees {ds.dtype}")
            got = ds[()]
            if got.tobytes() != expect(rank, name + ".bin"):
                fails.append(f"{where}: values differ from the decoded frames")
            codec = s(ds.attrs["codec"])
            if codec not in ("lossless", "lossy-abs", "lossy-rel"):
                continue
            nframes_ds += 1
            shape = tuple(int(x) for x in ds.attrs["shape"])
            fe = int(ds.attrs["frame_elems"][0])
            crcs = ds.attrs["frame_crc32c"]
            if ds.ndim != 1 or ds.shape[0] != math.prod(shape):
                fails.append(f"{where}: not flat {math.prod(shape)} values: {ds.shape}")
            gshape = tuple(int(x) for x in ds.attrs["global_shape"])
            offset = tuple(int(x) for x in ds.attrs["shard_offset"])
            if len(gshape) != len(shape) or len(offset) != len(shape) or any(
                    o + n > g for o, n, g in zip(offset, shape, gshape)):
                fails.append(f"{where}: shape {shape} at offset {offset} does not fit global_shape {gshape}")
            if len(crcs) != -(-math.prod(shape) // fe) or "crc32c" in ds.attrs:
                fails.append(f"{where}: {len(crcs)} frame CRCs for frames of {fe}, or a crc32c attribute")
            fl = filters(ds)
            if len(fl) != 1 or fl[0][0] != FILTER or fl[0][1] & 1:
                fails.append(f"{where}: pipeline {fl} is not filter {FILTER}, mandatory")
            if ds.chunks != (min(fe, math.prod(shape)),):
                fails.append(f"{where}: chunks {ds.chunks} are not one frame")

nexp = 0
for exp in sorted(glob.glob(os.path.join(out, "export-*.h5"))):
    nexp += 1
    with h5py.File(exp, "r") as f:
        for name, ds in f.items():
            want = expect("global", name + ".bin")
            if ds[()].tobytes() != want:
                fails.append(f"{exp}:{name}: values differ")
            if tuple(int(x) for x in ds.attrs["global_shape"]) != ds.shape:
                fails.append(f"{exp}:{name}: shape {ds.shape} != global_shape")
            if "copy" in exp and (ds.is_virtual or filters(ds) or ds.chunks):
                fails.append(f"{exp}:{name}: a copy export must be plain contiguous")
            if "virtual" in exp and not ds.is_virtual:
                fails.append(f"{exp}:{name}: not virtual")

if nfiles != 6 or nframes_ds < 24 or nexp < 3:   # 3 steps (none, lz4, lz4 without O_DIRECT) x 2 ranks
    fails.append(f"expected 6 rank files, >= 24 frame datasets, >= 3 exports; found {nfiles}, {nframes_ds}, {nexp}")
for m in fails:
    print("FAIL", m)
print(f"check_h5py_frames: {nfiles} rank files ({nframes_ds} frame datasets), {nexp} exports, {len(fails)} failures")
sys.exit(1 if fails else 0)
