/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The functions the preload stands in front of, found with dlsym(RTLD_NEXT),
 * and the one-time initialization. A hook may run before our constructor
 * (another library's constructor opening a file), so every hook calls
 * PL_INIT() first; the fast path is one acquire load.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preload.h"

struct pl_real pl_real;
atomic_int pl_ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* memcpy: a data pointer from dlsym into a function pointer, without type punning. */
static void sym(void *field, const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);
	memcpy(field, &p, sizeof(p));
}
#define SYM(field, name) sym(&pl_real.field, name)

static void atfork_prepare(void)
{
	pl_files_atfork_prepare();
	pl_conn_atfork_prepare();
}

static void atfork_parent(void)
{
	pl_conn_atfork_parent();
	pl_files_atfork_parent();
}

static void atfork_child(void)
{
	pl_conn_atfork_child();
	pl_files_atfork_child();
}

static void init_once(void)
{
	SYM(openat, "openat");
	SYM(open_2, "__open_2");
	SYM(openat_2, "__openat_2");
	SYM(fopen, "fopen");
	SYM(fopen64, "fopen64");
	SYM(fdopen, "fdopen");
	SYM(close, "close");
	SYM(fclose, "fclose");
	SYM(write, "write");
	SYM(pwrite, "pwrite");
	SYM(writev, "writev");
	SYM(pwritev, "pwritev");
	SYM(pwritev2, "pwritev2");
	SYM(fwrite, "fwrite");
	SYM(sendfile, "sendfile");
	SYM(copy_file_range, "copy_file_range");
	SYM(ftruncate, "ftruncate");
	SYM(truncate, "truncate");
	SYM(dup, "dup");
	SYM(dup2, "dup2");
	SYM(dup3, "dup3");
	SYM(fcntl, "fcntl");
	SYM(fstatat, "fstatat");
	SYM(statx, "statx");
	SYM(xstat, "__xstat");
	SYM(lxstat, "__lxstat");
	SYM(fxstatat, "__fxstatat");
	SYM(faccessat, "faccessat");
	SYM(renameat2, "renameat2");
	SYM(renameat, "renameat");
	SYM(unlinkat, "unlinkat");
	SYM(opendir, "opendir");
	SYM(fdopendir, "fdopendir");
	SYM(readdir64, "readdir64");
	SYM(closedir, "closedir");
	SYM(rewinddir, "rewinddir");
	SYM(getdents64, "getdents64");
	SYM(chdir, "chdir");
	SYM(fchdir, "fchdir");
	SYM(umask, "umask");
	pl_config_load();
	pl_signals_init();
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	atomic_store_explicit(&pl_ready, 1, memory_order_release);
}

void pl_init(void)
{
	pthread_once(&once, init_once);
}

__attribute__((constructor)) static void pl_constructor(void)
{
	pl_init();
}
