/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_proc.h - what the benchmarks need of other processes and files:
 * running a helper and reading its JSON line, and removing the private
 * stores they create.
 */
#ifndef SNAP_BENCH_PROC_H
#define SNAP_BENCH_PROC_H

#include <stddef.h>

/* Run argv (PATH searched), its stdout into buf (at most cap - 1 bytes,
 * NUL terminated; the rest is read and dropped). The exit status, or -1
 * when it could not run or did not exit. */
int bench_run_capture(char *const argv[], char *buf, size_t cap);

/* The number after "key": in one JSON line, or -1 when the key is absent. */
double bench_jnum(const char *json, const char *key);

/* rm -rf path (without following symlinks). 0, or -1 with errno set when
 * something could not be removed. */
int bench_rm_tree(const char *path);

#endif
