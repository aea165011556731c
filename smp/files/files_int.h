/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * files_int.h - what the captured-files daemon side (files*.c) shares:
 * the in-memory namespace of each job and the calls between its files.
 *
 *   filereq.c   the requests (create, grow, commit, rename, unlink, flush)
 *   fileopen.c  open / close, the daemon's hooks (collect, closed connections)
 *   filescan.c  jobs: the start-up scan of a job's manifests
 *   fileflush.c the flush thread: committed files to their real paths
 *   fileent.c   entries: hash, commit order, paths, budget, files being written
 *   filescrub.c the background scrub's share: committed files against their CRC32Cs
 *
 * Each file calls only the ones below it (smp_internal.h's layers).
 */
#ifndef SNAP_FILES_INT_H
#define SNAP_FILES_INT_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snap/fileman.h"
#include "files/files.h"
#include "snap/base.h"
#include "smp_internal.h"
#include "snap/wire.h"

#define FILES_HBUCKETS 4096
#define FILES_PATH_MAX 4096
#define FILES_SCAN_DEPTH 128

enum { F_DIRTY = 0, F_FLUSHING = 1, F_CLEAN = 2 };

struct fjob;

struct fent {
	char *path;                 /* absolute logical path */
	uint64_t id, size, charge, mtime_ns;
	struct snap_fman man;       /* crc[] kept for the flush */
	int state;
	int check_real;             /* found at start: the real file may hold these bytes already */
	int failed;                 /* flushing failed 3 times: retried only when asked */
	int tries;                  /* failed flushes since the last success or request */
	int dead;                   /* removed while being flushed: the flush thread frees it */
	int damaged;                /* the scrub found a chunk no level holds intact (filescrub.c) */
	struct fjob *job;
	struct fent *hnext;
	struct fent *prev, *next;   /* commit order (oldest first) */
};

struct fwip {                   /* a file being written by a connection */
	uint64_t id, granted;
	char *path;
	uint32_t mode;
	void *owner;
	struct fwip *next;
};

struct fjob {
	char name[SNAP_JOB_MAX + 1];
	char dir[SNAP_FILE_MAX];    /* <root>/<job>/files */
	int nsfd, datafd, tmpfd;    /* directory descriptors */
	int lockfd;                 /* files/lock, held (flock) while this daemon runs: a preloaded
	                               process changes the namespace itself only when nobody holds it */
	struct fent *hash[FILES_HBUCKETS];
	struct fent *head, *tail;
	struct fwip *wip;
	int urgent;                 /* flush everything now (FFLUSH, SIGUSR1, SIGTERM) */
	struct fjob *next;
};

struct snap_files {
	struct snap_store *store;
	const struct snap_smp_config *cfg;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	int started, stop;
	int pipe[2];
	struct fjob *jobs;
	uint64_t last_id;
	/* The scrub's cursor (filescrub.c, poll thread): the file and chunk it
	 * checks next; files_remove_entry moves it past a file it removes. */
	struct fjob *scrub_j;
	struct fent *scrub_e;
	uint32_t scrub_chunk;
	int scrub_in;               /* scrub_j is a job (0: the next pass starts at the first) */
	struct conn_wait {
		struct conn *c;
		struct fjob *j;
		struct conn_wait *next;
	} *waiters;
};

/* fileent.c */
struct fent *files_lookup(struct fjob *j, const char *path);
void files_hash_insert(struct fjob *j, struct fent *e);
void files_hash_remove(struct fjob *j, struct fent *e);
void files_order_append(struct fjob *j, struct fent *e);
void files_free_entry(struct fent *e);
int files_path_ok(const struct snap_files *f, const char *p);
void files_split_path(const char *p, char *dir, size_t dcap, const char **base);
int files_flush_tmp_name(const char *path, uint64_t id, char *out, size_t cap);
int files_mkparents(int dirfd, const char *rel);
void files_notify(struct snap_files *f);
uint64_t files_wall_ns(void);
void files_ns_changed(struct snap_files *f, struct fjob *j);
void files_remove_entry(struct snap_files *f, struct fjob *j, struct fent *e, int unlink_manifest);
void files_uncharge(struct snap_files *f, uint64_t bytes);
void files_drop_wip(struct snap_files *f, struct fjob *j, struct fwip *w, int unlink_data);
struct fwip *files_find_wip(struct fjob *j, uint64_t id, void *owner);

/* filescan.c */
void files_free_job(struct fjob *j);
struct fjob *files_load_job(struct snap_files *f, const char *name, int create);
struct fjob *files_find_job(struct snap_files *f, const char *name, int create);

/* fileflush.c */
int files_write_all(int fd, const uint8_t *p, size_t len);
void *files_flusher(void *arg);

/* fileopen.c */
int files_pending(struct snap_files *f, struct fjob *only);
void files_urge(struct fjob *j);

#endif
