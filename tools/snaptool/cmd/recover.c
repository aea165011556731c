/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool recover: what of a job is recoverable and from where, from the
 * node store (read-only) and the flush directory; no daemon needed. With
 * --nodes, main() runs the mesh view (mesh_status.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/base.h"
#include "opts.h"
#include "progress.h"
#include "snap/io.h"
#include "snaptool.h"
#include "snap/wire.h"

/* Newest restorable step of the job in the node store whose every chunk checks out. */
static int store_candidate(const struct opts *o, uint64_t *step, char *err, size_t errlen)
{
	struct snap_store *s;
	char serr[512];
	int rc = snap_store_open(&s, o->cfg.client.store, 64, o->cfg.mem_limit, 1, st_log, serr, sizeof(serr));
	if (rc) {
		snprintf(err, errlen, "node store %s unreadable: %s", o->cfg.client.store, serr);
		return rc == SNAP_EPERM ? SNAP_EPERM : -1;
	}
	struct store_job *j = snap_store_job(s, o->cfg.client.job, 0);
	rc = j ? snap_store_latest(s, j, step) : SNAP_ENOENT;
	if (rc)
		snprintf(err, errlen, "no step committed by every rank in node store %s", o->cfg.client.store);
	snap_store_close(s);
	return rc ? -1 : 0;
}

static const char recover_usage[] =
	"usage: snaptool recover [--nodes N] [--store DIR] [--flush-dir DIR] [--job NAME]\n"
	"                       [--allow-older] [--json] [-q|-v]\n"
	"Report exactly what of a job is recoverable after failures and from where: the\n"
	"newest step every rank committed in the node store, else the newest persisted step\n"
	"that verifies. Exit 0 if something is recoverable, 3 if nothing is, 1 if the\n"
	"store or flush directory cannot be read (that is not a loss). With --nodes N and a\n"
	"--store holding %n (snapsmp --ec): the mesh, level by level (node stores, parity,\n"
	"the shared flush directory). On a terminal, a progress bar (bytes read, rate)\n"
	"while a persisted step is verified.\n";

/* A newer persisted step that is damaged (its seal or its MANIFEST): said
 * as a warning; 1 when the older steps may not stand in (no --allow-older). */
static int recover_newest_damaged(const struct opts *o, const uint64_t *steps, int n, char *err, size_t errlen)
{
	uint64_t lost = 0, sealed = 0;
	uint32_t sw = 0;
	struct snap_io_err e = { 0 };
	if (snap_io_sealed_step(o->cfg.flush_dir, o->cfg.client.job, &sealed) && (n == 0 || sealed > steps[0]) &&
	    snap_io_step_world(o->cfg.flush_dir, o->cfg.client.job, sealed, &sw, &e) != 0) {
		snprintf(err, errlen, "persisted step %" PRIu64 " is damaged: %s%s", sealed, e.msg,
			 o->allow_older ? "" : "; --allow-older to use an older step");
	} else if (snap_io_lost_step(o->cfg.flush_dir, o->cfg.client.job, n > 0 ? steps[0] : 0, &lost)) {
		snprintf(err, errlen, "persisted step %" PRIu64 " has lost its MANIFEST (its rank "
			 "files are still there)%s", lost, o->allow_older ? "" : "; --allow-older to use an older step");
	} else {
		return 0;
	}
	fprintf(stderr, "snaptool recover: warning: %s\n", err);
	return !o->allow_older;
}

/* Whether the persisted step verifies (with a progress bar over its files). */
static int recover_verify_step(const struct opts *o, uint64_t step, struct snap_io_err *e)
{
	size_t bad = 0;
	struct st_progress bar;
	char what[48];
	snprintf(what, sizeof(what), "verify step %" PRIu64, step);
	st_progress_begin(&bar, what, st_step_disk_bytes(o->cfg.flush_dir, o->cfg.client.job, step));
	st_progress_watch_reads(&bar);
	int vrc = snap_io_verify_step(o->cfg.flush_dir, o->cfg.client.job, step, &bad, e);
	st_progress_unwatch(&bar);
	if (vrc == 0)
		st_progress_set(&bar, bar.total);
	st_progress_end(&bar);
	st_verbose(o, "persisted step %" PRIu64 ": %s%s", step, vrc ? "damaged: " : "verifies", vrc ? e->msg : "");
	return vrc == 0;
}

/* The newest persisted step that verifies: 1 with *step, 0 with why,
 * or ST_FAIL after a message when the flush directory may not be read. */
static int recover_disk(const struct opts *o, uint64_t *step, char *err, size_t errlen)
{
	if (!o->cfg.flush_dir[0]) {
		snprintf(err, errlen, "no flush directory given (--flush-dir / SNAP_FLUSH_DIR)");
		return 0;
	}
	uint64_t steps[64];
	struct snap_io_err e = { 0 };
	int n = snap_io_list_steps(o->cfg.flush_dir, o->cfg.client.job, steps, 64, &e);
	if (n < 0 && e.code == SNAP_EPERM) {
		st_error("snaptool recover: flush directory %s: %s", o->cfg.flush_dir, e.msg);
		return -ST_FAIL;
	}
	if (n <= 0)
		snprintf(err, errlen, "nothing persisted in %s%s%s", o->cfg.flush_dir, n < 0 ? ": " : "", n < 0 ? e.msg : "");
	if (n >= 0 && recover_newest_damaged(o, steps, n, err, errlen))
		n = 0;
	for (int i = 0; i < n && i < 64; i++) {
		if (recover_verify_step(o, steps[i], &e)) {
			*step = steps[i];
			return 1;
		}
		if (!err[0])
			snprintf(err, errlen, "persisted step %" PRIu64 " is damaged: %s", steps[i], e.msg);
		if (!o->allow_older)
			break;
	}
	return 0;
}

static void recover_print(const struct opts *o, int have_mem, uint64_t mem, const char *mem_why, int have_disk,
			  uint64_t disk, const char *disk_why)
{
	const char *from = have_mem ? "node store" : have_disk ? "flush directory" : "nothing";
	if (o->json) {
		printf("{\"job\":");
		st_json_str(o->cfg.client.job);
		printf(",\"store_step\":");
		have_mem ? printf("%" PRIu64, mem) : printf("null");
		printf(",\"persisted_step\":");
		have_disk ? printf("%" PRIu64, disk) : printf("null");
		printf(",\"restore_from\":\"%s\"}\n", from);
		st_json_done();
		return;
	}
	printf("job %s\n", o->cfg.client.job);
	if (have_mem)
		printf("  node store:      step %" PRIu64 " committed by every rank (%s)\n", mem, o->cfg.client.store);
	else
		printf("  node store:      %s\n", mem_why);
	if (have_disk)
		printf("  flush directory: step %" PRIu64 " persisted and verified (%s)\n", disk, o->cfg.flush_dir);
	else
		printf("  flush directory: %s\n", disk_why);
	if (have_mem || have_disk)
		printf("  a restart restores step %" PRIu64 " from the %s\n", have_mem ? mem : disk, from);
	else
		printf("  NOTHING IS RECOVERABLE for job %s\n", o->cfg.client.job);
}

int cmd_recover(int argc, char **argv)
{
	struct opts o;
	int rc = st_parse(argc, argv, &o, recover_usage, 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	uint64_t mem = 0, disk = 0;
	char mem_why[1200] = "", disk_why[1200] = "";
	int mrc = store_candidate(&o, &mem, mem_why, sizeof(mem_why)), have_mem = mrc == 0;
	if (have_mem)
		st_verbose(&o, "node store %s: step %" PRIu64 " committed by every rank", o.cfg.client.store, mem);
	else
		st_verbose(&o, "%s", mem_why);
	if (mrc == SNAP_EPERM) {
		/* Data we may not read is not lost data: never report a loss for it. */
		st_error("snaptool recover: %s", mem_why);
		return ST_FAIL;
	}
	int have_disk = recover_disk(&o, &disk, disk_why, sizeof(disk_why));
	if (have_disk < 0)
		return -have_disk;
	recover_print(&o, have_mem, mem, mem_why, have_disk, disk, disk_why);
	return have_mem || have_disk ? ST_OK : ST_LOST;
}
