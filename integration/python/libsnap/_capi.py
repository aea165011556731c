# SPDX-License-Identifier: BSD-3-Clause
"""ctypes bindings of libsnap.so (libsnap/include/snap/snap.h and the headers it includes: config.h, region.h, types.h, error.h).

The structures mirror the C header field for field; tests/python/test_abi.py
compiles a probe with the project's C compiler and compares every size and
offset, so a header change that is not made here fails CI.

Where libsnap.so is found, in order: $SNAP_LIBRARY (a path; if it does not
load, that is the error), beside this package (libsnap/lib/), the build tree
this package sits in (build/*/libsnap/, gcc first), then the loader's path
(libsnap.so.0).
"""
import ctypes
import glob
import os
import threading

# ---- snap/types.h --------------------------------------------------------
DTYPE = {"u8": 0, "i8": 1, "i16": 2, "i32": 3, "i64": 4, "f16": 5, "bf16": 6, "f32": 7, "f64": 8,
         "u16": 9, "u32": 10, "u64": 11, "bool": 12}
DTYPE_NAME = {v: k for k, v in DTYPE.items()}
DTYPE_SIZE = {"u8": 1, "i8": 1, "bool": 1, "i16": 2, "u16": 2, "f16": 2, "bf16": 2,
              "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8}
KIND = {"param": 0, "optim": 1, "rng": 2, "other": 3}
KIND_NAME = {v: k for k, v in KIND.items()}
DEVICE_HOST, DEVICE_CUDA = 0, 1
CODEC = {"none": 0, "lossless": 1, "abs": 2, "rel": 3}
CODEC_NAME = {v: k for k, v in CODEC.items()}
MAX_NDIM = 8

# ---- snap/snap.h ---------------------------------------------------------
NAME_MAX = 255
JOB_MAX = 64
PATH_MAX = 256
STEP_LATEST = (1 << 64) - 1

# ---- snap/error.h --------------------------------------------------------
ERRORS = {
    0: "SNAP_OK", -1: "SNAP_EINVAL", -2: "SNAP_ENOMEM", -3: "SNAP_EIO", -4: "SNAP_ENOENT",
    -5: "SNAP_ECORRUPT", -6: "SNAP_EPROTO", -7: "SNAP_ESMP", -8: "SNAP_EBUSY", -9: "SNAP_EUNFENCED",
    -10: "SNAP_ENOSPC", -11: "SNAP_EMISMATCH", -12: "SNAP_EPERM", -13: "SNAP_ESTATE",
    -14: "SNAP_ETIMEDOUT", -15: "SNAP_EFORMAT", -16: "SNAP_EUNSUPPORTED", -17: "SNAP_ETRUNC",
    -18: "SNAP_EOVERFLOW", -19: "SNAP_ERANGE", -20: "SNAP_ELOST",
}
(OK, EINVAL, ENOMEM, EIO, ENOENT, ECORRUPT, EPROTO, ESMP, EBUSY, EUNFENCED, ENOSPC, EMISMATCH, EPERM, ESTATE,
 ETIMEDOUT, EFORMAT, EUNSUPPORTED, ETRUNC, EOVERFLOW, ERANGE, ELOST) = range(0, -21, -1)
assert all(globals()[name[5:]] == code for code, name in ERRORS.items())


class SnapConfig(ctypes.Structure):
    """struct snap_config, the client's settings. Field names are the C
    names, which are also the SNAP_* variables upper-cased (copy_threads <->
    SNAP_COPY_THREADS). `size` is the ABI's, set by snap_config_init_size."""
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("job", ctypes.c_char * (JOB_MAX + 1)),
        ("store", ctypes.c_char * PATH_MAX),
        ("socket", ctypes.c_char * PATH_MAX),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("local_rank", ctypes.c_int),
        ("copy_threads", ctypes.c_uint),
        ("chunk_size", ctypes.c_uint64),
        ("timeout_ms", ctypes.c_uint),
        ("populate", ctypes.c_int),
        ("codec_param", ctypes.c_int),
        ("codec_param_bound", ctypes.c_double),
        ("codec_optim", ctypes.c_int),
        ("codec_optim_bound", ctypes.c_double),
        ("capture", ctypes.c_char * 1024),
        ("launch", ctypes.c_char * 128),
        ("restore_verify", ctypes.c_int),
        ("autostart", ctypes.c_int),
    ]


# snapsmp's own settings (smp/include/snap/smp_config.h): a trainer cannot set them; they are
# the daemon's flags and SNAP_* variables. flush_dir is also read here, to
# find the layout of a step persisted on disk (Checkpointer.restore).
DAEMON_SETTINGS = ("mem_limit", "slots", "verify_commit", "flush_every", "flush_interval", "flush_keep",
                   "flush_codec", "allow_older", "flush_mode", "flush_files", "flush_direct")
PY_SETTINGS = ("flush_dir",)


# The fields struct snap_region and struct snap_region_info share, after the name.
_REGION_FIELDS = [
    ("bytes", ctypes.c_uint64),
    ("dtype", ctypes.c_int),
    ("kind", ctypes.c_int),
    ("device", ctypes.c_int),
    ("codec", ctypes.c_int),
    ("codec_bound", ctypes.c_double),
    ("ndim", ctypes.c_int),
    ("shape", ctypes.c_uint64 * MAX_NDIM),
    ("global_shape", ctypes.c_uint64 * MAX_NDIM),
    ("shard_offset", ctypes.c_uint64 * MAX_NDIM),
]


class SnapRegion(ctypes.Structure):
    """struct snap_region."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ptr", ctypes.c_void_p),
    ] + _REGION_FIELDS


class SnapRegionInfo(ctypes.Structure):
    """struct snap_region_info (snap_describe)."""
    _fields_ = [
        ("name", ctypes.c_char * (NAME_MAX + 1)),
    ] + _REGION_FIELDS


class SnapError(RuntimeError):
    """A libsnap call failed, or a restore cannot be complete. `code` is the
    negative SNAP_E* value, `name` its name ("SNAP_EMISMATCH")."""

    def __init__(self, code, message):
        self.code = code
        self.name = ERRORS.get(code, "SNAP_E?")
        self.message = message
        super().__init__(f"{message} [{self.name}]")


class MismatchError(SnapError):
    """The snapshot does not fit what is being restored into (model, optimizer,
    world size); nothing was written and the store is left as it was."""

    def __init__(self, message):
        super().__init__(EMISMATCH, message)


_lib = None
_lib_lock = threading.Lock()


def _candidates():
    env = os.environ.get("SNAP_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = sorted(glob.glob(os.path.join(here, "lib", "libsnap.so*")))
    root = os.path.abspath(os.path.join(here, "..", "..", ".."))
    if os.path.isfile(os.path.join(root, "libsnap", "include", "snap", "snap.h")):
        out += [os.path.join(root, "build", "gcc", "libsnap", "libsnap.so")]
        out += sorted(glob.glob(os.path.join(root, "build", "*", "libsnap", "libsnap.so")))
    out.append("libsnap.so.0")
    return out, False


def library_path():
    """The path (or loader name) of the libsnap.so this package uses."""
    lib()
    return _lib._snap_path


def lib():
    """Load and bind libsnap.so once."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        cands, explicit = _candidates()
        errors = []
        for c in cands:
            if os.sep in c and not os.path.exists(c):
                continue
            try:
                h = ctypes.CDLL(c)
            except OSError as e:
                if explicit:
                    raise OSError(f"SNAP_LIBRARY={c} does not load: {e}") from None
                errors.append(f"{c}: {e}")
                continue
            if not hasattr(h, "snap_prepare"):
                errors.append(f"{c}: too old (no snap_prepare: before LIBSNAP_0.5)")
                continue
            h._snap_path = c
            _bind(h)
            _lib = h
            return h
        raise OSError("libsnap.so not found; build it (cmake --build build/gcc) or set SNAP_LIBRARY to its path"
                      + ("; tried " + "; ".join(errors) if errors else ""))


def _bind(h):
    P = ctypes.POINTER
    ctx_p = ctypes.c_void_p
    sig = {
        "snap_version": (ctypes.c_int, []),
        "snap_version_string": (ctypes.c_char_p, []),
        "snap_config_init_size": (ctypes.c_int, [P(SnapConfig), ctypes.c_size_t]),
        "snap_config_from_env": (ctypes.c_int, [P(SnapConfig), ctypes.c_char_p, ctypes.c_size_t]),
        "snap_parse_size": (ctypes.c_int, [ctypes.c_char_p, P(ctypes.c_uint64)]),
        "snap_open": (ctypes.c_int, [P(SnapConfig), P(ctx_p)]),
        "snap_register_size": (ctypes.c_int, [ctx_p, P(SnapRegion), ctypes.c_size_t]),
        "snap_prepare": (ctypes.c_int, [ctx_p]),
        "snap_save": (ctypes.c_int, [ctx_p, ctypes.c_uint64]),
        "snap_save_on_stream": (ctypes.c_int, [ctx_p, ctypes.c_uint64, ctypes.c_void_p]),
        "snap_fence": (ctypes.c_int, [ctx_p]),
        "snap_fence_on_stream": (ctypes.c_int, [ctx_p, ctypes.c_void_p]),
        "snap_wait": (ctypes.c_int, [ctx_p]),
        "snap_latest": (ctypes.c_int, [ctx_p, P(ctypes.c_uint64)]),
        "snap_restore": (ctypes.c_int, [ctx_p, ctypes.c_uint64, P(ctypes.c_uint64)]),
        "snap_describe_size": (ctypes.c_int, [ctx_p, ctypes.c_uint64, P(ctypes.c_uint64), P(SnapRegionInfo),
                                              ctypes.c_uint32, P(ctypes.c_uint32), ctypes.c_size_t]),
        "snap_flush": (ctypes.c_int, [ctx_p, ctypes.c_uint64, ctypes.c_int]),
        "snap_errmsg": (ctypes.c_char_p, [ctx_p]),
        "snap_close": (ctypes.c_int, [ctx_p]),
        "snap_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "snap_crc32c": (ctypes.c_uint32, [ctypes.c_void_p, ctypes.c_size_t]),
    }
    for name, (res, args) in sig.items():
        f = getattr(h, name)
        f.restype, f.argtypes = res, args


def strerror(code):
    return lib().snap_strerror(code).decode()


def crc32c(buf):
    """CRC32C of a bytes-like or contiguous buffer (libsnap's, ISA-L)."""
    mv = memoryview(buf).cast("B")
    if mv.nbytes == 0:
        return 0
    if mv.readonly:
        c = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
    else:
        c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return lib().snap_crc32c(ctypes.addressof(c), mv.nbytes)


def crc32c_ptr(ptr, nbytes):
    return lib().snap_crc32c(ptr, nbytes) if nbytes else 0


def parse_size(s):
    v = ctypes.c_uint64()
    if lib().snap_parse_size(str(s).encode(), ctypes.byref(v)):
        raise ValueError(f"{s!r} is not a size (e.g. 4096, 64M, 2G)")
    return v.value


def parse_codec(spec):
    """'none', 'lossless', 'abs:B', 'rel:F' (SNAP_CODEC_PARAM spelling) -> (id, bound)."""
    spec = str(spec)
    if spec in ("none", "lossless"):
        return CODEC[spec], 0.0
    kind, _, num = spec.partition(":")
    try:
        bound = float(num)
    except ValueError:
        bound = -1.0
    if kind not in ("abs", "rel") or not bound > 0:
        raise ValueError(f"codec {spec!r}: expected none, lossless, abs:<bound> or rel:<factor> with a positive number")
    return CODEC[kind], bound


_STR_FIELDS = ("job", "store", "socket", "capture", "launch")
# enum snap_restore_verify, in order (SNAP_RESTORE_VERIFY takes the same names).
RESTORE_VERIFY = ("auto", "first", "inline")
# enum snap_autostart: the struct's 0 is the default (on); True/False map to ON/OFF.
AUTOSTART_DEFAULT, AUTOSTART_ON, AUTOSTART_OFF = 0, 1, -1


def config(overrides=None):
    """(struct snap_config, {python-side settings}): defaults, then SNAP_*
    variables, then overrides (a dict of C field names; sizes may be strings
    like "8G"). flush_dir is kept on the Python side (SNAP_FLUSH_DIR)."""
    cfg = SnapConfig()
    L = lib()
    L.snap_config_init_size(ctypes.byref(cfg), ctypes.sizeof(cfg))
    err = ctypes.create_string_buffer(512)
    if L.snap_config_from_env(ctypes.byref(cfg), err, len(err)):
        raise SnapError(EINVAL, err.value.decode())
    py = {"flush_dir": os.environ.get("SNAP_FLUSH_DIR", "")}
    names = {f for f, _ in SnapConfig._fields_} - {"size"}
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k in PY_SETTINGS:
            py[k] = os.fsdecode(v)
            continue
        if k in DAEMON_SETTINGS:
            raise TypeError(f"{k} is snapsmp's setting, not the trainer's: give snapsmp --{k.replace('_', '-')} "
                            f"or SNAP_{k.upper()} in its environment")
        if k not in names:
            raise TypeError(f"unknown libsnap setting {k!r}; the settings are the fields of struct snap_config: "
                            + ", ".join(sorted(names | set(PY_SETTINGS))))
        if k in _STR_FIELDS:
            b = os.fsencode(v)
            limit = ctypes.sizeof(dict(SnapConfig._fields_)[k])
            if len(b) >= limit:
                raise ValueError(f"{k} {v!r} is longer than {limit - 1} bytes")
            setattr(cfg, k, b)
        elif k == "chunk_size" and isinstance(v, str):
            try:
                setattr(cfg, k, parse_size(v))
            except ValueError as e:
                raise ValueError(f"chunk_size: {e}") from None
        elif k == "restore_verify" and isinstance(v, str):
            if v not in RESTORE_VERIFY:
                raise ValueError(f"restore_verify {v!r}: expected " + ", ".join(RESTORE_VERIFY))
            setattr(cfg, k, RESTORE_VERIFY.index(v))
        elif k == "autostart":
            if not isinstance(v, bool) and v not in (AUTOSTART_DEFAULT, AUTOSTART_ON, AUTOSTART_OFF):
                raise ValueError(f"autostart {v!r}: expected True or False (start snapsmp when none answers)")
            setattr(cfg, k, (AUTOSTART_ON if v else AUTOSTART_OFF) if isinstance(v, bool) else v)
        elif k in ("codec_param", "codec_optim") and isinstance(v, str):
            cid, bound = parse_codec(v)
            setattr(cfg, k, cid)
            setattr(cfg, k + "_bound", bound)
        else:
            setattr(cfg, k, v)
    return cfg, py


def config_dict(cfg, py):
    out = dict(py)
    for f, _ in SnapConfig._fields_:
        if f == "size":
            continue
        v = getattr(cfg, f)
        out[f] = os.fsdecode(v) if f in _STR_FIELDS else v
    return out


class Context:
    """A snap_ctx: one rank's connection to snapsmp and its registered regions."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.L = lib()
        self.h = ctypes.c_void_p()
        rc = self.L.snap_open(ctypes.byref(cfg), ctypes.byref(self.h))
        if rc:
            msg = self.errmsg() if self.h else strerror(rc)
            self.L.snap_close(self.h)
            self.h = None
            raise SnapError(rc, f"cannot open libsnap context (job {os.fsdecode(cfg.job)}, rank {cfg.rank}/"
                                f"{cfg.world_size}, store {os.fsdecode(cfg.store)}): {msg}")

    def errmsg(self):
        m = self.L.snap_errmsg(self.h)
        return m.decode(errors="replace") if m else ""

    def check(self, rc, what):
        if rc < 0:
            msg = self.errmsg() or strerror(rc)
            raise SnapError(rc, f"{what}: {msg}" if what else msg)
        return rc

    def register(self, name, ptr, nbytes, dtype, kind, shape, global_shape=None, offset=None,
                 device=DEVICE_HOST, codec=0, codec_bound=0.0):
        r = SnapRegion()
        bname = name.encode()
        r.name = bname
        r.ptr = ptr
        r.bytes = nbytes
        r.dtype, r.kind, r.device, r.codec, r.codec_bound = dtype, kind, device, codec, codec_bound
        r.ndim = len(shape)
        gs = shape if global_shape is None else global_shape
        off = [0] * len(shape) if offset is None else offset
        for d in range(len(shape)):
            r.shape[d], r.global_shape[d], r.shard_offset[d] = shape[d], gs[d], off[d]
        self.check(self.L.snap_register_size(self.h, ctypes.byref(r), ctypes.sizeof(r)), f"register {name!r}")

    def prepare(self):
        return self.check(self.L.snap_prepare(self.h), "prepare")

    def save(self, step, stream=None):
        if stream is None:
            return self.check(self.L.snap_save(self.h, step), f"save of step {step}")
        return self.check(self.L.snap_save_on_stream(self.h, step, stream), f"save of step {step}")

    def fence(self, stream=None):
        if stream is None:
            return self.check(self.L.snap_fence(self.h), "fence")
        return self.check(self.L.snap_fence_on_stream(self.h, stream), "fence")

    def wait(self):
        return self.check(self.L.snap_wait(self.h), "wait")

    def latest(self):
        s = ctypes.c_uint64()
        rc = self.L.snap_latest(self.h, ctypes.byref(s))
        if rc == ENOENT:
            return None
        self.check(rc, "latest")
        return s.value

    def describe(self, step=STEP_LATEST):
        """(step, [region dicts]) or None when nothing is restorable. After
        it, `note` is what a restore of that step would say (a newer step
        snapsmp passed over: "restore would fall back to step M: step N ..."),
        else ""."""
        self.note = ""
        n = ctypes.c_uint32()
        got = ctypes.c_uint64()
        for _ in range(4):   # the step may change between the two calls
            cap = n.value
            arr = (SnapRegionInfo * max(cap, 1))()
            rc = self.L.snap_describe_size(self.h, step, ctypes.byref(got), arr, cap, ctypes.byref(n),
                                           ctypes.sizeof(SnapRegionInfo))
            if rc == ENOENT:
                return None
            if rc == EOVERFLOW:
                continue
            self.check(rc, "")   # snapsmp's message names the step
            self.note = self.errmsg()
            return got.value, [info_dict(arr[i]) for i in range(n.value)]
        self.check(rc, "describe")

    def restore(self, step=STEP_LATEST):
        s = ctypes.c_uint64()
        rc = self.L.snap_restore(self.h, step, ctypes.byref(s))
        if rc == ENOENT:
            return None
        self.check(rc, "restore" if step == STEP_LATEST else f"restore of step {step}")
        return s.value

    def flush(self, step=STEP_LATEST, wait=True):
        return self.check(self.L.snap_flush(self.h, step, 1 if wait else 0), "flush")

    def close(self):
        if self.h:
            h, self.h = self.h, None
            rc = self.L.snap_close(h)
            if rc < 0:
                raise SnapError(rc, f"close: the last snapshot failed: {strerror(rc)}")


def info_dict(i):
    nd = i.ndim
    return {
        "name": i.name.decode(errors="replace"), "bytes": i.bytes, "dtype": DTYPE_NAME.get(i.dtype, "?"),
        "kind": KIND_NAME.get(i.kind, "?"), "device": i.device, "codec": i.codec, "codec_bound": i.codec_bound,
        "shape": tuple(i.shape[:nd]), "global_shape": tuple(i.global_shape[:nd]),
        "shard_offset": tuple(i.shard_offset[:nd]),
    }
