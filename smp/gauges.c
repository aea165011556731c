/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * --metrics-file: the daemon's state as Prometheus gauges, read from the
 * store on the poll loop's thread (which owns it; the mesh lock is held),
 * plus metrics.c's histograms and counters. The same numbers as snaptool
 * status: the budget and bytes the daemon counts (STATUS), the newest step
 * every rank committed (restorable; in a mesh the agreed view), what is
 * persisted. Read once a second so that the ages are right to a second;
 * formatted every --metrics-interval seconds and handed to the writer
 * thread, so no file I/O happens here.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/metrics.h"
#include "mesh/mesh.h"
#include "smp_internal.h"

enum { K_COMMITTED, K_RESTORABLE, K_PROTECTED, K_PERSISTED, K_N };

static const char *const kind_name[K_N] = { "committed", "restorable", "protected", "persisted" };
static const char *const kind_help[K_N] = {
	"Newest step some rank of the job committed on this node.",
	"Newest step every rank committed (in a mesh: globally complete, as the nodes agreed).",
	"Newest step whose parity every node of the mesh holds.",
	"Newest step persisted in the flush directory.",
};

struct jobv {
	const char *name;
	uint64_t slot_bytes, pinned;
	uint32_t connected, world;
	int has[K_N];
	uint64_t step[K_N];
	double age[K_N];
};

/* The newest committed step of any rank of j here. */
static int newest_committed(const struct snap_store *s, const struct store_job *j, uint64_t *step)
{
	int found = 0;
	for (uint32_t r = 0; r < j->nranks; r++)
		for (uint32_t i = 0; j->ranks[r] && i < s->nslots; i++) {
			const struct store_slot *sl = &j->ranks[r]->slots[i];
			if (sl->state == SLOT_COMMITTED && !sl->superseded && (!found || sl->step > *step)) {
				*step = sl->step;
				found = 1;
			}
		}
	return found;
}

static void read_job(struct smp *m, struct store_job *j, struct jobv *v, uint64_t now)
{
	*v = (struct jobv){ .name = j->name, .connected = j->connected, .world = j->world };
	for (uint32_t r = 0; r < j->nranks; r++)
		for (uint32_t i = 0; j->ranks[r] && i < m->store->nslots; i++)
			v->slot_bytes += j->ranks[r]->slots[i].size;
	for (struct conn *c = m->conns; c; c = c->next)
		if (!c->dead && c->job == j)
			v->pinned += c->pinned;
	v->has[K_COMMITTED] = newest_committed(m->store, j, &v->step[K_COMMITTED]);
	v->has[K_RESTORABLE] = snap_store_latest(m->store, j, &v->step[K_RESTORABLE]) == 0;
	v->has[K_PROTECTED] = snap_mesh_job_protected(m->mesh, j->name, &v->step[K_PROTECTED]);
	v->has[K_PERSISTED] = j->has_persisted;
	v->step[K_PERSISTED] = j->persisted;
	for (int k = 0; k < K_N; k++)
		if (v->has[k])
			v->age[k] = (double)(now - smp_metrics_since(j->name, k, v->step[k], now)) / 1e9;
}

static void family(struct smp_text *t, const char *name, const char *type, const char *help)
{
	smp_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(struct smp_text *t, const char *name, const char *job, double v)
{
	smp_text_printf(t, "%s{", name);
	smp_text_labels(t, job);
	smp_text_printf(t, "} %.17g\n", v);
}

static void format_jobs(struct smp_text *t, const struct jobv *v, unsigned n, int mesh)
{
	static const struct {
		const char *name, *help;
		size_t off;
		int u32;
	} g[] = {
		{ "libsnap_job_slot_bytes", "Bytes of the job's slot files on this node.", offsetof(struct jobv, slot_bytes), 0 },
		{ "libsnap_job_pinned_bytes", "Bytes the job's connected trainers hold pinned for GPU copies.",
		  offsetof(struct jobv, pinned), 0 },
		{ "libsnap_job_connected_ranks", "The job's ranks connected to this daemon.", offsetof(struct jobv, connected), 1 },
		{ "libsnap_job_world_size", "The job's world size, from its newest HELLO (0: none yet).",
		  offsetof(struct jobv, world), 1 },
	};
	for (size_t f = 0; f < sizeof(g) / sizeof(g[0]); f++) {
		family(t, g[f].name, "gauge", g[f].help);
		for (unsigned i = 0; i < n; i++) {
			const char *p = (const char *)&v[i] + g[f].off;
			double x = g[f].u32 ? (double)*(const uint32_t *)(const void *)p : (double)*(const uint64_t *)(const void *)p;
			sample(t, g[f].name, v[i].name, x);
		}
	}
	for (int k = 0; k < K_N; k++) {
		char name[64], help[256];
		if (k == K_PROTECTED && !mesh)
			continue;
		snprintf(name, sizeof(name), "libsnap_%s_step", kind_name[k]);
		family(t, name, "gauge", kind_help[k]);
		for (unsigned i = 0; i < n; i++)
			if (v[i].has[k])
				sample(t, name, v[i].name, (double)v[i].step[k]);
		snprintf(name, sizeof(name), "libsnap_%s_step_age_seconds", kind_name[k]);
		snprintf(help, sizeof(help), "Seconds since this daemon first saw libsnap_%s_step at its value "
			 "(a restarted daemon counts from its start).", kind_name[k]);
		family(t, name, "gauge", help);
		for (unsigned i = 0; i < n; i++)
			if (v[i].has[k])
				sample(t, name, v[i].name, v[i].age[k]);
	}
}

static void format_node(struct smp *m, struct smp_text *t)
{
	family(t, "libsnap_store_used_bytes", "gauge",
	       "Bytes the daemon counts against its budget: slot, parity and captured files.");
	sample(t, "libsnap_store_used_bytes", NULL, (double)m->store->mem_used);
	family(t, "libsnap_store_budget_bytes", "gauge", "The daemon's memory budget (--mem-limit).");
	sample(t, "libsnap_store_budget_bytes", NULL, (double)m->store->mem_limit);
	family(t, "libsnap_connections", "gauge", "Open connections (trainers, snaptool).");
	sample(t, "libsnap_connections", NULL, (double)m->nconns);
	family(t, "libsnap_start_time_seconds", "gauge", "When the daemon started, in seconds since the epoch.");
	sample(t, "libsnap_start_time_seconds", NULL, m->metrics_start_s);
	/* Self-healing (repair.c, scrub.c): what snaptool status reports. */
	static const struct { const char *name, *help; size_t off; } heal[] = {
		{ "libsnap_repaired_chunks_total", "Store chunks (and mesh parity pieces) repaired from another level and re-verified.",
		  offsetof(struct smp_heal, repaired_chunks) },
		{ "libsnap_damaged_steps_total", "A rank's step withdrawn because no level held a good copy of it.",
		  offsetof(struct smp_heal, damaged_steps) },
		{ "libsnap_damaged_files_total", "A captured file marked damaged because no level held a good copy of it.",
		  offsetof(struct smp_heal, damaged_files) },
		{ "libsnap_scrubbed_bytes_total", "Bytes the background scrub verified (--scrub-rate).",
		  offsetof(struct smp_heal, scrubbed_bytes) },
		{ "libsnap_scrub_passes_total", "Complete passes of the background scrub over the store.",
		  offsetof(struct smp_heal, scrub_passes) },
	};
	for (size_t i = 0; i < sizeof(heal) / sizeof(heal[0]); i++) {
		uint64_t v;
		memcpy(&v, (const char *)&m->heal + heal[i].off, sizeof(v));
		family(t, heal[i].name, "counter", heal[i].help);
		sample(t, heal[i].name, NULL, (double)v);
	}
}

void smp_export_tick(struct smp *m)
{
	if (!smp_metrics_on())
		return;
	char msg[SMP_ERRLEN];
	if (smp_metrics_take_error(msg, sizeof(msg)))
		smp_logf(&m->log, SMP_LOG_WARN, "%s", msg);
	uint64_t now = snap_now_ns();
	if (m->metrics_read_ns && now - m->metrics_read_ns < 1000000000ull)
		return;
	m->metrics_read_ns = now;
	unsigned n = 0;
	for (struct store_job *j = m->store->jobs; j; j = j->next)
		n++;
	struct jobv *v = calloc(n ? n : 1, sizeof(*v));
	if (!v)
		return;
	n = 0;
	for (struct store_job *j = m->store->jobs; j; j = j->next)
		read_job(m, j, &v[n++], now);
	uint64_t every = (uint64_t)m->cfg->metrics_interval * 1000000000ull;
	if (!m->metrics_write_ns || now - m->metrics_write_ns >= every) {
		m->metrics_write_ns = now;
		struct smp_text t = { 0 };
		format_node(m, &t);
		format_jobs(&t, v, n, m->mesh != NULL);
		smp_metrics_format(&t);
		smp_metrics_publish(&t);
	}
	free(v);
}

int smp_export_timeout_ms(const struct smp *m, int timeout)
{
	(void)m;
	if (!smp_metrics_on())
		return timeout;
	return timeout < 0 || timeout > 1000 ? 1000 : timeout;
}
