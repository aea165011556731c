/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * preload.h - libsnap_preload.so internals (not installed).
 *
 * LD_PRELOAD=libsnap_preload.so SNAP_CAPTURE=/ckpt: files a process writes
 * under a captured directory go to the node store of the local snapsmp
 * (smp/files/fileopen.c) instead of the file system, and are read back from it.
 * docs/design/captured-files.md has the model; in short:
 *
 *  - A file opened for writing is a fresh data file in the store, created by
 *    snapsmp and opened by this process; the application's descriptor IS
 *    that file, so write, pwrite, lseek, read, fstat, mmap and fsync run
 *    natively at memory speed. Hooks only reserve memory budget before a
 *    write grows the file, and commit it at its last close (CRC32C per
 *    chunk, then snapsmp publishes its manifest atomically).
 *  - Reads, stat and listings come straight from the store's namespace
 *    tree (no round trip), merged with the real directory.
 *  - Without snapsmp, or with the store full, writes go to the real file
 *    system with one warning: a checkpoint is never lost to the middleware.
 *
 * Non-captured calls cost one table load (descriptors) or one prefix test
 * (paths) before the real call.
 */
#ifndef SNAP_PRELOAD_H
#define SNAP_PRELOAD_H

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "snap/buf.h"
#include "snap/fileman.h"

#define PL_HIDDEN __attribute__((visibility("hidden")))
#define PL_MAXFD 65536
#define PL_MAXCAP 16

_Static_assert(sizeof(off_t) == 8, "the preload assumes a 64-bit off_t (LP64 Linux)");

/* ---- the real functions (real.c) ---- */
struct pl_real {
	int (*openat)(int, const char *, int, ...);
	int (*open_2)(const char *, int);
	int (*openat_2)(int, const char *, int);
	FILE *(*fopen)(const char *, const char *);
	FILE *(*fopen64)(const char *, const char *);
	FILE *(*fdopen)(int, const char *);
	int (*close)(int);
	int (*fclose)(FILE *);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*pwrite)(int, const void *, size_t, off_t);
	ssize_t (*writev)(int, const struct iovec *, int);
	ssize_t (*pwritev)(int, const struct iovec *, int, off_t);
	ssize_t (*pwritev2)(int, const struct iovec *, int, off_t, int);
	size_t (*fwrite)(const void *, size_t, size_t, FILE *);
	ssize_t (*sendfile)(int, int, off_t *, size_t);
	ssize_t (*copy_file_range)(int, off_t *, int, off_t *, size_t, unsigned);
	int (*ftruncate)(int, off_t);
	int (*truncate)(const char *, off_t);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*fstatat)(int, const char *, struct stat *, int);
	int (*statx)(int, const char *, int, unsigned, struct statx *);
	int (*xstat)(int, const char *, struct stat *);
	int (*lxstat)(int, const char *, struct stat *);
	int (*fxstatat)(int, int, const char *, struct stat *, int);
	int (*faccessat)(int, const char *, int, int);
	int (*renameat2)(int, const char *, int, const char *, unsigned);
	int (*renameat)(int, const char *, int, const char *);
	int (*unlinkat)(int, const char *, int);
	DIR *(*opendir)(const char *);
	DIR *(*fdopendir)(int);
	struct dirent64 *(*readdir64)(DIR *);
	int (*closedir)(DIR *);
	void (*rewinddir)(DIR *);
	ssize_t (*getdents64)(int, void *, size_t);
	int (*chdir)(const char *);
	int (*fchdir)(int);
	mode_t (*umask)(mode_t);
};
PL_HIDDEN extern struct pl_real pl_real;
PL_HIDDEN extern atomic_int pl_ready;
PL_HIDDEN void pl_init(void);
#define PL_INIT()                                                                      \
	do {                                                                           \
		if (__builtin_expect(!atomic_load_explicit(&pl_ready, memory_order_acquire), 0)) \
			pl_init();                                                     \
	} while (0)

/* ---- configuration and paths (paths.c) ---- */
struct pl_cfg {
	int enabled;                    /* SNAP_CAPTURE names at least one valid directory */
	int ncap;
	char cap[PL_MAXCAP][PATH_MAX];  /* normalized, no trailing '/' */
	size_t caplen[PL_MAXCAP];
	char job[80], socket[PATH_MAX];
	char ns[PATH_MAX], data[PATH_MAX];   /* <store>/<job>/files/{ns,data} */
	uint32_t chunk;                 /* SNAP_CHUNK_SIZE: CRC granularity */
	unsigned timeout_ms;            /* SNAP_TIMEOUT_MS: one request's reply */
	char store[PATH_MAX];
	int autostart;                  /* SNAP_AUTOSTART: start snapsmp when none answers (not 0) */
};
PL_HIDDEN extern struct pl_cfg pl_cfg;
PL_HIDDEN void pl_config_load(void);
/* SIGTERM -> flush the captured files now (signals.c). */
PL_HIDDEN void pl_signals_init(void);
/* Lexical normalization of an absolute path ("." and ".." folded, no "//"). 0 or -1. */
PL_HIDDEN int pl_normalize(const char *in, char *out, size_t cap);
/*
 * Resolve (dirfd, path) to a normalized absolute path in out[PATH_MAX] and
 * say whether it lies under a captured directory (or is one): 1 yes, 0 no.
 * A relative path against a descriptor the preload did not open is "no".
 */
PL_HIDDEN int pl_resolve(int dirfd, const char *path, char *out);
PL_HIDDEN void pl_cwd_update(void);
PL_HIDDEN extern _Atomic mode_t pl_umask;
/* Messages to stderr: once per process for each kind (warn_once), or always. */
enum { PL_WARN_ABSENT, PL_WARN_FULL, PL_WARN_FALLBACK, PL_WARN_EXPORT, PL_WARN_META, PL_WARN_KINDS };
PL_HIDDEN void pl_warn_once(int kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
PL_HIDDEN void pl_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * The preload's own long-lived descriptors (the socket, a file's private
 * read descriptor) move up to PL_HIDE_FD or above, out of the low numbers
 * that programs claim by number (a shell's `exec 3>`, dup2 onto 3..9), which
 * would otherwise close them under the preload. Returns the new fd (the old
 * one closed), or fd itself when it cannot move.
 */
#define PL_HIDE_FD 700
PL_HIDDEN int pl_hide_fd(int fd);
/* Set while autostart spawns snapsmp (smpconn.c): the spawn hooks export nothing. */
PL_HIDDEN extern _Thread_local int pl_spawning_daemon;

/* ---- the snapsmp connection (smpconn.c) ---- */
/*
 * One request and its reply. 0: *payload (malloc'd, may be NULL) holds the
 * reply of `len` bytes; < 0: the daemon's SNAP_E* status (msg[] says why) or
 * SNAP_ESMP when no snapsmp answers (retried at most once a second).
 */
PL_HIDDEN int pl_rpc(uint16_t type, const struct snap_wbuf *req, void **payload, uint32_t *len, char *err,
		     size_t errlen);
/* The same; force: connect now even within a second of a failed try; *sent: the request left. */
PL_HIDDEN int pl_rpc_ex(uint16_t type, const struct snap_wbuf *req, void **payload, uint32_t *len, char *err,
			size_t errlen, int force, int *sent);
PL_HIDDEN int pl_connected(void);
PL_HIDDEN void pl_conn_atfork_prepare(void);
PL_HIDDEN void pl_conn_atfork_parent(void);
PL_HIDDEN void pl_conn_atfork_child(void);

/* ---- descriptors and captured files (capfiles.c, capopen.c, nsread.c, nsops.c) ---- */
/* PL_READ: a committed store file opened for reading (its path, for fchmod and the like). */
enum { PL_WRITE = 1, PL_DIR = 2, PL_READ = 3 };

struct pl_file {
	int kind;
	int refs;                    /* descriptors of this process naming it (pl_tab_mu) */
	char *path;                  /* logical absolute path (follows renames) */
	/* PL_WRITE: a file being written into the store */
	uint64_t id;
	_Atomic uint64_t granted;    /* bytes of budget snapsmp reserved for it */
	char *data;                  /* where its bytes are: the store's data file, or (realtmp) a
	                                hidden temporary beside its real path, renamed at close */
	int realtmp;
	int rfd;                     /* private read-only descriptor of its data */
	int accmode, append;
	uint32_t mode;
	pid_t owner;                 /* only the opening process commits (not fork children) */
	int unlinked;                /* unlinked while open: discarded at close */
	atomic_int fallen;           /* moved to the real file system (store full, no snapsmp) */
	atomic_int exported;         /* now a plain real file at its path: nothing to do at close */
	atomic_int mset;             /* the program set its mode (fchmod): sent with the commit */
	atomic_int tset;             /* the program set its mtime (futimens) after its last write */
	_Atomic uint64_t mtime_ns;   /* that mtime */
	pthread_mutex_t mu;          /* growth and fallback of this file */
	struct pl_file *wnext;       /* files being written (pl_tab_mu) */
	/* PL_DIR: listing state for getdents64 */
	char **names;
	size_t nnames, emitted;
	uint8_t *seen;
	int listed;
};

PL_HIDDEN extern _Atomic(struct pl_file *) pl_tab[PL_MAXFD];
static inline struct pl_file *pl_get(int fd)
{
	return (unsigned)fd < PL_MAXFD ? atomic_load_explicit(&pl_tab[fd], memory_order_acquire) : NULL;
}

/* open(2) of a captured path: *handled = 0 means "not ours, call the real one". */
PL_HIDDEN int pl_open(int dirfd, const char *path, int flags, mode_t mode, int *handled);
/* A descriptor the preload tracks was closed (after the real close): commit when it was the last. */
PL_HIDDEN int pl_release(struct pl_file *p, int failed);
/* newfd now names what oldfd names (dup family), after the real call. */
PL_HIDDEN int pl_dup_track(int oldfd, int newfd);
/* Before a write of n bytes at off (-1: the current position) to a tracked descriptor. */
PL_HIDDEN void pl_prewrite(struct pl_file *p, int fd, int64_t off, uint64_t n);
/* After a write failed with ENOSPC: move the file to the real file system; 1 if the caller should retry. */
PL_HIDDEN int pl_write_failed(struct pl_file *p, int fd);
PL_HIDDEN int pl_stat(int dirfd, const char *path, struct stat *st, int flags, int *handled);
PL_HIDDEN int pl_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx, int *handled);
PL_HIDDEN int pl_access(int dirfd, const char *path, int mode, int *handled);
PL_HIDDEN int pl_rename(int od, const char *old, int nd, const char *new, unsigned flags, int *handled);
PL_HIDDEN int pl_unlink(int dirfd, const char *path, int flags, int *handled);
PL_HIDDEN int pl_truncate(const char *path, off_t len, int *handled);
PL_HIDDEN void pl_track_dir(int fd, const char *abs);
/* Directory listings merged with the store (DIR* side table and getdents64). */
PL_HIDDEN void pl_dir_opened(DIR *d, const char *abs);
PL_HIDDEN struct dirent64 *pl_readdir(DIR *d);
PL_HIDDEN void pl_dir_closed(DIR *d);
PL_HIDDEN void pl_dir_rewound(DIR *d);
PL_HIDDEN extern atomic_int pl_ndirs;
PL_HIDDEN ssize_t pl_getdents(struct pl_file *p, int fd, void *buf, size_t n);
/*
 * Every captured file this process is writing becomes a plain file at its
 * real path now (spawn.c: before a fork, an exec, a spawn or passing the
 * descriptor away, whose receivers cannot know it is a store file).
 */
PL_HIDDEN void pl_export_all(const char *why);
/* Export one descriptor's file (sendmsg of SCM_RIGHTS). */
PL_HIDDEN void pl_export_fd(int fd, const char *why);
/* A file being written drops its store copy and writes the real file at its path from here on, as a
 * plain run's descriptor would (another process holds a lock on that file). */
PL_HIDDEN void pl_attach_real(int fd, const char *why);
/* The process ends (exit, _exit): commit what it still has open, as the kernel's close would. */
PL_HIDDEN void pl_files_at_exit(void);
/* This process has store files open for writing. */
PL_HIDDEN int pl_files_open(void);
/* Metadata on captured paths and descriptors (filemeta.c). */
PL_HIDDEN int pl_meta_mode(int dirfd, const char *path, int fd, mode_t mode, int flags, int *handled);
PL_HIDDEN int pl_meta_times(int dirfd, const char *path, int fd, const struct timespec ts[2], int flags, int *handled);
PL_HIDDEN int pl_meta_owner(int dirfd, const char *path, int fd, uid_t uid, gid_t gid, int flags, int *handled);
/* A committed store file at abs goes to the real file system (bytes, mode, mtime): 0, or -1 (errno). */
PL_HIDDEN int pl_materialize(const char *abs, const char *why);
PL_HIDDEN void pl_files_atfork_prepare(void);
PL_HIDDEN void pl_files_atfork_parent(void);
PL_HIDDEN void pl_files_atfork_child(void);

#endif
