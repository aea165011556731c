/* SPDX-License-Identifier: BSD-3-Clause */
/* meshscrub.h - the background scrub's mesh part (--ec); see meshscrub.c. */
#ifndef SNAP_MESHSCRUB_H
#define SNAP_MESHSCRUB_H

#include <stddef.h>
#include <stdint.h>

#include "snap/store.h"

struct smp;

/* A chunk of rank r's committed slot failed its CRC32C: repair it, parity
 * first (the repair runs in the mesh's next round: see smp_mesh_scrub_busy),
 * then the flush; a copy no level repairs is given up. */
void smp_mesh_scrub_bad(struct smp *m, struct store_job *j, struct store_rank *r, uint32_t slot);
/* 1 while a repair the scrub asked for waits on the mesh (the scrub pauses);
 * finishes it once the mesh is done. */
int smp_mesh_scrub_busy(struct smp *m);
/* Check the next parity piece of a protected step against its record's
 * CRC32C (buf: cap bytes of scratch); a bad one is repaired from the
 * group's data. The bytes read (at least 1 when it did something), 0 when
 * the parity pieces wait for the slots' pass to end (one parity pass per
 * pass over the slots). */
uint64_t smp_mesh_scrub_parity(struct smp *m, uint8_t *buf, size_t cap);
void smp_mesh_scrub_free(struct smp *m);

#endif
