/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The self-healing counters' reason for damage beyond repair: kept in
 * memory for STATUS and in the store's record (snap/damage.h), so that it
 * outlives the daemon. Used by the repair of slots (repair.c) and the scrub
 * of captured files (filescrub.c); logs through the store's callback.
 */
#include <stdio.h>
#include <time.h>

#include "repair.h"
#include "snap/damage.h"

void smp_heal_damage(struct smp_heal *h, const struct snap_store *s, const char *job, const char *what,
		     const char *why)
{
	struct snap_damage d = { .time_s = (uint64_t)time(NULL) };
	snprintf(d.job, sizeof(d.job), "%s", job);
	snprintf(d.what, sizeof(d.what), "%s", what);
	snprintf(d.why, sizeof(d.why), "%s", why);
	snap_damage_line(&d, h->last_damage, sizeof(h->last_damage));
	char err[SNAP_FILE_MAX + 128];
	if (snap_damage_record(s->root, &d, err, sizeof(err)))
		snap_store_logf(s, "%s (the reason is kept until this daemon stops)", err);
}

void smp_heal_load(struct smp_heal *h, const struct snap_store *s)
{
	struct snap_damage d;
	if (snap_damage_load(s->root, &d, 1) == 1) {
		snap_damage_line(&d, h->last_damage, sizeof(h->last_damage));
		snap_store_logf(s, "last damage beyond repair recorded in the store: %s", h->last_damage);
	}
}
