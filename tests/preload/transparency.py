#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Transparency of the capture (LD_PRELOAD=libsnap_preload.so) with real
programs nobody here wrote: each case runs twice, plainly into one directory
and preloaded beside a live snapsmp into another, from the same inputs. The
two trees must agree (names, types, sizes, bytes, modes, symlink targets,
and mtimes where the program sets them) as seen by a preloaded process
before the flush, and on disk without the preload after snapsmp's SIGTERM
flush; so must the exit statuses and the programs' own messages.

Before anything is compared the preload proves it is loaded and capturing:
a preloaded Python writes a marker that must be in the store's namespace and
not on the disk.

  --kill N   SIGKILL trials, N of each: a preloaded Python and a preloaded
             shell write numbered files, tar x and cp -r copy 300 files,
             a preloaded h5py writes and appends HDF5 checkpoints,
             each killed at a random file (after the program reported it);
             afterwards every visible file of Python, tar and cp is whole,
             and every file finished before the kill is there with its
             bytes, under the preload and on disk after the flush.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from events import strike_within, wait_socket  # noqa: E402
from checks import Checks  # noqa: E402
from skiprule import Skips  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--build", required=True)
ap.add_argument("--asan-runtime", default="")
ap.add_argument("--only", default="", help="comma-separated case names")
ap.add_argument("--kill", type=int, default=8, help="SIGKILL trials per writer")
ap.add_argument("--seed", type=int, default=0, help="0: a random seed, printed")
args = ap.parse_args()

SMP = os.path.join(args.build, "smp", "snapsmp")
PRELOAD = os.path.abspath(os.path.join(args.build, "integration", "libsnap_preload.so"))
ROOT = f"/tmp/snaptest-transp-{os.getpid()}"
STORE = f"/dev/shm/snaptest-transp-{os.getpid()}"
SRC, PLAIN, CAP = f"{ROOT}/src", f"{ROOT}/plain", f"{ROOT}/cap"
PY = sys.executable
check = Checks()   # counts the checks, prints each failure
KEPT = []   # (path, size) of files a killed writer had reported complete: on disk after the flush too
CASE_START = 1_700_000_000_000_000_000   # older mtimes than this are ones a program set (the inputs' are 2020)


def env(preload):
    e = dict(os.environ, SNAP_STORE=STORE, SNAP_CAPTURE=CAP, SNAP_JOB="tj", SNAP_TIMEOUT_MS="30000",
             ASAN_OPTIONS="detect_leaks=0", SRC=SRC, PY=PY, LC_ALL="C", TZ="UTC",
             GIT_AUTHOR_DATE="2020-01-01T00:00:00Z", GIT_COMMITTER_DATE="2020-01-01T00:00:00Z",
             GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
             GIT_CONFIG_NOSYSTEM="1", HOME=ROOT, TRANSP_NUMPY="1" if HAVE_NUMPY else "0",
             # split allocates aligned_alloc(4096, 128 KiB + 1), which a sanitizer runtime preloaded
             # into it refuses: in sanitizer builds awk cuts the same parts.
             SPLIT="awk '{print > (\"part.a\" substr(\"abcd\", int((NR - 1) / 30) + 1, 1))}'" if args.asan_runtime
             else "split -l 30 - part.")
    e.pop("LD_PRELOAD", None)
    if preload:
        e["LD_PRELOAD"] = ":".join(p for p in (args.asan_runtime, PRELOAD) if p)
    return e


# ---- the cases: (name, script run by bash in an empty directory, mtimes compared) --------------------

PYCASE = r'''
import json, os, shutil, subprocess, tempfile, sys
src = os.environ["SRC"]
shutil.copytree(src + "/tree", "ct")
shutil.copy2(src + "/tree/a.txt", "c2")
shutil.copy(src + "/tree/a.txt", "c1")
shutil.copytree(src + "/tree", "gone")
shutil.rmtree("gone")
shutil.copytree(src + "/tree", "mv1")
shutil.move("mv1", "mv2")
shutil.copy2(src + "/tree/a.txt", "f1")
shutil.move("f1", "ct/f1")
with tempfile.NamedTemporaryFile("w", dir=".", delete=False) as t:
    t.write("tmp")
os.replace(t.name, "tmpf")
fd, name = tempfile.mkstemp(dir=".")
os.write(fd, b"mk")
os.close(fd)
os.rename(name, "mkf")
with open("j.json", "w") as f:
    json.dump({"a": list(range(50))}, f)
with open("j.json") as f:
    assert json.load(f)["a"][49] == 49
with open("sp", "w") as f:
    subprocess.run(["seq", "1", "500"], stdout=f, check=True)
with open("sp", "a") as f:
    f.write("py\n")
    f.flush()
    subprocess.run(["echo", "child"], stdout=f, check=True)
    f.write("after\n")
subprocess.run("seq 3 > sh1; echo x >> sh1", shell=True, check=True)
pid = os.posix_spawnp("seq", ["seq", "7"], os.environ,
                      file_actions=[(os.POSIX_SPAWN_OPEN, 1, "ps", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)])
assert os.waitpid(pid, 0)[1] == 0
with open("ps2", "w") as f:
    f.write("before\n")
    f.flush()
    pid = os.posix_spawnp("echo", ["echo", "spawned"], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, f.fileno(), 1)])
    assert os.waitpid(pid, 0)[1] == 0
import socket
a, b = socket.socketpair()
pid = os.fork()
if pid == 0:
    a.close()
    msg, fds, _, _ = socket.recv_fds(b, 10, 1)
    os.write(fds[0], b"from the receiver\n")
    os._exit(0)
b.close()
with open("passed", "w") as f:
    f.write("sender\n")
    f.flush()
    socket.send_fds(a, [b"x"], [f.fileno()])
    assert os.waitpid(pid, 0)[1] == 0
    f.write("sender again\n")
with open("exitopen", "w") as f:
    pass
# O_TMPFILE (no name, on the real file system) linked into place; over a store file's name: EEXIST, as on disk.
fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o640)
os.write(fd, b"anonymous")
os.link(f"/proc/self/fd/{fd}", "tmpfile", follow_symlinks=True)
try:
    os.link(f"/proc/self/fd/{fd}", "j.json", follow_symlinks=True)
    open("linked-over", "w").close()
except FileExistsError:
    pass
os.close(fd)
# A process that ends without closing its file (os._exit: no finalizers): the end is its close.
subprocess.run([sys.executable, "-c", "import os; f = open('noclose', 'w'); f.write('never closed'); f.flush(); "
                "os._exit(0)"], check=True)
os.chmod("c1", 0o600)
os.utime("c1", ns=(1_500_000_000_000_000_000, 1_500_000_000_123_456_789))
os.symlink("c1", "c1link")
os.makedirs("d/e/f")
with open("d/e/f/deep", "wb") as f:
    f.write(os.urandom(0) + b"deep" * 1000)
if os.environ.get("TRANSP_NUMPY") == "1":
    import numpy as np
    a = np.arange(100000, dtype=np.float32)
    np.save("n.npy", a)
    np.savez("n.npz", a=a, b=a[:10])
    assert (np.load("n.npy") == a).all()
    m = np.lib.format.open_memmap("mm.npy", mode="w+", dtype=np.int32, shape=(1000,))
    m[:] = 7
    m.flush()
    del m
'''

H5CASE = r'''
import h5py, numpy as np, os
name = os.environ.get("H5NAME", "ck.h5")
with h5py.File(name, "w") as f:
    f.create_dataset("w", data=np.arange(1000, dtype="f4").reshape(10, 100))
    f.create_dataset("log", shape=(0, 16), maxshape=(None, 16), chunks=(4, 16), dtype="i8")
    f.attrs["step"] = 0
for s in range(1, 5):
    with h5py.File(name, "a") as f:
        d = f["log"]; n = d.shape[0]; d.resize(n + 3, axis=0); d[n:] = np.full((3, 16), s)
        f.attrs["step"] = s
        f.create_group(f"g{s}").create_dataset("x", data=np.random.RandomState(s).rand(50), compression="gzip")
with h5py.File(name, "r") as f:
    print(f.attrs["step"], f["log"].shape, float(f["log"][()].sum()), float(f["g3/x"][()].sum()))
'''

APPENDCASE = r'''
import zipfile, tarfile, pickle, os, io
zi = lambda n: zipfile.ZipInfo(n, (2020, 1, 1, 0, 0, 0))
with zipfile.ZipFile("z.zip", "w") as z: z.writestr(zi("a"), b"a" * 1000)
with zipfile.ZipFile("z.zip", "a", compression=zipfile.ZIP_DEFLATED) as z: z.writestr(zi("b"), b"b" * 5000)
with zipfile.ZipFile("z.zip") as z: print(z.namelist(), len(z.read("b")))
def ti(n, b):
    t = tarfile.TarInfo(n); t.size = len(b); t.mtime = 1577836800; return t
with tarfile.open("t.tar", "w") as t: t.addfile(ti("a", b"a" * 700), io.BytesIO(b"a" * 700))
with tarfile.open("t.tar", "a") as t: t.addfile(ti("b", b"b" * 900), io.BytesIO(b"b" * 900))
with tarfile.open("t.tar") as t: print(t.getnames())
with open("p.tmp", "wb") as f: pickle.dump({"k": list(range(1000))}, f)
os.replace("p.tmp", "p.pkl")
with open("p.pkl", "rb") as f: print(len(pickle.load(f)["k"]))
'''

TORCHCASE = r'''
import torch, io, os
torch.manual_seed(0)
obj = {"w": torch.randn(100, 10), "step": 3}
buf = io.BytesIO(); torch.save(obj, buf, _use_new_zipfile_serialization=False)
torch.save(obj, "legacy.tmp", _use_new_zipfile_serialization=False)
os.replace("legacy.tmp", "legacy.pt")
assert open("legacy.pt", "rb").read() == buf.getvalue()
back = torch.load("legacy.pt")
assert torch.equal(back["w"], obj["w"])
with open("legacy.digest", "w") as f: f.write(repr(back["w"].sum().item()))
os.unlink("legacy.pt")
'''

CALLSCASE = r'''
import os, fcntl, ctypes, shutil, errno
src = os.environ["SRC"]
libc = ctypes.CDLL(None, use_errno=True)
def r2(a, b, fl):
    r = libc.renameat2(-100, a.encode(), -100, b.encode(), fl)
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
out = []
shutil.copyfile(src + "/tree/x.bin", "cf")
# From the inputs' file system: the store is another one (EXDEV from the kernel, copied by hand).
s = os.open(src + "/tree/x.bin", os.O_RDONLY); d = os.open("cfr", os.O_WRONLY | os.O_CREAT, 0o644)
n = os.fstat(s).st_size; o = 0
while o < n: o += os.copy_file_range(s, d, n - o)
os.close(d); d = os.open("sf", os.O_WRONLY | os.O_CREAT, 0o644)
os.sendfile(d, s, 0, n); os.close(d); os.close(s)
s = os.open("cfr", os.O_RDONLY); d = os.open("cfr2", os.O_WRONLY | os.O_CREAT, 0o644)
out.append(os.copy_file_range(s, d, 1 << 20, 100, 0)); os.close(s); os.close(d)
d = os.open("fa", os.O_RDWR | os.O_CREAT, 0o644); os.posix_fallocate(d, 0, 100000); os.write(d, b"head"); os.close(d)
d = os.open("fa2", os.O_RDWR | os.O_CREAT, 0o644); os.write(d, b"x" * 9000)
out.append(libc.fallocate(d, 3, 4096, 4096))   # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
os.close(d)
with open("lk", "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); f.write("locked"); fcntl.flock(f, fcntl.LOCK_UN)
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); f.write(" lockf"); fcntl.lockf(f, fcntl.LOCK_UN)
with open("lk2", "w") as f:   # Python's lockf is fcntl(F_SETLK): the store's copy is locked
    f.write("record")
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 3, 1); f.write(" locked"); fcntl.lockf(f, fcntl.LOCK_UN, 3, 1)
with open("e1", "w") as f: f.write("one")
with open("e2", "w") as f: f.write("two two")
os.chmod("e2", 0o600)
out.append(r2("e1", "e2", 2))   # RENAME_EXCHANGE
out.append(r2("e1", "e2", 1))   # RENAME_NOREPLACE
out.append(r2("e1", "e3", 1))
with open("re", "w") as f: f.write("real?")
out.append(r2("e3", "nothere/x", 2))
with open("calls.out", "w") as f: f.write(repr(out) + "\n")
'''


H5LOCKCASE = r'''coproc H { "$PY" -c '
import h5py, numpy as np, sys
with h5py.File("held.h5", "w") as f:
    f.create_dataset("d", data=np.arange(10))
with h5py.File("held.h5", "a") as f:
    f["d"][0] = 5
    f.flush()
    print("locked", flush=True)
    sys.stdin.readline()
'; }
read -r line <&"${H[0]}"
for m in r a; do "$PY" -c "
import h5py, sys
try:
    h5py.File('held.h5', '$m').close()
    print('$m opened')
except OSError as e:
    print('$m refused', e.errno)
" >> opens; done
echo go >&"${H[1]}"; wait $H_PID
"$PY" -c "
import h5py
with h5py.File('held.h5', 'r') as f: print(list(f['d'][()]))" >> opens
'''

CASES = [
    ("redirect", r'''seq 1 1000 > out; echo tail >> out; ls /nonexistent-dir 2> err; echo rc=$? >> err
cat <<EOF > here
line $((1+2)) $(echo sub)
EOF
exec 4> fd4; echo a >&4; seq 3 >&4; echo b >&4; exec 4>&-
head -c 100000 /dev/zero | tr '\0' x > blob
{ echo one; seq 2; } > group; (echo sub; seq 2) > subsh
echo marker > m1 && cat m1 > m2 && cat m1 m2 > m3''', False),
    ("shell2", r'''seq 5 &> both; { echo out; echo err >&2; } > mixed 2>&1; echo x >| clob; cat > cat1 <<< "here string"
exec 5>> app; echo 1 >&5; (echo 2 >&5); echo 3 >&5; exec 5>&-
seq 100 | eval "$SPLIT"; awk '{print > ("awk." ($1 % 3))}' part.aa; seq 10 | xargs -n 3 echo > xa
t=$(mktemp -p .); echo temp > "$t"; mv "$t" mt; perl -e 'open(F,">","pl") or die; print F "perl\n"; close F'
perl -pi -e 's/perl/PERL/' pl; find . -name 'part.*' | sort | xargs cat > found; csplit -s -f cs found 50
(exec > whole; echo a; seq 2; echo b)''', False),
    ("cp", r'''cp -a "$SRC/tree" tree; cp "$SRC/tree/a.txt" plain.txt; cp -p "$SRC/tree/x.bin" p.bin
cp -r "$SRC/tree" r; cp a-missing b 2> err; echo rc=$? >> err''', True),
    ("mv", r'''cp "$SRC/tree/a.txt" m1; mv m1 m2; mkdir d; cp -r "$SRC/tree" d/; mv d d2; cp -a "$SRC/tree/a.txt" m3
mv m3 d2/''', True),
    ("install", r'''install -m 0750 "$SRC/tree/a.txt" inst; install -D -m 0600 "$SRC/tree/a.txt" sub/dir/inst2
install -p -m 0644 "$SRC/tree/x.bin" inst3''', True),
    ("sort", r'''sort -r -o s "$SRC/words"; sort -o s s; sort -u s -o u; sort -n "$SRC/words" > n''', False),
    ("sed", r'''cp "$SRC/tree/a.txt" e.txt; chmod 0640 e.txt; sed -i 's/a/A/g' e.txt; sed -i.bak 's/A/B/' e.txt
sed 's/b/c/' e.txt > f.txt''', False),
    # dd's block sizes are whole pages: under a sanitizer build the runtime preloaded into dd
    # refuses its aligned_alloc(4096, n) of other sizes.
    ("truncate-dd", r'''truncate -s 10000 t1; truncate -s 100 t1; dd if=/dev/zero of=d1 bs=4k count=3 status=none
dd if="$SRC/words" of=d1 bs=4096 seek=1 count=1 conv=notrunc status=none; dd if="$SRC/tree/x.bin" of=d2 bs=4096 skip=2 status=none
cp "$SRC/tree/x.bin" t2; truncate -s 5000 t2''', False),
    ("tee", r'''seq 100 | tee t1 t2 > /dev/null; echo x | tee -a t1 > /dev/null''', False),
    ("ln", r'''echo x > f; ln -s f sl; ln f hl; ln -sf f sl2; readlink sl > rl; cp "$SRC/tree/a.txt" g; ln -s g gl
cat gl > gcat''', False),
    ("chmod", r'''echo x > c1; chmod 0600 c1; echo y > c2; chmod u+x,g-r c2; cp "$SRC/tree/a.txt" c3; chmod 444 c3
mkdir dd; echo z > dd/z; chmod -R go-rwx dd; echo o > o1; chown 1234:5678 o1 2> cherr; echo rc=$? >> cherr
echo o > o2; chown "$(id -u):$(id -g)" o2''', False),
    ("touch", r'''touch -d '2020-01-02 03:04:05' t1; echo x > t2; touch -d '2019-05-06 07:08:09.123456789' t2
touch -r "$SRC/tree/a.txt" t3; touch t4; touch -m -d '2001-01-01' t4''', True),
    # --sort=name on the second archive: a listing gives the store's files after the real directory's
    # entries (docs/preload.md), and tar archives in listing order.
    ("tar", r'''tar cf a.tar -C "$SRC" tree; mkdir x; tar xf a.tar -C x; tar cf b.tar --sort=name -C x tree; mkdir y
tar xpf b.tar -C y; tar tvf b.tar > list''', True),
    ("gzip", r'''cp -p "$SRC/words" w; gzip -k w; gzip -n -c w > w2.gz; gunzip -c w.gz > w3; cp -p w w4; gzip w4
gunzip w4.gz''', True),
    ("python", f'"$PY" - <<\'PYEOF\'\n{PYCASE}\nPYEOF', True),
    ("py-append", f'"$PY" - <<\'PYEOF\'\n{APPENDCASE}\nPYEOF', True),
    ("linux-calls", f'"$PY" - <<\'PYEOF\'\n{CALLSCASE}\nPYEOF', True),
]
skips = Skips()
HAVE_NUMPY = subprocess.run([PY, "-c", "import numpy"], capture_output=True).returncode == 0
skips.optional("python-numpy", "numpy for the interpreter", HAVE_NUMPY)
HAVE_H5PY = subprocess.run([PY, "-c", "import h5py"], capture_output=True).returncode == 0
if skips.optional("h5py", "h5py (python3-h5py) for the interpreter", HAVE_H5PY):
    # HDF5 locks the files it opens (flock): they go to the real file system; with its locking off
    # (HDF5_USE_FILE_LOCKING=FALSE) they stay in the store.
    CASES.append(("h5py", f'"$PY" - <<\'PYEOF\'\n{H5CASE}\nPYEOF\nh5dump ck.h5 > ck.dump 2>&1\n'
                          f'H5NAME=nolock.h5 HDF5_USE_FILE_LOCKING=FALSE "$PY" - <<\'PYEOF\'\n{H5CASE}\nPYEOF\n'
                          f'h5dump nolock.h5 | sed 1d > nolock.dump', False))
    CASES.append(("h5py-lock", H5LOCKCASE, False))
if skips.optional("torch", "torch for the interpreter",
                  subprocess.run([PY, "-c", "import torch"], capture_output=True).returncode == 0):
    CASES.append(("torch-legacy", f'"$PY" - <<\'PYEOF\'\n{TORCHCASE}\nPYEOF', False))
if skips.optional("zip", "zip and unzip (scripts/install-deps.sh)", shutil.which("zip") and shutil.which("unzip")):
    CASES.append(("zip", r'''cd "$SRC" && zip -q -X -r "$OLDPWD/z.zip" tree && cd "$OLDPWD"; mkdir u; unzip -q z.zip -d u''',
                  True))
if skips.optional("sqlite3", "sqlite3 (scripts/install-deps.sh)", shutil.which("sqlite3")):
    CASES.append(("sqlite3", r'''sqlite3 db.sqlite "create table t(a,b); insert into t values(1,'x'),(2,'y');"
sqlite3 db.sqlite "insert into t select a+2,b from t;" "select count(*) from t;" > count
sqlite3 db.sqlite "pragma journal_mode=wal; insert into t values(9,'w');" > wal''', False))
if skips.optional("git", "git (scripts/install-deps.sh)", shutil.which("git")):
    CASES.append(("git", r'''git init -q repo && cd repo && cp -a "$SRC/tree/." . && git add -A && git commit -q -m one
echo more >> a.txt && git commit -q -am two && git gc -q && git log --format=%H > ../log && git status --short > ../st''',
                  False))
if skips.optional("rsync", "rsync (scripts/install-deps.sh)", shutil.which("rsync")):
    CASES.append(("rsync", r'''rsync -a "$SRC/tree/" r/; rsync -a --inplace "$SRC/tree/" r2/''', True))


# The files each case leaves on the real file system before the flush (snapsmp runs with
# --flush-files 0, so everything else is in the store): the documented fallbacks, and
# nothing more. Cases not listed are only compared (their fallbacks are printed).
EXPECT_REAL = {
    "cp": {"err"}, "mv": set(), "install": set(), "truncate-dd": set(), "tee": set(), "touch": set(),
    "chmod": {"o1", "cherr"},   # a chown to another owner, and a redirection
    "sort": {"n"},
    "sed": {"f.txt"}, "zip": set(), "rsync": set(),   # sed -i and zip write mkstemp temporaries: store files too
    "ln": {"f", "hl", "rl", "gcat"},   # the hard link's two names, and redirections
    "tar": {"list"},
    "py-append": set(), "torch-legacy": set(),
    "h5py": {"ck.h5", "ck.dump", "nolock.dump"},   # HDF5's flock, redirections
    "h5py-lock": {"held.h5", "opens"},
    "linux-calls": {"e2", "e3", "lk"},   # renameat2's RENAME_EXCHANGE (e3 is e1 renamed after), flock
}


def on_disk_files(top):
    return {os.path.relpath(os.path.join(d, n), top) for d, _, fs in os.walk(top) for n in fs
            if not os.path.islink(os.path.join(d, n))}


def make_src():
    os.makedirs(f"{SRC}/tree/sub", exist_ok=True)
    rng = random.Random(5)
    with open(f"{SRC}/tree/a.txt", "w") as f:
        f.write("alpha beta gamma\nabc\n")
    with open(f"{SRC}/tree/x.bin", "wb") as f:
        f.write(bytes(rng.getrandbits(8) for _ in range(20000)))
    with open(f"{SRC}/tree/sub/s.txt", "w") as f:
        f.write("sub\n")
    os.chmod(f"{SRC}/tree/a.txt", 0o640)
    os.chmod(f"{SRC}/tree/x.bin", 0o755)
    os.symlink("a.txt", f"{SRC}/tree/link")
    for i, p in enumerate(["a.txt", "x.bin", "sub/s.txt", "sub", ""]):
        os.utime(f"{SRC}/tree/{p}", ns=(1_600_000_000_000_000_000 + i, 1_600_000_000_123_456_789 + i * 1000))
    with open(f"{SRC}/words", "w") as f:
        f.write("".join(f"{rng.randrange(1000)} w{rng.randrange(50)}\n" for _ in range(2000)))


# A walker run plainly, or under the preload: what a program there sees.
WALK = r'''
import hashlib, json, os, stat, sys
top, out = sys.argv[1], {}
for d, dirs, files in os.walk(top):
    dirs.sort()
    for n in sorted(dirs + files):
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, top)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ["l", os.readlink(p), 0, st.st_mtime_ns]
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ["d", "", stat.S_IMODE(st.st_mode), 0]
        else:
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()
            out[rel] = ["f" + str(st.st_size), f"{h} {st.st_uid}:{st.st_gid}", stat.S_IMODE(st.st_mode), st.st_mtime_ns]
print(json.dumps(out))
'''

# git's index records each file's inode, device and ctime: different in any two runs.
GIT_VOLATILE = ("repo/.git/index",)


def walk(top, preload):
    r = subprocess.run([PY, "-c", WALK, top], env=env(preload), capture_output=True, text=True, timeout=300)
    if r.returncode:
        return {"<walk failed>": r.stderr[-2000:]}
    return json.loads(r.stdout)


def comparable(tree, mtimes, plain=None):
    """mtimes: the case's program sets times; then a file's mtime is compared
    where the plain run's is older than the case (set by the program, not the
    clock's now); directories' times are the clock's in both runs."""
    out = {}
    for k, v in tree.items():
        kind, h, mode, mt = v
        if kind == "d" and k.startswith("repo/.git/objects/"):
            continue   # git makes object directories as it packs them
        ref = (plain or tree).get(k)
        if kind == "d" or not mtimes or not ref or ref[3] >= CASE_START:
            mt = 0
        out[k] = [kind, h, mode, mt]
    return out


def differences(a, b):
    keys = sorted(set(a) | set(b))
    return [f"{k}: plain {a.get(k)} preloaded {b.get(k)}" for k in keys if a.get(k) != b.get(k)][:12]


def run_case(name, script, preload):
    d = os.path.join(CAP if preload else PLAIN, name)
    os.makedirs(d)
    r = subprocess.run(["bash", "-c", script], cwd=d, env=env(preload), capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def prove_active():
    marker = f"{CAP}/.marker"
    r = subprocess.run([PY, "-c", f"open({marker!r}, 'w').write('capture')"], env=env(True),
                       capture_output=True, text=True, timeout=120)
    in_store = os.path.exists(f"{STORE}/tj/files/ns{marker}")
    on_disk = os.path.exists(marker)
    ok = check(r.returncode == 0 and in_store and not on_disk,
               f"the preload is loaded and captures: a preloaded write of {marker} is in the store's namespace "
               f"({in_store}) and not on disk ({on_disk}); rc {r.returncode} {r.stderr[-500:]}")
    return ok


PRELOAD_SAYS = "libsnap preload["


def strip_warnings(s):
    return "\n".join(l for l in s.splitlines() if PRELOAD_SAYS not in l)


def kill_trials(rng, smp):
    """SIGKILL mid-run: a preloaded writer reports each finished file; it is
    killed after a random one of them."""
    pywriter = ("import os, sys\n"
                "for i in range(1000):\n"
                "    with open(f'f{i}.tmp', 'wb') as f:\n"
                "        f.write(bytes([i % 251]) * (1000 + 997 * i))\n"
                "    os.replace(f'f{i}.tmp', f'f{i}')\n"
                "    with open(f'g{i}', 'wb') as f:\n"
                "        f.write(bytes([i % 251]) * (1000 + 997 * i))\n"
                "    print(i, flush=True)\n")
    shwriter = 'for i in $(seq 0 999); do head -c $((1000 + 997 * i)) /dev/zero > s$i; echo $i; done'
    for kind, argv in (("python", [PY, "-c", pywriter]), ("shell", ["bash", "-c", shwriter])):
        for t in range(args.kill):
            d = f"{CAP}/kill-{kind}-{t}"
            os.makedirs(d)
            at = rng.randrange(1, 40)
            p = subprocess.Popen(argv, cwd=d, env=env(True), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            reported = -1
            for line in p.stdout:
                reported = int(line)
                if reported >= at:
                    break
            p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()
            seen = walk(d, True)
            for i in range(reported + 1):
                names = [f"f{i}", f"g{i}"] if kind == "python" else [f"s{i}"]
                for n in names:
                    check(n in seen and seen[n][0] == f"f{1000 + 997 * i}",
                          f"kill {kind} {t}: {n}, reported complete before the kill, is there whole: {seen.get(n)}")
                    KEPT.append((os.path.join(d, n), 1000 + 997 * i))
            if kind == "python":
                for n, v in seen.items():
                    if n.endswith(".tmp"):
                        continue
                    i = int(n[1:])
                    check(v[0] == f"f{1000 + 997 * i}", f"kill python {t}: a visible file is complete: {n} {v}")
    if HAVE_H5PY:
        kill_h5py(rng)
    # tar x and cp -r killed mid-run: they name each file as they start it (-v), so a file named
    # before the last one is complete; every file visible afterwards must be whole (a store file
    # appears only at its close), and the ones finished before the kill must be there.
    big = f"{ROOT}/killsrc"
    if not os.path.isdir(big):
        os.makedirs(big)
        for i in range(300):
            with open(f"{big}/k{i:03d}", "wb") as f:
                f.write(bytes([i % 251]) * (4096 + 7919 * i))
        subprocess.run(["tar", "cf", f"{ROOT}/kill.tar", "-C", big, "."], check=True)
    sizes = {f"k{i:03d}": 4096 + 7919 * i for i in range(300)}
    for kind, argv in (("tar", ["tar", "xvf", f"{ROOT}/kill.tar"]), ("cp", ["cp", "-rv", f"{big}/.", "."])):
        for t in range(args.kill):
            d = f"{CAP}/kill-{kind}-{t}"
            os.makedirs(d)
            at = rng.randrange(2, 250)
            p = subprocess.Popen(argv, cwd=d, env=env(True), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            started = []
            for line in p.stdout:
                name = os.path.basename(line.decode().split(" -> ")[-1].strip().strip("'"))
                if name in sizes:
                    started.append(name)
                if len(started) > at:
                    break
            p.kill()
            p.wait()
            p.stdout.close()
            seen = walk(d, True)
            for n in started[:-1]:
                check(seen.get(n, [""])[0] == f"f{sizes[n]}",
                      f"kill {kind} {t}: {n}, finished before the kill, is there whole: {seen.get(n)}")
                KEPT.append((os.path.join(d, n), sizes[n]))
            for n, v in seen.items():
                if n in sizes:
                    check(v[0] == f"f{sizes[n]}", f"kill {kind} {t}: a visible file is whole: {n} {v}")
    # snapsmp still serves: the next case's commits work (checked by the caller's flush comparison).
    return smp


H5WRITER = r'''
import h5py, numpy as np
H5N = lambda i: 200000 + 9973 * i
for i in range(1000):
    with h5py.File(f"ck{i}.h5", "w") as f:
        f.create_dataset("d", data=np.full(H5N(i), i, dtype="i4"), maxshape=(None,), chunks=(65536,))
    print(i, "created", flush=True)
    with h5py.File(f"ck{i}.h5", "a") as f:
        d = f["d"]
        n = d.shape[0]
        d.resize(2 * n, axis=0)
        d[n:] = i
        f.attrs["done"] = 1
    print(i, flush=True)
'''
# Reads every visible checkpoint back (preloaded, or plainly after the flush): name -> [length, done, all i].
H5READER = r'''
import h5py, json, os, sys
out = {}
for n in sorted(os.listdir(sys.argv[1])):
    if n.startswith("ck") and n.endswith(".h5"):
        try:
            with h5py.File(os.path.join(sys.argv[1], n), "r") as f:
                d = f["d"][()]
                out[n] = [len(d), int(f.attrs.get("done", 0)), bool((d == int(n[2:-3])).all())]
        except Exception as e:
            out[n] = str(e)
print(json.dumps(out))
'''


def h5n(i):
    """The length of checkpoint i's dataset before its append (H5WRITER's H5N)."""
    return 200000 + 9973 * i


def h5_read(d, preload):
    r = subprocess.run([PY, "-c", H5READER, d], env=env(preload), capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"reader failed": r.stderr[-2000:]}


H5_KEPT = []   # (dir, checkpoint numbers finished before the kill): read back plainly after the flush


def kill_h5py(rng):
    """h5py checkpoints (create, then reopen 'a' and append to a chunked dataset; HDF5's file locking
    off, so they are store files), SIGKILLed after
    a random one of them was reported closed: every checkpoint visible afterwards opens and holds
    one of its two whole states, and every reported one is there complete."""
    for t in range(args.kill):
        d = f"{CAP}/kill-h5py-{t}"
        os.makedirs(d)
        at = rng.randrange(1, 24)   # a report: "i created" (then killed in the append) or "i" (closed)
        # HDF5's locking off: its files stay in the store (with it on they are real files, torn by a kill
        # as without the preload).
        p = subprocess.Popen([PY, "-c", H5WRITER], cwd=d, env=dict(env(True), HDF5_USE_FILE_LOCKING="FALSE"),
                             stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        reported, lines, stamps = -1, 0, []
        for line in p.stdout:
            lines += 1
            stamps.append(time.monotonic())
            if b"created" not in line:
                reported = int(line)
            if lines >= at:
                break
        # Then a random moment within the next report's time, as measured between the writer's last two
        # (the checks hold at any moment: this spreads the kills over its opens, writes and closes;
        # reports it prints meanwhile are not counted).
        strike_within(rng, stamps[-1] - stamps[-2] if len(stamps) > 1 else 0.0)
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
        seen = h5_read(d, True)
        check(all(f"ck{i}.h5" in seen for i in range(reported + 1)),
              f"kill h5py {t}: the {reported + 1} checkpoints reported before the kill are there: {sorted(seen)}")
        for n, v in seen.items():
            i = int(n[2:-3]) if n.startswith("ck") else -1
            whole = isinstance(v, list) and v[2] and (v[0], v[1]) in ((h5n(i), 0), (2 * h5n(i), 1))
            check(whole and (i > reported or v[1] == 1),
                  f"kill h5py {t}: {n} opens whole ({'finished' if i <= reported else 'visible'}): {v}")
        H5_KEPT.append((d, reported))


def h5_kept_on_disk():
    for d, reported in H5_KEPT:
        seen = h5_read(d, False)
        bad = [i for i in range(reported + 1) if seen.get(f"ck{i}.h5") != [2 * h5n(i), 1, True]]
        check(not bad, f"{d}: checkpoints finished before the kill are whole on disk after the flush: missing or "
                       f"torn {bad[:5]} {seen.get('reader failed', '')}")


only_cases = set(filter(None, args.only.split(",")))


def main():
    seed = args.seed or random.SystemRandom().randrange(1, 1 << 30)
    print(f"seed {seed} (replay with --seed {seed})", flush=True)
    rng = random.Random(seed)
    shutil.rmtree(ROOT, ignore_errors=True)
    shutil.rmtree(STORE, ignore_errors=True)
    os.makedirs(PLAIN)
    os.makedirs(CAP)
    make_src()
    smp = subprocess.Popen([SMP, "--store", STORE, "--flush-files", "0", "--quiet"], stderr=subprocess.PIPE, text=True,
                           env=env(False))
    if not wait_socket(STORE, smp):
        print(f"snapsmp did not start: {smp.stderr.read()}")
        return 1
    try:
        if not prove_active():
            return 1
        only = only_cases
        cases = [c for c in CASES if not only or c[0] in only]
        before = {}
        for name, script, mtimes in cases:
            rc0, out0, err0 = run_case(name, script, False)
            rc1, out1, err1 = run_case(name, script, True)
            check(rc0 == rc1, f"{name}: exit status plain {rc0}, preloaded {rc1}\n{err1[-3000:]}")
            check(out0 == out1 and err0 == strip_warnings(err1).rstrip("\n") + ("\n" if err0.endswith("\n") else "")
                  if err0 or err1 else out0 == out1,
                  f"{name}: the program's messages differ\nplain: {out0[-1500:]}{err0[-1500:]}\n"
                  f"preloaded: {out1[-1500:]}{err1[-1500:]}")
            pa = walk(f"{PLAIN}/{name}", False)
            a = comparable(pa, mtimes)
            b = comparable(walk(f"{CAP}/{name}", True), mtimes, pa)
            for k in [k for k in a if k.startswith(GIT_VOLATILE)]:
                a.pop(k, None)
                b.pop(k, None)
            diff = differences(a, b)
            check(not diff, f"{name}: the tree seen under the preload differs from the plain run's:\n  " + "\n  ".join(diff))
            before[name] = (a, mtimes, pa)
            if name in EXPECT_REAL:
                real = on_disk_files(f"{CAP}/{name}")
                check(real == EXPECT_REAL[name], f"{name}: on the real file system before the flush: {sorted(real)}, "
                                                 f"expected only the documented fallbacks {sorted(EXPECT_REAL[name])}")
            warned = sorted({l.split("]: ", 1)[-1] for l in err1.splitlines() if PRELOAD_SAYS in l})
            print(f"{name}: {'ok' if not diff and rc0 == rc1 else 'DIFFERS'}"
                  + (f"; fallbacks: {warned}" if warned else "; all in the store"), flush=True)
        if args.kill and (not only or "kill" in only):
            kill_trials(rng, smp)
    finally:
        smp.send_signal(signal.SIGTERM)
        try:
            _, err = smp.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            smp.kill()
            _, err = smp.communicate()
    check(smp.returncode == 0, f"snapsmp exits 0 after its SIGTERM flush: {smp.returncode} {err[-2000:]}")
    for name, (a, mtimes, pa) in before.items():
        c = comparable(walk(f"{CAP}/{name}", False), mtimes, pa)
        for k in [k for k in c if k.startswith(GIT_VOLATILE)]:
            c.pop(k, None)
        diff = differences(a, c)
        check(not diff, f"{name}: on disk after the flush, without the preload, the tree differs from the plain "
                        f"run's:\n  " + "\n  ".join(diff))
    h5_kept_on_disk()
    lost = [p for p, size in KEPT if not os.path.isfile(p) or os.path.getsize(p) != size]
    check(not lost and (KEPT or not args.kill or (only_cases and "kill" not in only_cases)), f"the {len(KEPT)} files killed writers had completed are on disk after the flush: "
                             f"lost {lost[:5]}")
    left = [os.path.join(d, n) for d, _, fs in os.walk(CAP) for n in fs if ".snapfallback-" in n or ".snapflush-" in n]
    check(not left, f"no temporary files left on disk: {left[:5]}")
    print(f"{check.passed} checks passed, {check.failed} failed, {skips.summary()}", flush=True)
    if not check.failed:
        shutil.rmtree(ROOT, ignore_errors=True)
        shutil.rmtree(STORE, ignore_errors=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
