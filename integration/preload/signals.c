/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The job's ends, as the preload sees them:
 *
 *  - SIGTERM (a preemption notice from the scheduler): ask snapsmp to flush
 *    the job's captured files now, then die of the signal as before. The
 *    handler is installed only where the program left SIGTERM at its
 *    default, and only when files are captured; a program that installs its
 *    own handler later replaces it (then snapsmp's own SIGTERM/SIGUSR1 is
 *    the way). Everything in the handler is async-signal-safe: a new
 *    connection (socket, connect, write of two messages encoded at start,
 *    close), then the default disposition and raise().
 *  - MPI_Finalize (PMPI): the end of an MPI job; wait until snapsmp has
 *    flushed the job's captured files, then PMPI_Finalize. Rank and world
 *    size come from the launcher's variables (OMPI_COMM_WORLD_*, PMI_*,
 *    SLURM_*) as everywhere else: the preload needs no MPI_Init hook, and
 *    links no MPI (PMPI_Finalize is looked up when MPI_Finalize is called,
 *    which only an MPI program does).
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "preload.h"
#include "snap/wire.h"

static uint8_t term_msg[512];   /* FATTACH + FFLUSH(no wait), ready to write */
static size_t term_len;
static struct sockaddr_un term_addr;

static void on_term(int sig)
{
	int e = errno;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s >= 0 && connect(s, (struct sockaddr *)&term_addr, sizeof(term_addr)) == 0) {
		if (write(s, term_msg, term_len) == (ssize_t)term_len) {
			/* Wait for the FATTACH reply at most briefly, so the FFLUSH
			 * was read before our end closes the connection. */
			char b[64];
			struct timeval tv = { 0, 200000 };
			setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
			if (read(s, b, sizeof(b)) < 0) {
				/* nothing more to do in a handler */
			}
		}
	}
	if (s >= 0)
		close(s);
	signal(sig, SIG_DFL);
	errno = e;
	raise(sig);
}

static void put_msg(uint16_t type, const struct snap_wbuf *w)
{
	if (term_len + SNAP_WIRE_HDR + w->len > sizeof(term_msg))
		return;
	snap_wire_put_hdr(term_msg + term_len, type, 0, (uint32_t)w->len);
	memcpy(term_msg + term_len + SNAP_WIRE_HDR, w->p, w->len);
	term_len += SNAP_WIRE_HDR + w->len;
}

void pl_signals_init(void)
{
	if (!pl_cfg.enabled || strlen(pl_cfg.socket) >= sizeof(term_addr.sun_path))
		return;
	struct sigaction cur;
	if (sigaction(SIGTERM, NULL, &cur) != 0 || cur.sa_handler != SIG_DFL || (cur.sa_flags & SA_SIGINFO))
		return;
	term_addr.sun_family = AF_UNIX;
	strcpy(term_addr.sun_path, pl_cfg.socket);
	struct snap_wbuf a = { 0 }, f = { 0 };
	snap_put_str(&a, pl_cfg.job);
	snap_put_u32(&a, (uint32_t)getpid());
	snap_put_u8(&f, 0);
	if (!a.oom && !f.oom) {
		put_msg(SNAP_MSG_FATTACH, &a);
		put_msg(SNAP_MSG_FFLUSH, &f);
	}
	snap_wbuf_free(&a);
	snap_wbuf_free(&f);
	if (term_len == 0)
		return;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTERM, &sa, NULL);
}

/* MPI_Finalize through PMPI: flush first, so the job's end means its files are on disk. */
__attribute__((visibility("default"))) int MPI_Finalize(void)
{
	PL_INIT();
	if (pl_cfg.enabled && pl_connected()) {
		struct snap_wbuf w = { 0 };
		snap_put_u8(&w, 1);
		void *pl;
		uint32_t len;
		char msg[256];
		if (pl_rpc(SNAP_MSG_FFLUSH, &w, &pl, &len, msg, sizeof(msg)) == 0)
			free(pl);
		else
			pl_say("MPI_Finalize: the captured files could not be flushed: %s", msg);
		snap_wbuf_free(&w);
	}
	int (*pmpi)(void);
	void *sym = dlsym(RTLD_DEFAULT, "PMPI_Finalize");
	memcpy(&pmpi, &sym, sizeof(sym));
	return pmpi ? pmpi() : 0;
}
