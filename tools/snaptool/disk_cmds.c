/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * flush, export, gc, recover: snaptool's view of persistence. flush asks the
 * running snapsmp (it owns the store); the others work on the flush
 * directory and the node store directly, so they also work when no daemon
 * is running.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/base.h"
#include "opts.h"
#include "snap/io.h"
#include "snaptool.h"
#include "snap/wire.h"

static int need_flush_dir(const struct opts *o, const char *cmd)
{
	if (o->cfg.flush_dir[0])
		return 0;
	fprintf(stderr, "snaptool %s: no flush directory: pass --flush-dir DIR or set SNAP_FLUSH_DIR\n", cmd);
	return ST_USAGE;
}

int cmd_flush(int argc, char **argv)
{
	struct opts o;
	uint64_t step = SNAP_STEP_LATEST;
	int rc = st_parse(argc, argv, &o, "usage: snaptool flush [STEP] [--store DIR] [--job NAME]\n"
					  "Ask the node's snapsmp to persist STEP (default: the newest restorable step) to its\n"
					  "flush directory now, and wait until it is persisted. Needs a running snapsmp\n"
					  "started with --flush-dir.\n", -1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (o.arg1 && (rc = st_parse_step(o.arg1, &step)))
		return rc;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(o.cfg.client.socket) >= sizeof(a.sun_path)) {
		fprintf(stderr, "snaptool flush: socket path too long\n");
		return ST_USAGE;
	}
	memcpy(a.sun_path, o.cfg.client.socket, strlen(o.cfg.client.socket) + 1);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		fprintf(stderr, "snaptool flush: cannot reach snapsmp at %s (is it running?)\n", o.cfg.client.socket);
		if (s >= 0)
			close(s);
		return ST_FAIL;
	}
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, o.cfg.client.job);
	snap_put_u64(&w, step);
	snap_put_u8(&w, 1);
	rc = snap_wire_send(s, SNAP_MSG_FLUSH, 0, w.p, (uint32_t)w.len, -1);
	snap_wbuf_free(&w);
	struct snap_msg_hdr h;
	void *rep = NULL;
	int tty = isatty(STDERR_FILENO);
	uint64_t t0 = snap_now_ns();
	/* Wait in one-second slices so a terminal sees that work goes on. */
	while (rc == 0 && (rc = snap_wire_recv(s, &h, &rep, NULL, 1000)) == SNAP_ETIMEDOUT) {
		if (tty)
			fprintf(stderr, "\rflushing job %s ... %.0f s", o.cfg.client.job, (snap_now_ns() - t0) / 1e9);
		rc = 0;
	}
	if (tty)
		fprintf(stderr, "\r\033[K");
	close(s);
	if (rc) {
		fprintf(stderr, "snaptool flush: lost snapsmp: %s\n", snap_strerror(rc));
		free(rep);
		return ST_FAIL;
	}
	if (h.status < 0) {
		fprintf(stderr, "snaptool flush: %.*s\n", (int)h.len, rep ? (char *)rep : "");
		free(rep);
		return ST_FAIL;
	}
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, h.len);
	uint64_t got = snap_get_u64(&r), bytes = snap_get_u64(&r), ns = snap_get_u64(&r);
	if (r.bad)
		printf("job %s: step already persisted\n", o.cfg.client.job);
	else
		printf("job %s: step %" PRIu64 " persisted (%.1f MiB in %.2f s)\n", o.cfg.client.job, got, bytes / 1048576.0,
		       ns / 1e9);
	free(rep);
	return ST_OK;
}

int cmd_export(int argc, char **argv)
{
	struct opts o;
	uint64_t step;
	int rc = st_parse(argc, argv, &o, "usage: snaptool export STEP -o FILE.h5 [--copy] [--flush-dir DIR] [--job NAME]\n"
					  "Write one HDF5 file where each logical tensor is one dataset of its global shape,\n"
					  "assembled from the ranks' shards: HDF5 virtual datasets pointing at the persisted\n"
					  "rank files (no copy; keep FILE next to the flush directory), or with --copy a\n"
					  "self-contained file. A job can then resume on another number of ranks.\n", 1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = need_flush_dir(&o, "export")) || (rc = st_parse_step(o.arg1, &step)))
		return rc;
	if (!o.output) {
		fprintf(stderr, "snaptool export: -o FILE is required\n");
		return ST_USAGE;
	}
	struct snap_io_err e = { 0 };
	rc = snap_io_export(o.cfg.flush_dir, o.cfg.client.job, step, o.output,
			    o.copy ? SNAP_IO_EXPORT_COPY : SNAP_IO_EXPORT_VIRTUAL, &e);
	if (rc) {
		fprintf(stderr, "snaptool export: %s\n", e.msg);
		return rc == SNAP_ECORRUPT || rc == SNAP_ETRUNC ? ST_LOST : ST_FAIL;
	}
	printf("exported step %" PRIu64 " of job %s to %s (%s)\n", step, o.cfg.client.job, o.output,
	       o.copy ? "copied" : "virtual datasets");
	return ST_OK;
}

int cmd_gc(int argc, char **argv)
{
	struct opts o;
	int rc = st_parse(argc, argv, &o, "usage: snaptool gc [--keep N] [--flush-dir DIR] [--job NAME]\n"
					  "Apply retention to the flush directory: keep the newest N persisted steps (default\n"
					  "SNAP_FLUSH_KEEP, 2), delete older ones and leftovers of interrupted flushes. Never\n"
					  "deletes the newest persisted step.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = need_flush_dir(&o, "gc")))
		return rc;
	struct snap_io_err e = { 0 };
	int n = snap_io_retain(o.cfg.flush_dir, o.cfg.client.job, o.keep, &e);
	if (n < 0) {
		fprintf(stderr, "snaptool gc: %s\n", e.msg);
		return ST_FAIL;
	}
	printf("job %s: removed %d step directories, kept the newest %u persisted\n", o.cfg.client.job, n, o.keep);
	return ST_OK;
}

/* Newest restorable step of the job in the node store whose every chunk checks out. */
static int store_candidate(const struct opts *o, uint64_t *step, char *why, size_t len)
{
	struct snap_store *s;
	char err[512];
	int rc = snap_store_open(&s, o->cfg.client.store, 64, o->cfg.mem_limit, 1, st_log, err, sizeof(err));
	if (rc) {
		snprintf(why, len, "node store %s unreadable: %s", o->cfg.client.store, err);
		return rc == SNAP_EPERM ? SNAP_EPERM : -1;
	}
	struct store_job *j = snap_store_job(s, o->cfg.client.job, 0);
	rc = j ? snap_store_latest(s, j, step) : SNAP_ENOENT;
	if (rc)
		snprintf(why, len, "no step committed by every rank in node store %s", o->cfg.client.store);
	snap_store_close(s);
	return rc ? -1 : 0;
}

int cmd_recover(int argc, char **argv)
{
	/* --nodes: the erasure-coded mesh, level by level (mesh_status.c). */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--nodes", 7))
			return cmd_mesh_status(argc, argv, 1);
	struct opts o;
	int rc = st_parse(argc, argv, &o, "usage: snaptool recover [--store DIR] [--flush-dir DIR] [--job NAME]\n"
					  "                       [--allow-older] [--json]\n"
					  "Report exactly what of a job is recoverable after failures and from where: the\n"
					  "newest step every rank committed in the node store, else the newest persisted step\n"
					  "that verifies. Exit 0 if something is recoverable, 3 if nothing is, 1 if the\n"
					  "store or flush directory cannot be read (that is not a loss). With --nodes N and a\n"
					  "--store holding %n (snapsmp --ec): the mesh, level by level (node stores, parity,\n"
					  "the shared flush directory).\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	uint64_t mem = 0, disk = 0;
	char mem_why[1200] = "", disk_why[1200] = "";
	int mrc = store_candidate(&o, &mem, mem_why, sizeof(mem_why)), have_mem = mrc == 0, have_disk = 0;
	if (mrc == SNAP_EPERM) {
		/* Data we may not read is not lost data: never report a loss for it. */
		fprintf(stderr, "snaptool recover: %s\n", mem_why);
		return ST_FAIL;
	}
	if (o.cfg.flush_dir[0]) {
		uint64_t steps[64];
		struct snap_io_err e = { 0 };
		int n = snap_io_list_steps(o.cfg.flush_dir, o.cfg.client.job, steps, 64, &e);
		if (n < 0 && e.code == SNAP_EPERM) {
			fprintf(stderr, "snaptool recover: flush directory %s: %s\n", o.cfg.flush_dir, e.msg);
			return ST_FAIL;
		}
		if (n <= 0)
			snprintf(disk_why, sizeof(disk_why), "nothing persisted in %s%s%s", o.cfg.flush_dir, n < 0 ? ": " : "",
				 n < 0 ? e.msg : "");
		uint64_t lost = 0;
		if (n >= 0 && snap_io_lost_step(o.cfg.flush_dir, o.cfg.client.job, n > 0 ? steps[0] : 0, &lost)) {
			snprintf(disk_why, sizeof(disk_why), "persisted step %" PRIu64 " has lost its MANIFEST (its rank "
				 "files are still there)%s", lost, o.allow_older ? "" : "; --allow-older to use an older step");
			fprintf(stderr, "snaptool recover: warning: %s\n", disk_why);
			if (!o.allow_older)
				n = 0;
		}
		for (int i = 0; i < n && i < 64 && !have_disk; i++) {
			size_t bad = 0;
			if (snap_io_verify_step(o.cfg.flush_dir, o.cfg.client.job, steps[i], &bad, &e) == 0) {
				have_disk = 1;
				disk = steps[i];
			} else {
				if (!disk_why[0])
					snprintf(disk_why, sizeof(disk_why), "persisted step %" PRIu64 " is damaged: %s", steps[i],
						 e.msg);
				if (!o.allow_older)
					break;
			}
		}
	} else {
		snprintf(disk_why, sizeof(disk_why), "no flush directory given (--flush-dir / SNAP_FLUSH_DIR)");
	}
	const char *from = have_mem ? "node store" : have_disk ? "flush directory" : "nothing";
	if (o.json) {
		printf("{\"job\":");
		st_json_str(o.cfg.client.job);
		printf(",\"store_step\":");
		have_mem ? printf("%" PRIu64, mem) : printf("null");
		printf(",\"persisted_step\":");
		have_disk ? printf("%" PRIu64, disk) : printf("null");
		printf(",\"restore_from\":\"%s\"}\n", from);
	} else {
		printf("job %s\n", o.cfg.client.job);
		if (have_mem)
			printf("  node store:      step %" PRIu64 " committed by every rank (%s)\n", mem, o.cfg.client.store);
		else
			printf("  node store:      %s\n", mem_why);
		if (have_disk)
			printf("  flush directory: step %" PRIu64 " persisted and verified (%s)\n", disk, o.cfg.flush_dir);
		else
			printf("  flush directory: %s\n", disk_why);
		if (have_mem || have_disk)
			printf("  a restart restores step %" PRIu64 " from the %s\n", have_mem ? mem : disk, from);
		else
			printf("  NOTHING IS RECOVERABLE for job %s\n", o.cfg.client.job);
	}
	return have_mem || have_disk ? ST_OK : ST_LOST;
}
