/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files, daemon side: the requests of preloaded processes, create,
 * grow, commit, rename, unlink and flush, and their dispatch.
 */
#include "files/files_int.h"

/*
 * Make room for `bytes` more in the budget, evicting flushed files (oldest
 * first): their real copies are verified, and readers fall back to them.
 */
static int reserve(struct snap_files *f, uint64_t bytes)
{
	struct snap_store *s = f->store;
	while (s->mem_used + bytes > s->mem_limit) {
		struct fent *victim = NULL;
		for (struct fjob *j = f->jobs; j; j = j->next)
			for (struct fent *e = j->head; e; e = e->next)
				if (e->state == F_CLEAN && (!victim || e->mtime_ns < victim->mtime_ns)) {
					victim = e;
					break;
				}
		if (!victim)
			return SNAP_ENOSPC;
		snap_store_logf(s, "evicting captured file %s (%" PRIu64 " bytes) from the store: it is flushed",
				victim->path, victim->size);
		files_remove_entry(f, victim->job, victim, 1);
	}
	s->mem_used += bytes;
	return 0;
}

static int on_create(struct snap_files *f, struct fjob *j, struct conn *c, struct snap_rbuf *r,
		     struct snap_wbuf *out, char *err, size_t errlen)
{
	char path[FILES_PATH_MAX];
	snap_get_str(r, path, sizeof(path));
	uint32_t mode = snap_get_u32(r);
	uint8_t excl = snap_get_u8(r);
	if (r->bad || snap_rbuf_left(r) || mode > 07777 || excl > 1) {
		snap_fmt(err, errlen, "malformed FCREATE");
		return SNAP_EPROTO;
	}
	uint32_t e = 0;
	struct stat st;
	if (!files_path_ok(f, path)) {
		e = EINVAL;
	} else if (excl) {
		int taken = files_lookup(j, path) != NULL || lstat(path, &st) == 0;
		for (struct fwip *w = j->wip; w && !taken; w = w->next)
			taken = strcmp(w->path, path) == 0;
		if (taken)
			e = EEXIST;
	}
	uint64_t id = 0;
	if (!e) {
		char name[17];
		int fd = -1;
		for (int tries = 0; fd < 0 && tries < 64; tries++) {
			id = ++f->last_id;
			snap_fman_data_name(id, name);
			fd = openat(j->datafd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
			if (fd < 0 && errno != EEXIST)
				break;
		}
		if (fd < 0) {
			snap_fmt(err, errlen, "cannot create a data file in %s/data: %s", j->dir, strerror(errno));
			return errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO;
		}
		close(fd);
		struct fwip *w = calloc(1, sizeof(*w));
		if (!w || !(w->path = strdup(path))) {
			free(w);
			unlinkat(j->datafd, name, 0);
			return SNAP_ENOMEM;
		}
		w->id = id;
		w->mode = mode;
		w->owner = c;
		w->next = j->wip;
		j->wip = w;
	}
	snap_put_u32(out, e);
	snap_put_u64(out, id);
	return 0;
}

static int on_grow(struct snap_files *f, struct fjob *j, struct conn *c, struct snap_rbuf *r, char *err,
		   size_t errlen)
{
	uint64_t id = snap_get_u64(r), bytes = snap_get_u64(r);
	struct fwip *w = files_find_wip(j, id, c);
	if (r->bad || snap_rbuf_left(r) || !w) {
		snap_fmt(err, errlen, "malformed FGROW, or file %016" PRIx64 " is not being written on this connection", id);
		return SNAP_EPROTO;
	}
	if (bytes <= w->granted)
		return 0;
	if (reserve(f, bytes - w->granted)) {
		snap_fmt(err, errlen, "the node store is full: %s needs %" PRIu64 " bytes, SNAP_MEM_LIMIT=%" PRIu64
			 " with %" PRIu64 " in use and no flushed file left to evict", w->path, bytes, f->store->mem_limit,
			 f->store->mem_used);
		return SNAP_ENOSPC;
	}
	w->granted = bytes;
	return 0;
}

static int on_commit(struct snap_files *f, struct fjob *j, struct conn *c, struct snap_rbuf *r, char *err,
		     size_t errlen)
{
	uint64_t id = snap_get_u64(r), size = snap_get_u64(r);
	uint32_t chunk = snap_get_u32(r), n = snap_get_u32(r);
	struct fwip *w = files_find_wip(j, id, c);
	size_t left = snap_rbuf_left(r);
	/* An optional trailer: what the program set itself (u32 flags: 1 mode, 2 mtime; u32 mode; u64 mtime_ns). */
	int trailer = left == (size_t)n * 4 + 16;
	if (r->bad || !w || chunk < 4096 || chunk > (1u << 31) || n != snap_fman_nchunks(size, chunk) ||
	    (left != (size_t)n * 4 && !trailer)) {
		snap_fmt(err, errlen, "malformed FCOMMIT (file %016" PRIx64 ", %" PRIu64 " bytes, chunk %u, %u CRCs)", id,
			 size, chunk, n);
		return SNAP_EPROTO;
	}
	struct fent *e = calloc(1, sizeof(*e));
	if (!e || !(e->man.crc = malloc(sizeof(uint32_t) * (n ? n : 1))) || !(e->path = strdup(w->path))) {
		if (e)
			free(e->man.crc);
		free(e);
		return SNAP_ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		e->man.crc[i] = snap_get_u32(r);
	e->man.id = e->id = id;
	e->man.size = e->size = size;
	e->man.mtime_ns = e->mtime_ns = files_wall_ns();
	e->man.mode = w->mode;
	if (trailer) {
		uint32_t set = snap_get_u32(r), mode = snap_get_u32(r);
		uint64_t mtime = snap_get_u64(r);
		if ((set & 1) && mode <= 07777)
			e->man.mode = mode;
		if (set & 2)
			e->man.mtime_ns = mtime;
	}
	e->man.chunk = chunk;
	e->man.nchunks = n;
	e->job = j;
	char name[17], tmp[32];
	snap_fman_data_name(id, name);
	snprintf(tmp, sizeof(tmp), "%s.man", name);
	int rc = 0, fd = openat(j->datafd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != size) {
		snap_fmt(err, errlen, "commit of %s: its data holds %" PRIu64 " bytes, the commit says %" PRIu64, w->path,
			 fd >= 0 ? (uint64_t)st.st_size : 0, size);
		rc = SNAP_ECORRUPT;
	} else if (f->cfg->verify_commit && size) {
		const uint8_t *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		int64_t bad = p == MAP_FAILED ? 0 : snap_fman_verify(&e->man, p);
		if (bad >= 0) {
			snap_fmt(err, errlen, "commit of %s: chunk %" PRId64 " does not match the CRC the writer sent",
				 w->path, bad);
			rc = SNAP_ECORRUPT;
		}
		if (p != MAP_FAILED)
			munmap((void *)p, size);
	}
	if (fd >= 0 && !rc) {
		/* fstat on a reader's descriptor (the data file itself) then says
		 * what stat says: the mode (snapsmp keeps read and write) and mtime. */
		struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
					  { .tv_sec = (time_t)(e->man.mtime_ns / 1000000000ull),
					    .tv_nsec = (long)(e->man.mtime_ns % 1000000000ull) } };
		if (fchmod(fd, (e->man.mode | 0600) & 07777) != 0 || futimens(fd, ts) != 0) {
			/* cosmetic: the manifest holds the truth */
		}
	}
	if (fd >= 0)
		close(fd);
	e->charge = rc ? 0 : (uint64_t)st.st_blocks * 512;
	struct snap_wbuf mw = { 0 };
	if (!rc && snap_fman_encode(&e->man, &mw))
		rc = SNAP_ENOMEM;
	if (!rc) {
		int mfd = openat(j->tmpfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		int ok = mfd >= 0 && files_write_all(mfd, mw.p, mw.len) == 0;
		if (mfd >= 0 && close(mfd) != 0)
			ok = 0;
		/* A preloaded process may prune an empty directory of the namespace
		 * between our mkdir and rename (rmdir): try again. */
		for (int tries = 0; ok && tries < 3; tries++) {
			if (files_mkparents(j->nsfd, e->path + 1) != 0) {
				ok = 0;
				break;
			}
			if (renameat(j->tmpfd, tmp, j->nsfd, e->path + 1) == 0)
				break;
			if (errno == ENOENT)
				continue;
			/* An empty directory of the namespace where the file goes now. */
			ok = (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) &&
			     unlinkat(j->nsfd, e->path + 1, AT_REMOVEDIR) == 0 &&
			     renameat(j->tmpfd, tmp, j->nsfd, e->path + 1) == 0;
			break;
		}
		if (!ok) {
			snap_fmt(err, errlen, "cannot publish the manifest of %s in %s/ns: %s", e->path, j->dir,
				 strerror(errno));
			rc = errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO;
			unlinkat(j->tmpfd, tmp, 0);
		}
	}
	snap_wbuf_free(&mw);
	if (rc) {
		files_drop_wip(f, j, w, 1);
		files_free_entry(e);
		return rc;
	}
	struct fent *old = files_lookup(j, e->path);
	if (old)
		files_remove_entry(f, j, old, 0);   /* its manifest was just replaced */
	files_uncharge(f, w->granted);
	w->granted = 0;
	files_drop_wip(f, j, w, 0);
	f->store->mem_used += e->charge;
	e->state = F_DIRTY;
	files_hash_insert(j, e);
	files_order_append(j, e);
	pthread_cond_signal(&f->cv);
	return 0;
}

static int real_isdir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Does the namespace hold a committed file under directory rel? */
static int ns_has_files(int at, const char *rel, int depth)
{
	int fd = openat(at, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	int found = 0;
	struct dirent *de;
	while (!found && (de = readdir(d))) {
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		found = S_ISDIR(st.st_mode) ? depth < FILES_SCAN_DEPTH && ns_has_files(dirfd(d), de->d_name, depth + 1)
					    : 1;
	}
	closedir(d);
	return found;
}

/* A real directory was renamed from -> to: its store files follow (one rename of the namespace subtree). */
static void move_subtree(struct snap_files *f, struct fjob *j, const char *from, const char *to)
{
	struct stat st;
	if (fstatat(j->nsfd, from + 1, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
		return;
	unlinkat(j->nsfd, to + 1, AT_REMOVEDIR);   /* an empty leftover; a full one made us refuse */
	if (files_mkparents(j->nsfd, to + 1) != 0 || renameat(j->nsfd, from + 1, j->nsfd, to + 1) != 0) {
		snap_store_logf(f->store, "captured files of job %s: cannot move the store's copy of %s to %s: %s", j->name,
				from, to, strerror(errno));
		return;
	}
	size_t fl = strlen(from), tl = strlen(to);
	struct fent *moved = NULL;
	for (unsigned h = 0; h < FILES_HBUCKETS; h++)
		for (struct fent **pp = &j->hash[h]; *pp;) {
			struct fent *e = *pp;
			if (strncmp(e->path, from, fl) || e->path[fl] != '/') {
				pp = &e->hnext;
				continue;
			}
			*pp = e->hnext;   /* rehashed below, under its new name */
			char *np = malloc(tl + strlen(e->path + fl) + 1);
			if (np) {
				memcpy(np, to, tl);
				strcpy(np + tl, e->path + fl);
				free(e->path);
				e->path = np;
			}
			e->tries = e->failed = 0;
			e->hnext = moved;
			moved = e;
		}
	while (moved) {
		struct fent *e = moved;
		moved = e->hnext;
		files_hash_insert(j, e);
	}
	for (struct fwip *w = j->wip; w; w = w->next) {
		if (strncmp(w->path, from, fl) || w->path[fl] != '/')
			continue;
		char *np = malloc(tl + strlen(w->path + fl) + 1);
		if (np) {
			memcpy(np, to, tl);
			strcpy(np + tl, w->path + fl);
			free(w->path);
			w->path = np;
		}
	}
	pthread_cond_signal(&f->cv);
}

static uint32_t do_rename(struct snap_files *f, struct fjob *j, struct conn *c, const char *from, const char *to,
			  int wip)
{
	if (!files_path_ok(f, from) || !files_path_ok(f, to))
		return EINVAL;
	if (strcmp(from, to) == 0)
		return 0;
	struct fent *e = files_lookup(j, from), *t = files_lookup(j, to);
	char dir[FILES_PATH_MAX];
	const char *base;
	files_split_path(to, dir, sizeof(dir), &base);
	if (wip) {
		/* A file this connection is writing: it will be committed under the new name. */
		struct fwip *w = NULL;
		for (struct fwip *x = j->wip; x && !w; x = x->next)
			if (x->owner == c && strcmp(x->path, from) == 0)
				w = x;
		if (!w)
			return ENOENT;
		if (!real_isdir(dir))
			return ENOENT;
		char *p = strdup(to);
		if (!p)
			return ENOMEM;
		free(w->path);
		w->path = p;
		if (e)
			files_remove_entry(f, j, e, 1);   /* the name now belongs to the open file */
		if (unlink(from) != 0 && errno != ENOENT && errno != EISDIR) {
			/* a stale real copy we cannot remove resurfaces later: say so */
			snap_store_logf(f->store, "cannot remove %s after its rename: %s", from, strerror(errno));
		}
		return 0;
	}
	if (!e) {
		/* Only the real file or directory: rename it; a store file at `to`
		 * is replaced by it, and a directory takes its store files along. */
		struct stat st;
		int isdir = lstat(from, &st) == 0 && S_ISDIR(st.st_mode);
		if (isdir && ns_has_files(j->nsfd, to + 1, 0))
			return ENOTEMPTY;   /* the real `to` may look empty; its store files count */
		/* The store's `to` steps aside first: were we to die between the two
		 * renames, the older store copy must not shadow the file that
		 * replaced it (tmp/ is emptied at start, so aside = removed). */
		char aside[32];
		snprintf(aside, sizeof(aside), "%016" PRIx64 ".old", t ? t->id : 0);
		if (t && renameat(j->nsfd, to + 1, j->tmpfd, aside) != 0)
			return (uint32_t)errno;
		if (rename(from, to) != 0) {
			int er = errno;
			if (t)
				renameat(j->tmpfd, aside, j->nsfd, to + 1);
			return (uint32_t)er;
		}
		if (t) {
			unlinkat(j->tmpfd, aside, 0);
			files_remove_entry(f, j, t, 0);
		}
		if (isdir)
			move_subtree(f, j, from, to);
		return 0;
	}
	if (!real_isdir(dir))
		return ENOENT;
	if (real_isdir(to))
		return EISDIR;
	if (files_mkparents(j->nsfd, to + 1) != 0)
		return (uint32_t)errno;
	if (renameat(j->nsfd, from + 1, j->nsfd, to + 1) != 0) {
		int ok = (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) &&
			 unlinkat(j->nsfd, to + 1, AT_REMOVEDIR) == 0 && renameat(j->nsfd, from + 1, j->nsfd, to + 1) == 0;
		if (!ok)
			return (uint32_t)errno;
	}
	if (t && t != e)
		files_remove_entry(f, j, t, 0);   /* replaced by the rename */
	/* The real side follows: a flushed copy moves with it; an older real
	 * file at `from` must not resurface once the store copy is gone. */
	if (e->state == F_CLEAN) {
		if (rename(from, to) != 0) {
			e->state = F_DIRTY;
			e->failed = 0;
			unlink(from);
		}
	} else if (unlink(from) != 0 && errno != ENOENT) {
		snap_store_logf(f->store, "cannot remove the older %s after its rename: %s", from, strerror(errno));
	}
	char *p = strdup(to);
	if (!p)
		return ENOMEM;
	files_hash_remove(j, e);
	free(e->path);
	e->path = p;
	files_hash_insert(j, e);
	pthread_cond_signal(&f->cv);
	return 0;
}

static uint32_t do_unlink(struct snap_files *f, struct fjob *j, const char *path, int store_only)
{
	if (!files_path_ok(f, path))
		return EINVAL;
	struct fent *e = files_lookup(j, path);
	if (e)
		files_remove_entry(f, j, e, 1);
	if (store_only)
		return 0;
	if (unlink(path) != 0 && !(e && errno == ENOENT))
		return (uint32_t)errno;
	return 0;
}

int snap_files_dispatch(struct smp *m, struct conn *c, uint16_t type, struct snap_rbuf *r, struct snap_wbuf *out,
			char *err, size_t errlen, int *deferred)
{
	struct snap_files *f = m->files;
	if (!f) {
		snap_fmt(err, errlen, "this snapsmp does not serve captured files");
		return SNAP_EUNSUPPORTED;
	}
	int rc = 0;
	pthread_mutex_lock(&f->mu);
	struct fjob *j = c->fjob;
	if (type == SNAP_MSG_FATTACH) {
		char job[SNAP_JOB_MAX + 1];
		snap_get_str(r, job, sizeof(job));
		uint32_t pid = snap_get_u32(r);
		if (r->bad || snap_rbuf_left(r) || !snap_job_name_ok(job) || j) {
			snap_fmt(err, errlen, "malformed FATTACH (job name invalid, or sent twice)");
			rc = SNAP_EPROTO;
		} else if (!(j = files_find_job(f, job, 1))) {
			snap_fmt(err, errlen, "cannot create the captured-file store of job %s under %s: %s", job,
				 f->store->root, strerror(errno));
			rc = SNAP_EIO;
		} else {
			c->fjob = j;
			c->pid = pid;
			snap_put_u64(out, f->store->mem_limit);
			snap_put_u64(out, f->store->mem_used);
		}
		goto out;
	}
	if (!j) {
		snap_fmt(err, errlen, "send FATTACH first");
		rc = SNAP_EPROTO;
		goto out;
	}
	switch (type) {
	case SNAP_MSG_FCREATE: rc = on_create(f, j, c, r, out, err, errlen); break;
	case SNAP_MSG_FGROW: rc = on_grow(f, j, c, r, err, errlen); break;
	case SNAP_MSG_FCOMMIT:
		if (!(rc = on_commit(f, j, c, r, err, errlen)))
			files_ns_changed(f, j);
		break;
	case SNAP_MSG_FABORT: {
		uint64_t id = snap_get_u64(r);
		struct fwip *w = files_find_wip(j, id, c);
		if (r->bad || snap_rbuf_left(r) || !w) {
			snap_fmt(err, errlen, "malformed FABORT");
			rc = SNAP_EPROTO;
		} else {
			files_drop_wip(f, j, w, 1);
		}
		break;
	}
	case SNAP_MSG_FRENAME: {
		char from[FILES_PATH_MAX], to[FILES_PATH_MAX];
		snap_get_str(r, from, sizeof(from));
		snap_get_str(r, to, sizeof(to));
		uint8_t wip = snap_get_u8(r);
		if (r->bad || snap_rbuf_left(r) || wip > 1) {
			snap_fmt(err, errlen, "malformed FRENAME");
			rc = SNAP_EPROTO;
		} else {
			snap_put_u32(out, do_rename(f, j, c, from, to, wip));
			files_ns_changed(f, j);
		}
		break;
	}
	case SNAP_MSG_FUNLINK: {
		char path[FILES_PATH_MAX];
		snap_get_str(r, path, sizeof(path));
		uint8_t store_only = snap_get_u8(r);
		if (r->bad || snap_rbuf_left(r) || store_only > 1) {
			snap_fmt(err, errlen, "malformed FUNLINK");
			rc = SNAP_EPROTO;
		} else {
			snap_put_u32(out, do_unlink(f, j, path, store_only));
		}
		break;
	}
	case SNAP_MSG_FFLUSH: {
		uint8_t wait = snap_get_u8(r);
		struct conn_wait *w = NULL;
		if (r->bad || snap_rbuf_left(r) || wait > 1) {
			snap_fmt(err, errlen, "malformed FFLUSH");
			rc = SNAP_EPROTO;
		} else if (wait && !(w = calloc(1, sizeof(*w)))) {
			rc = SNAP_ENOMEM;
		} else {
			files_urge(j);
			pthread_cond_signal(&f->cv);
			if (w) {
				w->c = c;
				w->j = j;
				w->next = f->waiters;
				f->waiters = w;
				*deferred = 1;
			} else {
				snap_put_u64(out, (uint64_t)files_pending(f, j));
				snap_put_u64(out, 0);
			}
		}
		break;
	}
	default:
		snap_fmt(err, errlen, "unknown message type %u", type);
		rc = SNAP_EPROTO;
	}
out:
	pthread_mutex_unlock(&f->mu);
	return rc;
}
