/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * damage.h - the store's record of damage beyond repair: why a rank's step
 * was withdrawn or a captured file marked damaged (smp/heal/repair.c,
 * smp/heal/filescrub.c), kept in the store so that the reason outlives the
 * daemon that found it (snaptool status reads it with or without a
 * running snapsmp).
 *
 *   <root>/damage       the newest SNAP_DAMAGE_KEEP records, oldest first
 *   <root>/damage.tmp   the next version, renamed over it (atomic)
 *
 * One text line per record: CRC32C (8 hex digits) of the rest of the line,
 * then tab-separated: seconds since the epoch, job, what (e.g. "rank 0 step
 * 12", "captured file /ckpt/x.pt"), why. A line that does not check out is
 * skipped; a missing file is no record.
 */
#ifndef SNAP_DAMAGE_H
#define SNAP_DAMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "snap/types.h"

#define SNAP_DAMAGE_KEEP 32
#define SNAP_DAMAGE_FILE "damage"

struct snap_damage {
	uint64_t time_s;              /* CLOCK_REALTIME when it was found */
	char job[SNAP_JOB_MAX + 1];
	char what[320];               /* the thing damaged: "rank R step S", "captured file PATH" */
	char why[512];                /* what was found, and why no level could repair it */
};

/* Append d to root's record (tabs and newlines in its strings become
 * spaces), keeping the newest SNAP_DAMAGE_KEEP: 0 or SNAP_EIO. */
int snap_damage_record(const char *root, const struct snap_damage *d, char *err, size_t errlen);
/* The records in root's file, oldest first, at most cap of the newest:
 * how many (0: none, or no file). */
int snap_damage_load(const char *root, struct snap_damage *out, int cap);
/* "job J WHAT: WHY" into out. */
void snap_damage_line(const struct snap_damage *d, char *out, size_t cap);

#endif
