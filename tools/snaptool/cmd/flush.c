/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool flush: ask the running snapsmp (it owns the store) to persist a
 * step now, and wait with a progress bar.
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

static const char flush_usage[] =
	"usage: snaptool flush [STEP] [--store DIR] [--job NAME] [--flush-dir DIR] [--json] [-q|-v]\n"
	"Ask the node's snapsmp to persist STEP (default: the newest restorable step) to its\n"
	"flush directory now, and wait until it is persisted. Needs a running snapsmp\n"
	"started with --flush-dir. On a terminal, a progress bar on stderr: with --flush-dir\n"
	"(or SNAP_FLUSH_DIR, the daemon's) bytes written against the step's bytes, and\n"
	"rate; without, the seconds waited. None when piped.\n";

/* A connected socket to the store's snapsmp, or -ST_USAGE / -ST_FAIL after a message. */
static int flush_connect(const struct opts *o)
{
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(o->cfg.client.socket) >= sizeof(a.sun_path)) {
		if (s >= 0)
			close(s);
		st_error("snaptool flush: socket path too long");
		return -ST_USAGE;
	}
	memcpy(a.sun_path, o->cfg.client.socket, strlen(o->cfg.client.socket) + 1);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		st_error("snaptool flush: cannot reach snapsmp at %s (is it running?)", o->cfg.client.socket);
		if (s >= 0)
			close(s);
		return -ST_FAIL;
	}
	return s;
}

/* Send FLUSH and wait for the reply, drawing progress meanwhile: the
 * bytes the step's directory gains against total (when known), else the
 * seconds waited. 0 with *h and *rep, or the wire's error code. */
static int flush_wait(const struct opts *o, int s, uint64_t step, uint64_t total, const char *dir,
		      struct snap_msg_hdr *h, void **rep)
{
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, o->cfg.client.job);
	snap_put_u64(&w, step);
	snap_put_u8(&w, 1);
	int rc = snap_wire_send(s, SNAP_MSG_FLUSH, 0, w.p, (uint32_t)w.len, -1);
	snap_wbuf_free(&w);
	int tty = !o->quiet && isatty(STDERR_FILENO);
	uint64_t t0 = snap_now_ns(), base = total ? st_dir_bytes(dir) : 0;
	struct st_progress bar = { 0 };
	if (total)
		st_progress_begin(&bar, "flush", total);
	/* Wait in slices so a terminal sees that work goes on. */
	while (rc == 0 && (rc = snap_wire_recv(s, h, rep, NULL, 250)) == SNAP_ETIMEDOUT) {
		if (total) {
			uint64_t now = st_dir_bytes(dir);
			st_progress_set(&bar, now > base ? now - base : 0);
		} else if (tty) {
			fprintf(stderr, "\rflushing job %s ... %.0f s", o->cfg.client.job, (snap_now_ns() - t0) / 1e9);
		}
		rc = 0;
	}
	/* A full bar only for bytes written now: an empty reply means the step
	 * was on disk already. */
	if (total && rc == 0 && h->status >= 0 && h->len >= 24) {
		st_progress_set(&bar, total);
		st_progress_end(&bar);
	} else if (total) {
		st_progress_hide(&bar);
	} else if (tty) {
		fprintf(stderr, "\r\033[K");
	}
	return rc;
}

static void flush_print(const struct opts *o, const struct snap_msg_hdr *h, const void *rep)
{
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, h->len);
	uint64_t got = snap_get_u64(&r), bytes = snap_get_u64(&r), ns = snap_get_u64(&r);
	if (o->json) {
		printf("{\"job\":");
		st_json_str(o->cfg.client.job);
		if (r.bad)
			printf(",\"step\":null,\"already_persisted\":true,\"bytes\":null,\"elapsed_ns\":null}\n");
		else
			printf(",\"step\":%" PRIu64 ",\"already_persisted\":false,\"bytes\":%" PRIu64 ",\"elapsed_ns\":%" PRIu64
			       "}\n", got, bytes, ns);
		st_json_done();
	} else if (r.bad) {
		printf("job %s: step already persisted\n", o->cfg.client.job);
	} else {
		printf("job %s: step %" PRIu64 " persisted (%.1f MiB in %.2f s)\n", o->cfg.client.job, got, bytes / 1048576.0,
		       ns / 1e9);
	}
}

int cmd_flush(int argc, char **argv)
{
	struct opts o;
	uint64_t step = SNAP_STEP_LATEST;
	int rc = st_parse(argc, argv, &o, flush_usage, -1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (o.arg1 && (rc = st_parse_step(o.arg1, &step)))
		return rc;
	int s = flush_connect(&o);
	if (s < 0)
		return -s;
	uint64_t bar_step = step, total = flush_total(&o, &bar_step);
	char dir[SNAP_PATH_MAX * 2] = "";
	if (total)
		snprintf(dir, sizeof(dir), "%s/%s/step-%" PRIu64, o.cfg.flush_dir, o.cfg.client.job, bar_step);
	st_verbose(&o, "asking snapsmp at %s to flush job %s step %s%s", o.cfg.client.socket, o.cfg.client.job,
		   o.arg1 ? o.arg1 : "(newest restorable)", total ? "" : "; no --flush-dir or step unknown: no byte count");
	struct snap_msg_hdr h;
	void *rep = NULL;
	rc = flush_wait(&o, s, step, total, dir, &h, &rep);
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
	flush_print(&o, &h, rep);
	free(rep);
	return ST_OK;
}
