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

static int need_flush_dir(const struct opts *o, const char *cmd)
{
	if (o->cfg.flush_dir[0])
		return 0;
	st_error("snaptool %s: no flush directory: pass --flush-dir DIR or set SNAP_FLUSH_DIR", cmd);
	return ST_USAGE;
}

/* What flush's progress bar measures: the bytes of the step in the node
 * store (read-only view) against those in its directory under the flush
 * directory. 0 when either is unknown (no --flush-dir, store unreadable). */
static uint64_t flush_total(const struct opts *o, uint64_t *step)
{
	struct snap_store *s;
	char err[512];
	if (!o->cfg.flush_dir[0] || snap_store_open(&s, o->cfg.client.store, 64, o->cfg.mem_limit, 1, NULL, err, sizeof(err)))
		return 0;
	uint64_t total = 0;
	struct store_job *j = snap_store_job(s, o->cfg.client.job, 0);
	if (j && (*step != SNAP_STEP_LATEST || snap_store_latest(s, j, step) == 0))
		for (uint32_t r = 0; r < j->nranks; r++) {
			struct store_slot *sl = snap_store_find(s, j->ranks[r], *step, NULL);
			total += sl ? sl->man.layout.slot_bytes : 0;
		}
	snap_store_close(s);
	return total;
}

int cmd_flush(int argc, char **argv)
{
	struct opts o;
	uint64_t step = SNAP_STEP_LATEST;
	int rc = st_parse(argc, argv, &o, "usage: snaptool flush [STEP] [--store DIR] [--job NAME] [--flush-dir DIR] [--json] [-q|-v]\n"
					  "Ask the node's snapsmp to persist STEP (default: the newest restorable step) to its\n"
					  "flush directory now, and wait until it is persisted. Needs a running snapsmp\n"
					  "started with --flush-dir. On a terminal, a progress bar on stderr: with --flush-dir\n"
					  "(or SNAP_FLUSH_DIR, the daemon's) bytes written against the step's bytes, and\n"
					  "rate; without, the seconds waited. None when piped.\n", -1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (o.arg1 && (rc = st_parse_step(o.arg1, &step)))
		return rc;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(o.cfg.client.socket) >= sizeof(a.sun_path)) {
		if (s >= 0)
			close(s);
		st_error("snaptool flush: socket path too long");
		return ST_USAGE;
	}
	memcpy(a.sun_path, o.cfg.client.socket, strlen(o.cfg.client.socket) + 1);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		st_error("snaptool flush: cannot reach snapsmp at %s (is it running?)", o.cfg.client.socket);
		if (s >= 0)
			close(s);
		return ST_FAIL;
	}
	uint64_t bar_step = step, total = flush_total(&o, &bar_step);
	char dir[SNAP_PATH_MAX * 2] = "";
	if (total)
		snprintf(dir, sizeof(dir), "%s/%s/step-%" PRIu64, o.cfg.flush_dir, o.cfg.client.job, bar_step);
	st_verbose(&o, "asking snapsmp at %s to flush job %s step %s%s", o.cfg.client.socket, o.cfg.client.job,
		   o.arg1 ? o.arg1 : "(newest restorable)", total ? "" : "; no --flush-dir or step unknown: no byte count");
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, o.cfg.client.job);
	snap_put_u64(&w, step);
	snap_put_u8(&w, 1);
	rc = snap_wire_send(s, SNAP_MSG_FLUSH, 0, w.p, (uint32_t)w.len, -1);
	snap_wbuf_free(&w);
	struct snap_msg_hdr h;
	void *rep = NULL;
	int tty = !o.quiet && isatty(STDERR_FILENO);
	uint64_t t0 = snap_now_ns(), base = total ? st_dir_bytes(dir) : 0;
	struct st_progress bar = { 0 };
	if (total)
		st_progress_begin(&bar, "flush", total);
	/* Wait in slices so a terminal sees that work goes on. */
	while (rc == 0 && (rc = snap_wire_recv(s, &h, &rep, NULL, 250)) == SNAP_ETIMEDOUT) {
		if (total) {
			uint64_t now = st_dir_bytes(dir);
			st_progress_set(&bar, now > base ? now - base : 0);
		} else if (tty) {
			fprintf(stderr, "\rflushing job %s ... %.0f s", o.cfg.client.job, (snap_now_ns() - t0) / 1e9);
		}
		rc = 0;
	}
	/* A full bar only for bytes written now: an empty reply means the step
	 * was on disk already. */
	if (total && rc == 0 && h.status >= 0 && h.len >= 24) {
		st_progress_set(&bar, total);
		st_progress_end(&bar);
	} else if (total) {
		st_progress_hide(&bar);
	} else if (tty) {
		fprintf(stderr, "\r\033[K");
	}
	close(s);
	if (rc) {
		st_error("snaptool flush: lost snapsmp: %s", snap_strerror(rc));
		free(rep);
		return ST_FAIL;
	}
	if (h.status < 0) {
		st_error("snaptool flush: %.*s", (int)h.len, rep ? (char *)rep : "");
		free(rep);
		return ST_FAIL;
	}
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, h.len);
	uint64_t got = snap_get_u64(&r), bytes = snap_get_u64(&r), ns = snap_get_u64(&r);
	if (o.json) {
		printf("{\"job\":");
		st_json_str(o.cfg.client.job);
		if (r.bad)
			printf(",\"step\":null,\"already_persisted\":true,\"bytes\":null,\"elapsed_ns\":null}\n");
		else
			printf(",\"step\":%" PRIu64 ",\"already_persisted\":false,\"bytes\":%" PRIu64 ",\"elapsed_ns\":%" PRIu64
			       "}\n", got, bytes, ns);
		st_json_done();
	} else if (r.bad) {
		printf("job %s: step already persisted\n", o.cfg.client.job);
	} else {
		printf("job %s: step %" PRIu64 " persisted (%.1f MiB in %.2f s)\n", o.cfg.client.job, got, bytes / 1048576.0,
		       ns / 1e9);
	}
	free(rep);
	return ST_OK;
}

int cmd_export(int argc, char **argv)
{
	struct opts o;
	uint64_t step;
	int rc = st_parse(argc, argv, &o, "usage: snaptool export STEP -o FILE.h5 [--copy] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
					  "Write one HDF5 file where each logical tensor is one dataset of its global shape,\n"
					  "assembled from the ranks' shards: HDF5 virtual datasets pointing at the persisted\n"
					  "rank files (no copy; keep FILE next to the flush directory), or with --copy a\n"
					  "self-contained file. A job can then resume on another number of ranks.\n"
					  "With --copy on a terminal, a progress bar (bytes read, rate) on stderr.\n", 1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = need_flush_dir(&o, "export")) || (rc = st_parse_step(o.arg1, &step)))
		return rc;
	if (!o.output) {
		st_error("snaptool export: -o FILE is required");
		return ST_USAGE;
	}
	struct snap_io_err e = { 0 };
	uint64_t in_bytes = st_step_disk_bytes(o.cfg.flush_dir, o.cfg.client.job, step);
	st_verbose(&o, "step %" PRIu64 " of job %s: %.1f MiB of rank files in %s", step, o.cfg.client.job,
		   in_bytes / 1048576.0, o.cfg.flush_dir);
	/* Only a copy moves the bytes; virtual datasets read the metadata. */
	struct st_progress bar = { 0 };
	if (o.copy) {
		st_progress_begin(&bar, "export", in_bytes);
		st_progress_watch_reads(&bar);
	}
	rc = snap_io_export(o.cfg.flush_dir, o.cfg.client.job, step, o.output,
			    o.copy ? SNAP_IO_EXPORT_COPY : SNAP_IO_EXPORT_VIRTUAL, &e);
	if (o.copy) {
		st_progress_unwatch(&bar);
		if (rc) {
			st_progress_hide(&bar);
		} else {
			st_progress_set(&bar, bar.total);
			st_progress_end(&bar);
		}
	}
	if (rc) {
		st_error("snaptool export: %s", e.msg);
		return rc == SNAP_ECORRUPT || rc == SNAP_ETRUNC ? ST_LOST : ST_FAIL;
	}
	struct stat st;
	uint64_t out_bytes = stat(o.output, &st) == 0 ? (uint64_t)st.st_size : 0;
	if (o.json) {
		printf("{\"job\":");
		st_json_str(o.cfg.client.job);
		printf(",\"step\":%" PRIu64 ",\"output\":", step);
		st_json_str(o.output);
		printf(",\"mode\":\"%s\",\"bytes\":%" PRIu64 "}\n", o.copy ? "copy" : "virtual", out_bytes);
		st_json_done();
	} else {
		printf("exported step %" PRIu64 " of job %s to %s (%s)\n", step, o.cfg.client.job, o.output,
		       o.copy ? "copied" : "virtual datasets");
	}
	st_verbose(&o, "%s: %" PRIu64 " bytes", o.output, out_bytes);
	return ST_OK;
}

int cmd_gc(int argc, char **argv)
{
	struct opts o;
	int rc = st_parse(argc, argv, &o, "usage: snaptool gc [--keep N] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
					  "Apply retention to the flush directory: keep the newest N persisted steps (default\n"
					  "SNAP_FLUSH_KEEP, 2), delete older ones and leftovers of interrupted flushes. Never\n"
					  "deletes the newest persisted step.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = need_flush_dir(&o, "gc")))
		return rc;
	struct snap_io_err e = { 0 };
	uint64_t before[64];
	int nb = o.verbose ? snap_io_list_steps(o.cfg.flush_dir, o.cfg.client.job, before, 64, &e) : 0;
	for (int i = 0; i < nb && i < 64; i++)
		st_verbose(&o, "persisted before: step %" PRIu64, before[i]);
	int n = snap_io_retain(o.cfg.flush_dir, o.cfg.client.job, o.keep, &e);
	if (n < 0) {
		st_error("snaptool gc: %s", e.msg);
		return ST_FAIL;
	}
	if (o.json) {
		printf("{\"job\":");
		st_json_str(o.cfg.client.job);
		printf(",\"keep\":%u,\"removed\":%d}\n", o.keep, n);
		st_json_done();
	} else {
		printf("job %s: removed %d step directories, kept the newest %u persisted\n", o.cfg.client.job, n, o.keep);
	}
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
					  "                       [--allow-older] [--json] [-q|-v]\n"
					  "Report exactly what of a job is recoverable after failures and from where: the\n"
					  "newest step every rank committed in the node store, else the newest persisted step\n"
					  "that verifies. Exit 0 if something is recoverable, 3 if nothing is, 1 if the\n"
					  "store or flush directory cannot be read (that is not a loss). With --nodes N and a\n"
					  "--store holding %n (snapsmp --ec): the mesh, level by level (node stores, parity,\n"
					  "the shared flush directory). On a terminal, a progress bar (bytes read, rate)\n"
					  "while a persisted step is verified.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	uint64_t mem = 0, disk = 0;
	char mem_why[1200] = "", disk_why[1200] = "";
	int mrc = store_candidate(&o, &mem, mem_why, sizeof(mem_why)), have_mem = mrc == 0, have_disk = 0;
	if (have_mem)
		st_verbose(&o, "node store %s: step %" PRIu64 " committed by every rank", o.cfg.client.store, mem);
	else
		st_verbose(&o, "%s", mem_why);
	if (mrc == SNAP_EPERM) {
		/* Data we may not read is not lost data: never report a loss for it. */
		st_error("snaptool recover: %s", mem_why);
		return ST_FAIL;
	}
	if (o.cfg.flush_dir[0]) {
		uint64_t steps[64];
		struct snap_io_err e = { 0 };
		int n = snap_io_list_steps(o.cfg.flush_dir, o.cfg.client.job, steps, 64, &e);
		if (n < 0 && e.code == SNAP_EPERM) {
			st_error("snaptool recover: flush directory %s: %s", o.cfg.flush_dir, e.msg);
			return ST_FAIL;
		}
		if (n <= 0)
			snprintf(disk_why, sizeof(disk_why), "nothing persisted in %s%s%s", o.cfg.flush_dir, n < 0 ? ": " : "",
				 n < 0 ? e.msg : "");
		uint64_t lost = 0, sealed = 0;
		uint32_t sw = 0;
		if (n >= 0 && snap_io_sealed_step(o.cfg.flush_dir, o.cfg.client.job, &sealed) &&
		    (n == 0 || sealed > steps[0]) &&
		    snap_io_step_world(o.cfg.flush_dir, o.cfg.client.job, sealed, &sw, &e) != 0) {
			snprintf(disk_why, sizeof(disk_why), "persisted step %" PRIu64 " is damaged: %s%s", sealed, e.msg,
				 o.allow_older ? "" : "; --allow-older to use an older step");
			fprintf(stderr, "snaptool recover: warning: %s\n", disk_why);
			if (!o.allow_older)
				n = 0;
		} else if (n >= 0 && snap_io_lost_step(o.cfg.flush_dir, o.cfg.client.job, n > 0 ? steps[0] : 0, &lost)) {
			snprintf(disk_why, sizeof(disk_why), "persisted step %" PRIu64 " has lost its MANIFEST (its rank "
				 "files are still there)%s", lost, o.allow_older ? "" : "; --allow-older to use an older step");
			fprintf(stderr, "snaptool recover: warning: %s\n", disk_why);
			if (!o.allow_older)
				n = 0;
		}
		for (int i = 0; i < n && i < 64 && !have_disk; i++) {
			size_t bad = 0;
			struct st_progress bar;
			char what[48];
			snprintf(what, sizeof(what), "verify step %" PRIu64, steps[i]);
			st_progress_begin(&bar, what, st_step_disk_bytes(o.cfg.flush_dir, o.cfg.client.job, steps[i]));
			st_progress_watch_reads(&bar);
			int vrc = snap_io_verify_step(o.cfg.flush_dir, o.cfg.client.job, steps[i], &bad, &e);
			st_progress_unwatch(&bar);
			if (vrc == 0)
				st_progress_set(&bar, bar.total);
			st_progress_end(&bar);
			st_verbose(&o, "persisted step %" PRIu64 ": %s%s", steps[i], vrc ? "damaged: " : "verifies",
				   vrc ? e.msg : "");
			if (vrc == 0) {
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
		st_json_done();
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
