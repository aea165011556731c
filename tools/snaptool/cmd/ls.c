/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool ls: one line per committed snapshot of a node store (read-only,
 * without the daemon).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/base.h"
#include "opts.h"
#include "progress.h"
#include "snap/io.h"
#include "snaptool.h"
#include "snap/store.h"
#include "snap/wire.h"

int cmd_ls(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	int rc = st_parse(argc, argv, &o, "usage: snaptool ls [--store DIR] [--job NAME] [--json] [-q|-v]\n"
				       "One line per committed snapshot: job, step, rank, slot, bytes.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_open_store(&o, &s)))
		return rc;
	int first = 1;
	if (o.json)
		printf("[");
	else
		printf("%-16s %-10s %-6s %-5s %s\n", "job", "step", "rank", "slot", "bytes");
	for (struct store_job *j = s->jobs; j; j = j->next) {
		if (o.job_set && strcmp(j->name, o.cfg.client.job))
			continue;
		for (uint32_t r = 0; r < j->nranks; r++)
			for (unsigned i = 0; j->ranks[r] && i < s->nslots; i++) {
				const struct store_slot *sl = &j->ranks[r]->slots[i];
				if (sl->state != SLOT_COMMITTED) {
					st_verbose(&o, "job %s rank %u slot %u: %s (not listed)", j->name, r, i,
						   sl->state == SLOT_WRITING ? "being written" : "free");
					continue;
				}
				if (o.json) {
					printf("%s{\"job\":", first ? "" : ",");
					st_json_str(j->name);
					printf(",\"step\":%" PRIu64 ",\"rank\":%u,\"slot\":%u,\"bytes\":%" PRIu64 "}", sl->step,
					       r, i, sl->man.layout.slot_bytes);
				} else
					printf("%-16s %-10" PRIu64 " %-6u %-5u %" PRIu64 "\n", j->name, sl->step, r, i,
					       sl->man.layout.slot_bytes);
				first = 0;
			}
	}
	if (o.json) {
		printf("]\n");
		st_json_done();
	}
	snap_store_close(s);
	return ST_OK;
}
