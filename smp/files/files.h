/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * files.h - captured files in the node store, the daemon's side (the
 * preload's side is integration/preload). docs/design/captured-files.md
 * explains the model; in short:
 *
 *   <root>/<job>/files/data/<id>     the bytes of one file (tmpfs), written
 *                                    by the preloaded process itself
 *   <root>/<job>/files/ns/<path>     its manifest (fileman.h), at the file's
 *                                    own absolute path: present = committed
 *   <root>/<job>/files/tmp/<id>.man  a manifest being published
 *
 * A file is committed by renaming its manifest into the namespace tree, so
 * a rename of a captured file is one rename(2) of its manifest: atomic,
 * replacing the target, exactly what os.replace(tmp, final) relies on. A
 * data file no manifest names is garbage (a torn write) and is removed at
 * start. A flush thread copies committed files to their real paths
 * (temporary name, fsync, rename), checking every chunk's CRC on the way.
 *
 * Threads: the poll thread calls everything here; the flush thread shares
 * the state under one mutex, taken for each request and around each flush's
 * start and end (never during its copy).
 */
#ifndef SNAP_SMP_FILES_H
#define SNAP_SMP_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "snap/buf.h"
#include "snap/smp_config.h"
#include "snap/store.h"

struct snap_files;
struct smp;
struct conn;

/*
 * Scan every job's files/ under the store (discard torn manifests, remove
 * data no manifest names, charge the rest to the memory budget) and start
 * the flush thread. Files found are re-checked against their real paths
 * and flushed where they differ.
 */
int snap_files_open(struct snap_files **fp, struct snap_store *store, const struct snap_smp_config *cfg,
		    char *err, size_t errlen);
/* Stop the flush thread (a flush under way ends first) and free everything. */
void snap_files_close(struct snap_files *f);
/* Readable when a flush ended: then call snap_files_collect. */
int snap_files_fd(const struct snap_files *f);
void snap_files_collect(struct smp *m);
/* Handle a captured-file message (types SNAP_MSG_FATTACH..SNAP_MSG_FFLUSH). */
int snap_files_dispatch(struct smp *m, struct conn *c, uint16_t type, struct snap_rbuf *r, struct snap_wbuf *out,
			char *err, size_t errlen, int *deferred);
/* A connection closed: files it was writing are discarded (torn). */
void snap_files_conn_closed(struct snap_files *f, struct conn *c);
/* SIGUSR1, SIGTERM: flush every committed file now (failed ones are retried). */
void snap_files_flush_all(struct snap_files *f, const char *why);
/* Files still to flush in the current urgent round (SIGTERM waits for 0). */
int snap_files_busy(struct snap_files *f);

struct smp_heal;
/*
 * The background scrub's share (smp/heal/filescrub.c): check committed captured
 * files, chunk by chunk, against their manifests' CRC32C, reading about
 * budget bytes (through buf) or until deadline_ns (snap_now_ns). A bad
 * chunk is rewritten from the flushed copy at the file's real path when
 * that copy's chunk has the recorded CRC32C; otherwise the file is marked
 * damaged (h, and the store's damage record). Returns the bytes read;
 * *wrapped when the cursor passed the last file (the next call starts a
 * new pass); *seen counts the files checked whole. The data files are read
 * through the mappings mm keeps (see below). f may be NULL.
 */
struct snap_slotmaps;
uint64_t snap_files_scrub(struct snap_files *f, struct smp_heal *h, struct snap_slotmaps *mm, uint8_t *buf,
			  size_t bufsize, int64_t budget, uint64_t deadline_ns, int *wrapped, unsigned *seen);
/* The data files' mappings snap_files_scrub keeps (mm may be NULL: none
 * kept): at most FILES_SCRUB_MAPS files and FILES_SCRUB_MAP_BYTES bytes,
 * plus the one the cursor is in (store/slotmap.c, the cap). */
#define FILES_SCRUB_MAPS 256
#define FILES_SCRUB_MAP_BYTES (1ull << 30)
void snap_files_scrub_maps_init(struct snap_slotmaps *mm);

#endif
