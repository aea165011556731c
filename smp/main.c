/* snapsmp: the per-node snapshot management process. Usage in --help. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "internal.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: snapsmp [options]\n"
		"Serve a node store of snapshots to the trainers of this node.\n\n"
		"  --store DIR        store root (SNAP_STORE, default /dev/shm/libsnap)\n"
		"  --socket PATH      Unix socket (SNAP_SOCKET, default STORE/smp.sock)\n"
		"  --mem-limit SIZE   bytes of slots this daemon may hold (SNAP_MEM_LIMIT, default 1/4 of RAM)\n"
		"  --slots N          slots per rank, >= 2 (SNAP_SLOTS, default 2; 3 with --flush-dir, so\n"
		"                     a save never waits for the flush of the slot it would reuse)\n"
		"  --verify-commit    recompute every chunk CRC at commit (SNAP_VERIFY_COMMIT=1)\n"
		"  --flush-dir DIR    persist restorable steps to HDF5 under DIR (SNAP_FLUSH_DIR)\n"
		"  --flush-every F    flush every F-th new restorable step (SNAP_FLUSH_EVERY, 0 = off)\n"
		"  --flush-interval T flush the newest restorable step every T seconds (SNAP_FLUSH_INTERVAL)\n"
		"  --flush-keep N     persisted steps kept per job (SNAP_FLUSH_KEEP, default 2)\n"
		"  --flush-codec C    none or lz4 (SNAP_FLUSH_CODEC, default none)\n"
		"  --allow-older      restore from an older persisted step if the newest is damaged\n"
		"                     (SNAP_ALLOW_OLDER=1)\n"
		"  -q, --quiet        log nothing but fatal errors\n"
		"  -h, --help         this text\n\n"
		"SIGUSR1 is a preemption notice: flush the newest restorable step of every job\n"
		"now. SIGTERM or SIGINT flush the same (with a flush directory), then shut down\n"
		"cleanly; a second one stops at once. SIGKILL is safe too: the store is rescanned\n"
		"on the next start. Exit codes: 0 clean shutdown, 1 error, 2 usage.\n");
}

int main(int argc, char **argv)
{
	struct snap_config cfg;
	char err[768] = "";
	snap_config_init(&cfg);
	if (snap_config_from_env(&cfg, err, sizeof(err))) {
		fprintf(stderr, "snapsmp: %s\n", err);
		return 2;
	}
	static const struct option opts[] = {
		{ "store", required_argument, NULL, 's' },  { "socket", required_argument, NULL, 'k' },
		{ "mem-limit", required_argument, NULL, 'm' }, { "slots", required_argument, NULL, 'n' },
		{ "verify-commit", no_argument, NULL, 'v' }, { "quiet", no_argument, NULL, 'q' },
		{ "flush-dir", required_argument, NULL, 'F' }, { "flush-every", required_argument, NULL, 'E' },
		{ "flush-interval", required_argument, NULL, 'I' }, { "flush-keep", required_argument, NULL, 'K' },
		{ "flush-codec", required_argument, NULL, 'C' }, { "allow-older", no_argument, NULL, 'O' },
		{ "help", no_argument, NULL, 'h' },          { NULL, 0, NULL, 0 },
	};
	int quiet = 0, socket_set = 0, slots_set = getenv("SNAP_SLOTS") != NULL, o;
	while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			snprintf(cfg.store, sizeof(cfg.store), "%s", optarg);
			break;
		case 'k':
			snprintf(cfg.socket, sizeof(cfg.socket), "%s", optarg);
			socket_set = 1;
			break;
		case 'm':
			if (snap_parse_size(optarg, &cfg.mem_limit)) {
				fprintf(stderr, "snapsmp: --mem-limit %s: expected a size like 512M or 4G\n", optarg);
				return 2;
			}
			break;
		case 'n':
			cfg.slots = (unsigned)atoi(optarg);
			slots_set = 1;
			break;
		case 'v': cfg.verify_commit = 1; break;
		case 'F': snprintf(cfg.flush_dir, sizeof(cfg.flush_dir), "%s", optarg); break;
		case 'E': cfg.flush_every = (unsigned)atoi(optarg); break;
		case 'I': cfg.flush_interval = (unsigned)atoi(optarg); break;
		case 'K': cfg.flush_keep = (unsigned)atoi(optarg); break;
		case 'C':
			if (snap_flush_codec_parse(optarg, &cfg.flush_codec)) {
				fprintf(stderr, "snapsmp: --flush-codec %s: expected none or lz4\n", optarg);
				return 2;
			}
			break;
		case 'O': cfg.allow_older = 1; break;
		case 'q': quiet = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (!socket_set && !getenv("SNAP_SOCKET") &&
	    snprintf(cfg.socket, sizeof(cfg.socket), "%s/smp.sock", cfg.store) >= (int)sizeof(cfg.socket)) {
		fprintf(stderr, "snapsmp: --store path is too long for a socket path\n");
		return 2;
	}
	/* A flush pins the slots of the step it writes; a third slot lets the
	 * next saves go on meanwhile. */
	if (cfg.flush_dir[0] && !slots_set)
		cfg.slots = 3;
	if (snap_config_check(&cfg, err, sizeof(err))) {
		fprintf(stderr, "snapsmp: %s\n", err);
		return 2;
	}
	int rc = snap_smp_run(&cfg, quiet, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "snapsmp: %s (%s)\n", err, snap_strerror(rc));
		return 1;
	}
	return 0;
}
