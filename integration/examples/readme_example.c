/* SPDX-License-Identifier: BSD-3-Clause */
/* The C example of README.md, complete: cc readme_example.c $(pkg-config --cflags --libs libsnap) */
#include <stdio.h>
#include <stdlib.h>

#include <snap/snap.h>

int main(void)
{
	enum { N = 1 << 20 };
	float *w = calloc(N, sizeof(*w));
	struct snap_config cfg;
	snap_ctx *ctx;
	char err[256];
	if (!w || snap_config_init(&cfg) || snap_config_from_env(&cfg, err, sizeof(err)))
		return fprintf(stderr, "config: %s\n", w ? err : "out of memory"), 1;
	if (snap_open(&cfg, &ctx))                      /* connects to the node's snapsmp */
		return fprintf(stderr, "%s\n", snap_errmsg(ctx)), 1;

	struct snap_region r = { .name = "model.weight", .ptr = w, .bytes = N * sizeof(*w),
				 .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM,
				 .ndim = 1, .shape = { N }, .global_shape = { N } };
	if (snap_register(ctx, &r))                     /* every region, once */
		return fprintf(stderr, "%s\n", snap_errmsg(ctx)), 1;
	uint64_t step = 0;                              /* the newest step every rank committed */
	int rc = snap_restore(ctx, SNAP_STEP_LATEST, &step);
	if (rc && rc != SNAP_ENOENT)                    /* SNAP_ENOENT: nothing saved yet */
		return fprintf(stderr, "%s\n", snap_errmsg(ctx)), 1;
	printf("starting after step %llu\n", (unsigned long long)step);

	for (uint64_t s = step + 1; s <= step + 100; s++) {
		if (snap_fence(ctx))                    /* the last snapshot has read w */
			break;
		for (size_t i = 0; i < N; i++)          /* the "optimizer step": writes w */
			w[i] += 1.0f;
		if (snap_save(ctx, s))                  /* returns at once; copied behind */
			break;
		/* forward/backward here: they only read w */
	}
	rc = snap_wait(ctx);                            /* the last save is committed */
	if (rc)
		fprintf(stderr, "%s\n", snap_errmsg(ctx));
	snap_close(ctx);
	free(w);
	return rc ? 1 : 0;
}
