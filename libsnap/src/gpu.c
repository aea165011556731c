/* SPDX-License-Identifier: BSD-3-Clause */
/* Loading the device backend at run time; see gpu.h for why. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "snap/base.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const struct snap_gpu_ops *loaded;
static char why[400];

/* Where libsnap.so itself lies: the backend is installed beside it. */
static void beside_self(char *out, size_t cap)
{
	Dl_info di;
	out[0] = '\0';
	if (!dladdr((void *)&snap_gpu_load, &di) || !di.dli_fname)
		return;
	const char *slash = strrchr(di.dli_fname, '/');
	if (slash)
		snprintf(out, cap, "%.*s/%s", (int)(slash - di.dli_fname), di.dli_fname, SNAP_GPU_MODULE);
}

static void load(void)
{
	char beside[PATH_MAX];
	const char *env = getenv("SNAP_CUDA_MODULE");
	beside_self(beside, sizeof(beside));
	const char *cand[] = { env && *env ? env : NULL, beside[0] ? beside : NULL, SNAP_GPU_MODULE };
	void *h = NULL;
	const char *tried = SNAP_GPU_MODULE;
	for (size_t i = 0; i < sizeof(cand) / sizeof(*cand) && !h; i++) {
		if (!cand[i])
			continue;
		tried = cand[i];
		h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
		/* An explicit path that fails is the answer: do not look further. */
		if (!h && i == 0) {
			snprintf(why, sizeof(why), "SNAP_CUDA_MODULE=%s: %s", cand[i], dlerror());
			return;
		}
	}
	if (!h) {
		snprintf(why, sizeof(why), "the CUDA backend %s is not installed (this build has no GPU support, "
			 "or it was built without nvcc): %s", SNAP_GPU_MODULE, dlerror());
		return;
	}
	snap_gpu_entry_fn entry = (snap_gpu_entry_fn)dlsym(h, SNAP_GPU_SYMBOL);
	const struct snap_gpu_ops *ops = entry ? entry() : NULL;
	if (!ops || ops->abi != SNAP_GPU_ABI || ops->size < sizeof(*ops)) {
		snprintf(why, sizeof(why), "%s is not a libsnap CUDA backend of ABI %d", tried, SNAP_GPU_ABI);
		dlclose(h);
		return;
	}
	loaded = ops;   /* never unloaded: the CUDA runtime inside does not support it */
}

const struct snap_gpu_ops *snap_gpu_load(char *err, size_t errlen)
{
	pthread_once(&once, load);
	if (!loaded)
		snap_fmt(err, errlen, "%s", why);
	return loaded;
}
