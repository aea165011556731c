/* SPDX-License-Identifier: BSD-3-Clause */
/* rehydrate.h - restore from disk into the node store; see rehydrate.c. */
#ifndef SNAP_REHYDRATE_H
#define SNAP_REHYDRATE_H

#include "snap/smp_config.h"
#include "snap/store.h"

/*
 * Load rank r's file of the job's chosen persisted step into a slot and
 * commit it there; *slot names it. SNAP_ENOENT when nothing is persisted.
 */
int snap_rehydrate(const struct snap_smp_config *cfg, struct snap_store *s, struct store_job *j, struct store_rank *r,
		   void *owner, uint32_t *slot, char *err, size_t errlen);

#endif
