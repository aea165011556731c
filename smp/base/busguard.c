/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A mapping of a file that is truncated behind the daemon's back (a damaged
 * store, a slot or parity file cut by hand) raises SIGBUS on the lost pages.
 * The readers that touch such mappings on purpose (the scrub's CRC,
 * heal/heal.c and heal/scrub.c; the mesh's warm-up, mesh/meshwarm.c) run
 * under this guard: on their thread, while the guard is set, SIGBUS jumps
 * back and the read counts as failed. Any other SIGBUS gets the action that
 * was there before (the default: the daemon dies, as it would without it).
 */
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>

#include "base/busguard.h"

static _Thread_local sigjmp_buf *guard;
static struct sigaction before;
static volatile sig_atomic_t installed;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)si;
	(void)uc;
	if (guard)
		siglongjmp(*guard, 1);
	sigaction(sig, &before, NULL);   /* the faulting access runs again under it */
}

void smp_bus_guard_init(void)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO };
	sigemptyset(&sa.sa_mask);
	if (!installed && sigaction(SIGBUS, &sa, &before) == 0)
		installed = 1;
}

int smp_bus_guarded(void (*fn)(void *), void *arg)
{
	if (!installed)
		return -2;
	sigjmp_buf jb;
	volatile int faulted = 0;
	guard = &jb;
	if (sigsetjmp(jb, 1) == 0)
		fn(arg);
	else
		faulted = 1;
	guard = NULL;
	return faulted ? -1 : 0;
}
