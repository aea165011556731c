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

#define SMP_REHYDRATE_ERRLEN 640

/*
 * Read rank's file of persisted `step` into base, laid out as a slot of lay
 * (lay->slot_bytes), and fill crc/len (lay->ncrc each) with what a manifest
 * of those bytes says. Every byte was checked by io against the file's own
 * CRC32C first. only (NULL: every region) names the regions to read, one
 * flag per region of lay: the repair of a damaged slot (repair.c) reads
 * those holding bad chunks, one at a time, so that damage to another region
 * of the file does not keep it from the good ones.
 */
int snap_rehydrate_read(const char *flush_dir, const char *job, uint32_t rank, uint64_t step,
			const struct snap_layout *lay, const uint8_t *only, uint8_t *base, uint32_t *crc, uint32_t *len,
			char *err, size_t errlen);

#endif
