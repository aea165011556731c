# SPDX-License-Identifier: BSD-3-Clause
"""Readers of saved steps, without snapsmp: the node store (manifest version
2 and slot files, docs/design/store-and-protocol.md), a flush directory (HDF5 rank files and
MANIFEST, docs/io-format.md; or per-node directories, D/node%n, whose part
MANIFESTs together list every rank) and a `snaptool export` file. Every byte read
is checked against its CRC32C (libsnap's snap_crc32c); a mismatch, a
truncated file or an unknown version is an error naming the file and the
region, never a silently wrong tensor.

A reader gives, per saved rank, regions as dicts: name, dtype, kind, shape
(the rank's shard), global_shape, shard_offset, codec, and load() -> a
numpy array of the shard (bf16 as uint16 bits).
"""
import glob
import os
import re
import struct

import numpy as np

from . import _capi as C
from ._capi import SnapError

_NP = {"u8": np.uint8, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "f16": np.float16,
       "bf16": np.uint16, "f32": np.float32, "f64": np.float64, "u16": np.uint16, "u32": np.uint32,
       "u64": np.uint64, "bool": np.uint8}
MAN_MAGIC = b"SNAPMAN\0"
MAN_VERSION = 2


class _R:
    """Bounded little-endian reader: a read past the end is an error."""

    def __init__(self, b, what):
        self.b, self.o, self.what = b, 0, what

    def take(self, n):
        if self.o + n > len(self.b):
            raise SnapError(C.ETRUNC, f"{self.what}: truncated at byte {self.o} (wants {n} more)")
        v = self.b[self.o:self.o + n]
        self.o += n
        return v

    def u(self, fmt):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def s(self):
        return self.take(self.u("H")).decode("utf-8", errors="replace")


def parse_manifest(b, what):
    """A node-store manifest (version 2) -> dict, checked like snap_manifest_decode."""
    r = _R(b, what)
    if r.take(8) != MAN_MAGIC:
        raise SnapError(C.EFORMAT, f"{what}: not a libsnap manifest (bad magic)")
    ver = r.u("I")
    if ver != MAN_VERSION:
        raise SnapError(C.EFORMAT, f"{what}: manifest version {ver}, this reader knows version {MAN_VERSION}")
    crc, length = r.u("I"), r.u("Q")
    if length != len(b):
        raise SnapError(C.ETRUNC, f"{what}: manifest says {length} bytes, the file has {len(b)}")
    if C.crc32c(b[16:]) != crc:
        raise SnapError(C.ECORRUPT, f"{what}: manifest checksum mismatch")
    m = {"job": r.s(), "rank": r.u("I"), "world": r.u("I"), "step": r.u("Q"), "slot": r.u("I"),
         "wall_ns": r.u("Q"), "gen": r.u("Q"), "chunk_size": r.u("Q")}
    n = r.u("I")
    regions, ncrc = [], 0
    for _ in range(n):
        g = {"name": r.s()}
        dt, kind, dev, codec, ndim = (r.u("B") for _ in range(5))
        g.update(dtype=C.DTYPE_NAME.get(dt, "?"), kind=C.KIND_NAME.get(kind, "?"), device=dev, codec=codec)
        g["codec_bound"] = struct.unpack("<d", struct.pack("<Q", r.u("Q")))[0]
        g["offset"], g["bytes"], g["nchunks"] = r.u("Q"), r.u("Q"), r.u("I")
        dims = [(r.u("Q"), r.u("Q"), r.u("Q")) for _ in range(ndim)]
        if ndim:
            g["shape"], g["global_shape"], g["shard_offset"] = (tuple(d[i] for d in dims) for i in range(3))
        else:
            es = C.DTYPE_SIZE.get(g["dtype"], 1)
            g["shape"] = g["global_shape"] = (g["bytes"] // es,)
            g["shard_offset"] = (0,)
        g["first_crc"] = ncrc
        ncrc += g["nchunks"]
        regions.append(g)
    m["crc"] = [r.u("I") for _ in range(ncrc)]
    m["len"] = [r.u("I") for _ in range(ncrc)]
    if r.o != len(b):
        raise SnapError(C.EPROTO, f"{what}: {len(b) - r.o} trailing bytes")
    m["regions"] = regions
    return m


# ---- the node store -------------------------------------------------------

def _read(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        import stat as st
        s = os.fstat(fd)
        if not st.S_ISREG(s.st_mode):
            raise SnapError(C.EINVAL, f"{path} is not a regular file")
        out = bytearray()
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return bytes(out)
            out += b
    finally:
        os.close(fd)


def store_manifests(store, job):
    """{rank: [manifest dicts]} of every committed slot of `job` in a node store."""
    jdir = os.path.join(store, job)
    if not os.path.isdir(jdir):
        raise SnapError(C.ENOENT, f"node store {store} holds no job {job!r}")
    out = {}
    for man in sorted(glob.glob(os.path.join(jdir, "rank-*", "slot-*.man"))):
        if not re.fullmatch(r"slot-\d+\.man", os.path.basename(man)):
            continue
        raw = _read(man)
        m = parse_manifest(raw, man)
        m["raw"] = raw
        m["path"] = man[:-4]
        m["man_path"] = man
        out.setdefault(m["rank"], []).append(m)
    return out


def store_step(store, job, step=None):
    """(step, world, {rank: manifest}) of `step` or of the newest step every
    rank committed with the same world size (as snapsmp's LATEST)."""
    mans = store_manifests(store, job)
    steps = {}
    for r, ms in mans.items():
        for m in ms:
            steps.setdefault((m["step"], m["world"]), {})[r] = m
    full = [(s, w) for (s, w), by in steps.items() if sorted(by) == list(range(w))]
    if step is not None:
        cand = [(s, w) for (s, w) in full if s == step]
        if not cand:
            have = sorted({s for s, _ in steps})
            raise SnapError(C.ENOENT, f"step {step} of job {job!r} is not committed by every rank in node store "
                            f"{store} (steps there: {have})")
    else:
        cand = sorted(full)[-1:]
        if not cand:
            raise SnapError(C.ENOENT, f"job {job!r} has no step committed by every rank in node store {store}")
    s, w = cand[-1]
    return s, w, steps[(s, w)]


def store_regions(m):
    """Regions of one rank's committed slot, with loaders that verify every chunk."""
    out = []
    for g in m["regions"]:
        def load(g=g):
            if g["codec"] != 0:
                raise SnapError(C.EUNSUPPORTED, f"region {g['name']!r} is held compressed in the node store "
                                f"(codec {C.CODEC_NAME.get(g['codec'])}); this reader decodes no frames: flush the "
                                "step and read the flush directory (HDF5_PLUGIN_PATH=<build>/io/plugin), or "
                                "snaptool export --copy it")
            with open(m["path"], "rb") as f:
                f.seek(g["offset"])
                raw = f.read(g["bytes"])
            if len(raw) != g["bytes"]:
                raise SnapError(C.ETRUNC, f"{m['path']}: region {g['name']!r} is truncated")
            cs = m["chunk_size"]
            for i in range(g["nchunks"]):
                t = g["first_crc"] + i
                chunk = raw[i * cs:(i + 1) * cs]
                if len(chunk) != m["len"][t] or C.crc32c(chunk) != m["crc"][t]:
                    raise SnapError(C.ECORRUPT, f"{m['path']}: region {g['name']!r} chunk {i} fails its CRC32C "
                                    f"(step {m['step']}, rank {m['rank']}); the slot is damaged or was reused "
                                    "while being read")
            # A live snapsmp withdraws a slot's manifest before reusing it:
            # the same manifest after the read means the bytes were the step's.
            try:
                same = _read(m["man_path"]) == m["raw"]
            except FileNotFoundError:
                same = False
            if not same:
                raise SnapError(C.EBUSY, f"{m['man_path']}: the slot was reused while being read (the job is "
                                "running); read a step that is not about to be recycled, or a persisted one")
            return np.frombuffer(raw, dtype=_NP[g["dtype"]]).reshape(g["shape"])
        out.append(dict(g, load=load))
    return out



# ---- a flush directory (HDF5) ---------------------------------------------

def _h5():
    try:
        import h5py
    except ImportError:
        raise SnapError(C.EUNSUPPORTED, "reading HDF5 needs h5py (Debian: python3-h5py)") from None
    return h5py


def node_dirs(flush_dir):
    """The directories behind a flush directory: itself, or for per-node
    directories (a path naming the node as %n, e.g. D/node%n) those that
    exist, the node number in decimal without leading zeros."""
    if "%n" not in flush_dir:
        return [flush_dir]
    pre, post = flush_dir.split("%n", 1)
    if "%n" in post:
        raise SnapError(C.EINVAL, f"{flush_dir}: a per-node flush directory names the node once, as %n")
    rx = re.compile(re.escape(pre) + r"(0|[1-9]\d*)" + re.escape(post))
    found = [(int(m.group(1)), d) for d in glob.glob(glob.escape(pre) + "*" + glob.escape(post))
             if (m := rx.fullmatch(d))]
    return [d for _, d in sorted(found)]


def _manifest(d, job, step):
    """(world, [ranks listed], part) of a step directory's MANIFEST, or None
    when there is none."""
    try:
        text = _read(os.path.join(d, "MANIFEST")).decode()
    except (FileNotFoundError, SnapError):
        return None
    lines = text.split("\n")
    if not lines or lines[0] != "snapio-manifest 1":
        return None
    body, end = text.rsplit("end ", 1) if "\nend " in text else (None, None)
    if body is None or int(end.strip(), 16) != C.crc32c(body.encode()):
        raise SnapError(C.ECORRUPT, f"{d}/MANIFEST: checksum mismatch")
    kv = dict(l.split(" ", 1) for l in lines[1:] if " " in l and not l.startswith("rank "))
    if kv.get("job") != job or int(kv.get("step", -1)) != step:
        raise SnapError(C.EMISMATCH, f"{d}/MANIFEST names job {kv.get('job')} step {kv.get('step')}")
    ranks = [int(l.split(" ")[1]) for l in lines if l.startswith("rank ")]
    return int(kv["world"]), ranks, "part" in kv


def _steps(flush_dir, job):
    """{step: (world, {rank: its step directory})} of the persisted steps:
    a whole MANIFEST, or node parts that together list every rank once."""
    pattern = "%n" in flush_dir
    seen, bad = {}, set()
    for nd in node_dirs(flush_dir):
        for d in glob.glob(os.path.join(glob.escape(nd), glob.escape(job), "step-*")):
            m = re.fullmatch(r"step-(0|[1-9]\d*)", os.path.basename(d))
            man = _manifest(d, job, int(m.group(1))) if m else None
            if man is None or man[2] != pattern:
                continue   # unsealed; or a part read without the pattern, or a whole step in a node's directory
            s = int(m.group(1))
            world, ranks = seen.setdefault(s, (man[0], {}))
            if man[0] != world or set(ranks) & set(man[1]):
                bad.add(s)   # parts of different worlds, or a rank in two: never persisted
            ranks.update((r, d) for r in man[1])
    return {s: (w, r) for s, (w, r) in seen.items() if s not in bad and sorted(r) == list(range(w))}


def flush_step(flush_dir, job, step=None):
    """(step, world, {rank: its rank file}) of the newest (or the given)
    persisted step. The node directories' MANIFESTs are read once, not once
    per rank: per node, a rank's file is in the directory whose part lists it."""
    steps = _steps(flush_dir, job)
    if not steps:
        raise SnapError(C.ENOENT, f"flush directory {flush_dir} holds no persisted step of job {job!r}")
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise SnapError(C.ENOENT, f"step {step} of job {job!r} is not persisted in {flush_dir} "
                        f"(persisted: {sorted(steps)})")
    world, dirs = steps[step]
    return step, world, {r: os.path.join(d, f"rank-{r}.h5") for r, d in dirs.items()}


def _attr_str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def rank_file_regions(path, job, step, rank, layout_only=False):
    """Regions of one rank file of a persisted step (its path from flush_step)."""
    h5py = _h5()
    if not os.path.isfile(path):
        raise SnapError(C.ENOENT, f"{path} is missing")
    out = []
    with h5py.File(path, "r") as f:
        for a, want in (("job", job), ("step", step), ("rank", rank)):
            got = f.attrs.get(a)
            got = _attr_str(got) if a == "job" else int(np.asarray(got).reshape(-1)[0]) if got is not None else None
            if got != want:
                raise SnapError(C.EMISMATCH, f"{path}: attribute {a} is {got}, the path says {want}")
        for key in f.keys():
            ds = f[key]
            at = ds.attrs
            name, dtype, kind = _attr_str(at["name"]), _attr_str(at["dtype"]), _attr_str(at["kind"])
            codec = _attr_str(at.get("codec", "none"))
            frames = codec in ("lossless", "lossy-abs", "lossy-rel")
            shape = tuple(int(x) for x in (at["shape"] if frames else ds.shape))
            es = C.DTYPE_SIZE[dtype]
            g = {"name": name, "dtype": dtype, "kind": kind, "shape": shape,
                 "global_shape": tuple(int(x) for x in at["global_shape"]),
                 "shard_offset": tuple(int(x) for x in at["shard_offset"]), "device": 0,
                 "codec": {"lossless": 1, "lossy-abs": 2, "lossy-rel": 3}.get(codec, 0), "codec_bound": 0.0,
                 "bytes": int(np.prod(shape, dtype=np.int64)) * es, "path": path, "key": key}
            if not layout_only:
                g["load"] = _h5_loader(path, key, name, dtype, shape, None if frames else int(at["crc32c"]))
            out.append(g)
    return out


def _h5_loader(path, key, name, dtype, shape, crc):
    def load():
        h5py = _h5()
        try:
            with h5py.File(path, "r") as f:
                a = f[key][()]
        except OSError as e:
            raise SnapError(C.EIO, f"{path}: dataset of region {name!r} cannot be read ({e}); a codec "
                            "dataset needs its filter plugin: HDF5_PLUGIN_PATH=<build>/io/plugin") from None
        a = np.ascontiguousarray(a).view(_NP[dtype]).reshape(shape)
        if crc is not None and C.crc32c(a) != crc:
            raise SnapError(C.ECORRUPT, f"{path}: region {name!r} fails its CRC32C")
        return a
    return load


def persisted_layout(flush_dir, job, rank, step=None):
    """(step, regions, True) of the newest (or given) persisted step for
    Checkpointer.restore, or None when nothing is persisted."""
    try:
        step, world, files = flush_step(flush_dir, job, step)
    except SnapError as e:
        if e.code == C.ENOENT:
            return None
        raise
    if rank >= world:
        raise SnapError(C.EMISMATCH, f"persisted step {step} of job {job!r} was saved by {world} ranks; this is "
                        f"rank {rank} (world size mismatch)")
    return step, rank_file_regions(files[rank], job, step, rank, layout_only=True), True


# ---- a snaptool export file -----------------------------------------------

def export_regions(path):
    """(step, source world, regions at their global shape) of an export file."""
    h5py = _h5()
    out = []
    with h5py.File(path, "r") as f:
        if _attr_str(f.attrs.get("format", "")) != "snapio-export":
            raise SnapError(C.EFORMAT, f"{path} is not a snaptool export file (format attribute)")
        step, world = int(np.asarray(f.attrs["step"]).reshape(-1)[0]), int(np.asarray(f.attrs["source_world"]).reshape(-1)[0])
        for key in f.keys():
            at = f[key].attrs
            name, dtype = _attr_str(at["name"]), _attr_str(at["dtype"])
            gs = tuple(int(x) for x in at["global_shape"])
            out.append({"name": name, "dtype": dtype, "kind": _attr_str(at["kind"]), "shape": gs,
                        "global_shape": gs, "shard_offset": (0,) * len(gs),
                        "load": _h5_loader(path, key, name, dtype, gs, None)})
    return step, world, out
