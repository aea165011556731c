/* SPDX-License-Identifier: BSD-3-Clause */
/* scrub.h - the background scrub of the node store; see scrub.c. */
#ifndef SNAP_SCRUB_H
#define SNAP_SCRUB_H

struct smp;
struct smp_scrub;

/* Start the scrub (NULL: off: --scrub-rate 0). */
struct smp_scrub *smp_scrub_new(struct smp *m);
void smp_scrub_free(struct smp_scrub *sc);
/* Milliseconds until the scrub wants to run again (-1: never). */
int smp_scrub_timeout_ms(const struct smp_scrub *sc);
/* Verify what the rate allows since the last call; repair what is bad. */
void smp_scrub_tick(struct smp *m);

#endif
