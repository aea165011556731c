/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The store's record of damage beyond repair (snap/damage.h): a few lines,
 * rewritten whole by write + rename, so a crash leaves the old version or
 * the new one. It is bounded, and read with the same checks as any other
 * file of the store: each line carries its own CRC32C, and a line that does
 * not check out is skipped rather than believed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snap/base.h"
#include "snap/damage.h"
#include "snap/error.h"
#include "snap/store.h"

#define DAMAGE_FILE_MAX (1u << 20)   /* far above KEEP lines: anything bigger is not ours */

static void clean_copy(char *dst, size_t cap, const char *src)
{
	size_t i = 0;
	for (; src[i] && i + 1 < cap; i++)
		dst[i] = src[i] == '\t' || src[i] == '\n' || src[i] == '\r' ? ' ' : src[i];
	dst[i] = '\0';
}

/* The line's body (after the CRC and its tab), without the newline. */
static int body_of(const struct snap_damage *d, char *out, size_t cap)
{
	char job[sizeof(d->job)], what[sizeof(d->what)], why[sizeof(d->why)];
	clean_copy(job, sizeof(job), d->job);
	clean_copy(what, sizeof(what), d->what);
	clean_copy(why, sizeof(why), d->why);
	int n = snprintf(out, cap, "%" PRIu64 "\t%s\t%s\t%s", d->time_s, job[0] ? job : "-", what[0] ? what : "-",
			 why[0] ? why : "-");
	return n < 0 || (size_t)n >= cap ? -1 : n;
}

/* One line (NUL-terminated, no newline) into d: 1 if it checks out. */
static int parse_line(char *line, struct snap_damage *d)
{
	char *tab = strchr(line, '\t');
	if (!tab || tab - line != 8)
		return 0;
	char *end;
	unsigned long crc = strtoul(line, &end, 16);
	if (end != tab || snap_crc32c(tab + 1, strlen(tab + 1)) != (uint32_t)crc)
		return 0;
	char *f[4];
	f[0] = tab + 1;
	for (int i = 1; i < 4; i++) {
		if (!(f[i] = strchr(f[i - 1], '\t')))
			return 0;
		*f[i]++ = '\0';
	}
	memset(d, 0, sizeof(*d));
	d->time_s = strtoull(f[0], &end, 10);
	if (*end)
		return 0;
	snprintf(d->job, sizeof(d->job), "%s", f[1]);
	snprintf(d->what, sizeof(d->what), "%s", f[2]);
	snprintf(d->why, sizeof(d->why), "%s", f[3]);
	return 1;
}

int snap_damage_load(const char *root, struct snap_damage *out, int cap)
{
	char path[SNAP_FILE_MAX];
	if (cap <= 0 || snprintf(path, sizeof(path), "%s/%s", root, SNAP_DAMAGE_FILE) >= (int)sizeof(path))
		return 0;
	struct stat st;
	char why[64];
	int fd = snap_store_open_regular(path, O_RDONLY, &st, why, sizeof(why));
	if (fd < 0)
		return 0;
	char *buf = st.st_size > 0 && st.st_size <= DAMAGE_FILE_MAX ? malloc((size_t)st.st_size + 1) : NULL;
	ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
	close(fd);
	if (got <= 0) {
		free(buf);
		return 0;
	}
	buf[got] = '\0';
	int n = 0;
	for (char *line = buf, *nl; *line; line = nl + 1) {
		if (!(nl = strchr(line, '\n')))
			break;   /* a line without its end is not a whole record */
		*nl = '\0';
		struct snap_damage d;
		if (!parse_line(line, &d))
			continue;
		if (n == cap) {   /* keep the newest cap */
			memmove(out, out + 1, (size_t)(cap - 1) * sizeof(*out));
			n--;
		}
		out[n++] = d;
	}
	free(buf);
	return n;
}

int snap_damage_record(const char *root, const struct snap_damage *d, char *err, size_t errlen)
{
	struct snap_damage *all = calloc(SNAP_DAMAGE_KEEP, sizeof(*all));
	char path[SNAP_FILE_MAX], tmp[SNAP_FILE_MAX];
	if (!all) {
		snap_fmt(err, errlen, "out of memory");
		return SNAP_ENOMEM;
	}
	if (snprintf(path, sizeof(path), "%s/%s", root, SNAP_DAMAGE_FILE) >= (int)sizeof(path) ||
	    snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		free(all);
		snap_fmt(err, errlen, "store path too long");
		return SNAP_EINVAL;
	}
	int n = snap_damage_load(root, all, SNAP_DAMAGE_KEEP - 1);
	all[n++] = *d;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	int rc = fd < 0 ? SNAP_EIO : 0;
	FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (fd >= 0 && !fp) {
		close(fd);
		rc = SNAP_EIO;
	}
	for (int i = 0; fp && i < n; i++) {
		char body[sizeof(d->job) + sizeof(d->what) + sizeof(d->why) + 32];
		if (body_of(&all[i], body, sizeof(body)) < 0)
			continue;
		fprintf(fp, "%08" PRIx32 "\t%s\n", snap_crc32c(body, strlen(body)), body);
	}
	if (fp && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
		rc = SNAP_EIO;
	if (fp && fclose(fp) != 0)
		rc = SNAP_EIO;
	if (!rc && rename(tmp, path) != 0)
		rc = SNAP_EIO;
	if (rc) {
		snap_fmt(err, errlen, "cannot record the damage in %s: %s", path, strerror(errno));
		unlink(tmp);
	}
	free(all);
	return rc;
}

void snap_damage_line(const struct snap_damage *d, char *out, size_t cap)
{
	snprintf(out, cap, "job %s %s: %s", d->job, d->what, d->why);
}
