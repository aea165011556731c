/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_util.h - what the benchmark programs share: a monotonic clock, the
 * cores they may use,
 * the median of a run's samples, finding the snapsmp (or another program)
 * they start, reading an --input file of f32 values, and the Python they
 * run the alternatives with.
 */
#ifndef SNAP_BENCH_UTIL_H
#define SNAP_BENCH_UTIL_H

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Monotonic seconds. */
static inline double bench_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Cores this process may run on (what ranks started from here share). */
static inline double bench_cores(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		return (double)CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (double)n : 1;
}

/* The best ratio to `limit_gbps` that work costing cpu_s_per_gb CPU
 * seconds per GB can reach on `cores` cores: where simulated nodes share
 * the host and MPI's link is a kernel memcpy on the same cores, no run
 * beats cores / CPU per GB (snapbench ec and mesh print it as the
 * "ceiling"). */
static inline double bench_cpu_ceiling(double cores, double cpu_s_per_gb, double limit_gbps)
{
	return cores / cpu_s_per_gb / limit_gbps;
}

static inline int bench_cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Sorts v. */
static inline double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), bench_cmp_dbl);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * $env_var if set, else the first of the patterns (each "%s/..." relative to
 * this executable's directory) that is executable, else `name` for PATH.
 */
static inline void bench_find_prog(char *out, size_t cap, const char *env_var, const char *name,
				   const char *const *patterns, int npatterns)
{
	const char *env = env_var ? getenv(env_var) : NULL;
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (env && *env) {
		snprintf(out, cap, "%s", env);
		return;
	}
	if (n > 0) {
		self[n] = '\0';
		char *slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			for (int i = 0; i < npatterns; i++) {
				int k = snprintf(out, cap, patterns[i], self);
				if (k > 0 && (size_t)k < cap && access(out, X_OK) == 0)
					return;
			}
		}
	}
	snprintf(out, cap, "%s", name);
}

/* A file of raw f32 values (at least one), malloc'd, *n of them; NULL when
 * it cannot be read (the caller says so). */
static inline float *bench_read_f32(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	float *v = NULL;
	if (!f || fstat(fileno(f), &st) != 0 || st.st_size < 4 || !(v = malloc((size_t)st.st_size)) ||
	    fread(v, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		if (f)
			fclose(f);
		free(v);
		return NULL;
	}
	fclose(f);
	*n = (size_t)st.st_size / 4;
	return v;
}

/*
 * The Python interpreter that has torch/numpy/h5py, for the figures of what
 * users would do instead: CMake's SNAP_PYTHON, else python3 on PATH.
 */
#ifdef SNAP_BENCH_PYTHON
#define BENCH_PYTHON SNAP_BENCH_PYTHON
#else
#define BENCH_PYTHON "python3"
#endif

#endif
