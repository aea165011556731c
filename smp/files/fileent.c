/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files, daemon side: one job's entries. The hash by logical path,
 * the commit order (oldest first, what eviction takes), paths, the budget
 * of files being written, and removing an entry with its manifest.
 */
#include "files/files_int.h"

static unsigned hash_path(const char *p)
{
	uint32_t h = 2166136261u;
	for (; *p; p++)
		h = (h ^ (uint8_t)*p) * 16777619u;
	return h % FILES_HBUCKETS;
}

struct fent *files_lookup(struct fjob *j, const char *path)
{
	for (struct fent *e = j->hash[hash_path(path)]; e; e = e->hnext)
		if (strcmp(e->path, path) == 0)
			return e;
	return NULL;
}

void files_hash_insert(struct fjob *j, struct fent *e)
{
	unsigned h = hash_path(e->path);
	e->hnext = j->hash[h];
	j->hash[h] = e;
}

void files_hash_remove(struct fjob *j, struct fent *e)
{
	for (struct fent **pp = &j->hash[hash_path(e->path)]; *pp; pp = &(*pp)->hnext)
		if (*pp == e) {
			*pp = e->hnext;
			return;
		}
}

void files_order_append(struct fjob *j, struct fent *e)
{
	e->next = NULL;
	e->prev = j->tail;
	if (j->tail)
		j->tail->next = e;
	else
		j->head = e;
	j->tail = e;
}

static void order_remove(struct fjob *j, struct fent *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		j->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		j->tail = e->prev;
	e->prev = e->next = NULL;
}

void files_free_entry(struct fent *e)
{
	snap_fman_free(&e->man);
	free(e->path);
	free(e);
}

/*
 * A path a client may name: absolute, normalized (no "", "." or ".."
 * components), not the root, not inside the store itself (the flush would
 * write into the store it reads).
 */
int files_path_ok(const struct snap_files *f, const char *p)
{
	size_t n = strlen(p), rl = strlen(f->store->root);
	if (n < 2 || n >= FILES_PATH_MAX || p[0] != '/' || p[n - 1] == '/')
		return 0;
	for (const char *c = p; *c;) {
		const char *s = ++c;   /* past '/' */
		while (*c && *c != '/')
			c++;
		size_t l = (size_t)(c - s);
		if (l == 0 || l > 255 || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.'))
			return 0;
	}
	return !(strncmp(p, f->store->root, rl) == 0 && (p[rl] == '/' || p[rl] == '\0'));
}

/* dirname / basename of an absolute normalized path into buffers. */
void files_split_path(const char *p, char *dir, size_t dcap, const char **base)
{
	const char *s = strrchr(p, '/');
	size_t dl = s == p ? 1 : (size_t)(s - p);
	snprintf(dir, dcap, "%.*s", (int)dl, p);
	*base = s + 1;
}

/* The flush's temporary name beside the real file: hidden, and the preload hides it from listings. */
int files_flush_tmp_name(const char *path, uint64_t id, char *out, size_t cap)
{
	char dir[FILES_PATH_MAX];
	const char *base;
	files_split_path(path, dir, sizeof(dir), &base);
	int n = snprintf(out, cap, "%s%s.%s.snapflush-%016" PRIx64, dir, strcmp(dir, "/") ? "/" : "", base, id);
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* mkdir -p of the parents of rel (relative to dirfd). */
int files_mkparents(int dirfd, const char *rel)
{
	char buf[FILES_PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", rel);
	for (char *c = strchr(buf, '/'); c; c = strchr(c + 1, '/')) {
		*c = '\0';
		if (mkdirat(dirfd, buf, 0700) != 0 && errno != EEXIST)
			return -1;
		*c = '/';
	}
	return 0;
}

void files_notify(struct snap_files *f)
{
	char b = 1;
	if (write(f->pipe[1], &b, 1) < 0) {
		/* full pipe: the poll loop has wake-ups pending already */
	}
}

uint64_t files_wall_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The job's namespace changed: an erasure-coded mesh protects it anew
 * (meshcap.c reads the counter in its next round). */
void files_ns_changed(struct snap_files *f, struct fjob *j)
{
	struct store_job *sj = snap_store_job(f->store, j->name, 1);
	if (sj)
		sj->files_ver++;
}

/*
 * Drop an entry from the namespace: its manifest (unless a rename already
 * replaced it), its data, its memory charge. One being flushed is freed by
 * the flush thread when its copy ends.
 */
void files_remove_entry(struct snap_files *f, struct fjob *j, struct fent *e, int unlink_manifest)
{
	char name[17];
	if (f->scrub_e == e) {
		f->scrub_e = e->next;
		f->scrub_chunk = 0;
	}
	files_hash_remove(j, e);
	order_remove(j, e);
	files_ns_changed(f, j);
	if (unlink_manifest)
		unlinkat(j->nsfd, e->path + 1, 0);
	snap_fman_data_name(e->id, name);
	unlinkat(j->datafd, name, 0);
	f->store->mem_used -= e->charge < f->store->mem_used ? e->charge : f->store->mem_used;
	if (e->state == F_FLUSHING)
		e->dead = 1;
	else
		files_free_entry(e);
}

void files_uncharge(struct snap_files *f, uint64_t bytes)
{
	f->store->mem_used -= bytes < f->store->mem_used ? bytes : f->store->mem_used;
}

void files_drop_wip(struct snap_files *f, struct fjob *j, struct fwip *w, int unlink_data)
{
	for (struct fwip **pp = &j->wip; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	if (unlink_data) {
		char name[17];
		snap_fman_data_name(w->id, name);
		unlinkat(j->datafd, name, 0);
	}
	files_uncharge(f, w->granted);
	free(w->path);
	free(w);
}

struct fwip *files_find_wip(struct fjob *j, uint64_t id, void *owner)
{
	for (struct fwip *w = j->wip; w; w = w->next)
		if (w->id == id && w->owner == owner)
			return w;
	return NULL;
}
