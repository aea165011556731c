/* SPDX-License-Identifier: BSD-3-Clause */
/* repair.h - self-healing of the node store's slots; see repair.c. */
#ifndef SNAP_REPAIR_H
#define SNAP_REPAIR_H

#include <stdint.h>

#include "snap/smp_config.h"
#include "snap/store.h"

/* What repairs and scrubs did since snapsmp started (STATUS, snaptool status). */
struct smp_heal {
	uint64_t repaired_chunks;      /* chunks rewritten from another level, re-verified */
	uint64_t damaged_steps;        /* a rank's step withdrawn: no level held a good copy */
	uint64_t scrubbed_bytes;       /* bytes the background scrub verified */
	uint64_t scrub_passes;         /* complete passes over the store */
	uint64_t damaged_step;         /* the last withdrawn one ... */
	uint32_t damaged_rank;
	char damaged_job[SNAP_JOB_MAX + 1];
	char damaged_why[400];         /* ... and why ("" none) */
	uint64_t damaged_files;        /* captured files marked damaged: no level held a good copy */
	char last_damage[768];         /* the last damage beyond repair, a step's or a file's, as
	                                  "job J WHAT: WHY" ("" none); loaded from the store at start */
};

/*
 * Damage beyond repair found: keep its reason in h->last_damage and in the
 * store's record (snap/damage.h), which outlives this daemon. what names
 * the thing ("rank R step S", "captured file PATH").
 */
void smp_heal_damage(struct smp_heal *h, const struct snap_store *s, const char *job, const char *what,
		     const char *why);
/* At start: the newest damage the store recorded becomes h->last_damage. */
void smp_heal_load(struct smp_heal *h, const struct snap_store *s);

/* The scrub's reads (heal.c): install the SIGBUS guard they run under (once,
 * before the first read; without it they fall back to pread). */
void smp_heal_guard_init(void);
/* CRC32C of len bytes at off of fd (a stored slot or captured file),
 * through a guarded mapping (or pread through buf): 0, or -1 when the file
 * is shorter or the bytes cannot be read. */
int smp_heal_crc(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, uint32_t *crc);
/* CRC32C of len mapped bytes at p under the SIGBUS guard: 0, -1 when a page
 * is gone (the file was truncated under the mapping), -2 when the guard is
 * not installed (nothing read). */
int smp_heal_crc_mapped(const uint8_t *p, size_t len, uint32_t *crc);

/* One slot's repair. */
struct smp_repair_out {
	uint64_t step;
	uint32_t bad;                  /* chunks that failed their CRC32C */
	uint32_t repaired;             /* of those, rewritten and re-verified */
	uint32_t by_parity;            /* of those, decoded from the mesh's parity (the rest: the flush) */
	int mended;                    /* the slot file was missing or short: recreated or grown */
	char how[400];                 /* what was found and where the bytes came from */
};

/*
 * Verify every chunk of rank r's committed slot against its manifest's
 * CRC32C (a missing or short slot file counts as bad bytes) and rewrite
 * each bad chunk with the same step's chunk from the next level that holds
 * it: the flushed HDF5 file in cfg->flush_dir (read region by region, each
 * checked by io against the file's own CRC32C, then the chunk against the
 * manifest's CRC before it is used, and again once it is written). A step
 * with a chunk that no level holds intact is withdrawn on this rank (never
 * restored) and counted as damaged, unless keep (a mesh, where only the
 * agreement withdraws steps: there it is left and reported). Logged,
 * counted in h.
 * 0: the slot is intact (repaired or not); SNAP_ECORRUPT: withdrawn;
 * another error: the slot could not be read or written (left as it was).
 */
int smp_repair_slot(const struct snap_smp_config *cfg, struct snap_store *s, struct store_job *j, struct store_rank *r,
		    uint32_t slot, const char *who, int keep, struct smp_heal *h, struct smp_repair_out *out, char *err,
		    size_t errlen);

/*
 * On a mesh, after the mesh decoded the protected step's stripes from
 * parity (meshheal.c): `before` chunks of the slot were bad before it
 * (smp_repair_count, SMP_REPAIR_SHORT included), pmsg says why the parity could not repair them ("":
 * it ran). What is still bad goes to smp_repair_slot (keep: nothing is
 * withdrawn); out counts the chunks the parity repaired too (bad, repaired,
 * how "N bad chunks repaired from parity ...") and h->repaired_chunks them.
 * Returns as smp_repair_slot.
 */
int smp_repair_after_parity(const struct snap_smp_config *cfg, struct snap_store *s, struct store_job *j,
			    struct store_rank *r, uint32_t slot, const char *who, uint32_t before, const char *pmsg,
			    struct smp_heal *h, struct smp_repair_out *out, char *err, size_t errlen);

/*
 * Count the chunks of rank r's committed slot that fail the manifest's
 * CRC32C, reading with pread (a missing file: every chunk, a short one:
 * the chunks it lacks). Changes nothing. 0 and *bad, or an error with err.
 */
int smp_repair_count(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t slot, uint32_t *bad,
		     char *err, size_t errlen);
/* In *bad of smp_repair_count (and `before` of smp_repair_after_parity):
 * the slot file was missing or short. */
#define SMP_REPAIR_SHORT 0x80000000u

#endif
