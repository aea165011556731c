/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * capfiles_int.h - what the preload's captured-file files share (not installed):
 *
 *   capfiles.c  the descriptor table, growth, the fall back, commit, export, fork
 *   capopen.c   open: a file being written, a committed one, a new one, the fall back
 *   filecrc.c   the chunk checksums a commit sends, read from the file
 *   nsread.c    the store's namespace read directly, and changed by this
 *               process itself when no snapsmp runs
 *   nsops.c     stat, access, rename, unlink, truncate and listings, merged
 *               with the real directories
 *   filemeta.c  mode, owner, times, links and the calls that must see a
 *               real file (freopen, spawn file actions)
 *   spawn.c     fork, exec, spawn, passing descriptors, the process's end
 *
 * All of it is hidden (the library's default visibility and preload.map).
 */
#ifndef SNAP_PRELOAD_FILES_INT_H
#define SNAP_PRELOAD_FILES_INT_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "snap/base.h"
#include "preload.h"
#include "snap/wire.h"

/* capfiles.c */
PL_HIDDEN extern pthread_mutex_t plf_tab_mu;   /* the descriptor table and the files being written */
PL_HIDDEN void plf_data_path(uint64_t id, char *out, size_t cap);
PL_HIDDEN int plf_ns_path(const char *abs, char *out, size_t cap);
PL_HIDDEN struct pl_file *plf_find_writing(const char *abs);
/* fd names p from now on (one reference; a file being written is listed). */
PL_HIDDEN void plf_track_new(int fd, struct pl_file *p);
PL_HIDDEN void plf_free_file(struct pl_file *p);
/* Ask snapsmp for bytes of budget for p; 0, or its error (err says it). */
PL_HIDDEN int plf_request_grow(struct pl_file *p, uint64_t bytes, char *err, size_t errlen);
/* Tell snapsmp that file id will never be committed (its data goes). */
PL_HIDDEN void plf_send_abort(uint64_t id);
PL_HIDDEN int plf_split_dir(const char *abs, char *dir, size_t cap);
PL_HIDDEN int plf_copy_range(int from, int to, uint64_t len);
PL_HIDDEN void plf_data_mode(int fd, uint32_t mode);
/* abs is a real symbolic link: abs becomes what it names (normalized), 1; else 0. */
PL_HIDDEN int plf_follow(char *abs);
/* A hidden name beside abs for bytes headed for the file system. */
PL_HIDDEN int plf_fallback_name(const char *abs, char *out, size_t cap);
/* Rename a finished temporary over path, the store's older copy dropped first. */
PL_HIDDEN int plf_install_real(const char *tmp, const char *path);
/* nsops.c: the stat of abs as the store sees it (a file being written, a committed one): 1, 0 not there, -1. */
PL_HIDDEN int plf_store_stat(const char *abs, struct stat *st);

/* filecrc.c: crc[0..n) of the file's chunk-byte chunks; 0, or -1 if a read failed. */
PL_HIDDEN int plf_file_crcs(int fd, uint64_t size, uint32_t chunk, uint32_t n, uint32_t *crc);

/* nsread.c */
PL_HIDDEN extern pthread_mutex_t plf_ver_mu;   /* the verified-files cache */
PL_HIDDEN int plf_store_lookup(const char *abs, struct snap_fman *m);
PL_HIDDEN int plf_open_committed(const char *abs, int flags);
PL_HIDDEN void plf_store_unlock(int fd);
PL_HIDDEN int plf_mutate(uint16_t type, const struct snap_wbuf *req, uint32_t *e, int *lockfd, int *uncertain);
PL_HIDDEN void plf_ns_parents(const char *p);
PL_HIDDEN void plf_store_forget(const char *abs);

/* nsops.c */
PL_HIDDEN extern pthread_mutex_t plf_dir_mu;   /* the open listings */

#endif
