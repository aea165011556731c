/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool export: one consolidated HDF5 file of a persisted step (global
 * shapes), from the flush directory; no daemon needed.
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
	if ((rc = st_need_flush_dir(&o)) || (rc = st_parse_step(o.arg1, &step)))
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
