/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool gc: apply retention to the flush directory; no daemon needed.
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

int cmd_gc(int argc, char **argv)
{
	struct opts o;
	int rc = st_parse(argc, argv, &o, "usage: snaptool gc [--keep N] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
					  "Apply retention to the flush directory: keep the newest N persisted steps (default\n"
					  "SNAP_FLUSH_KEEP, 2), delete older ones and leftovers of interrupted flushes. Never\n"
					  "deletes the newest persisted step.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_need_flush_dir(&o)))
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
