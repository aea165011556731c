/* SPDX-License-Identifier: BSD-3-Clause */
/* snapsmp: the per-node snapshot management process. Usage in --help. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "snap/smp_config.h"
#include "daemon.h"
#include "base/log.h"
#include "snap/proto.h"
#include "mesh/mesh.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: snapsmp [options]\n"
		"Serve a node store of snapshots to the trainers of this node.\n\n"
		"  --store DIR        store root (SNAP_STORE, default /dev/shm/libsnap)\n"
		"  --socket PATH      Unix socket (SNAP_SOCKET, default STORE/smp.sock)\n"
		"  --mem-limit SIZE   bytes of slots this daemon may hold (SNAP_MEM_LIMIT, default 1/4 of RAM)\n"
		"  --slots N          slots per rank, >= 2 (SNAP_SLOTS, default 2; 3 with --flush-dir or\n"
		"                     --ec, so a save never waits for a flush or encode of the slot it reuses)\n"
		"  --verify-commit    recompute every chunk CRC at commit (SNAP_VERIFY_COMMIT=1)\n"
		"  --flush-dir DIR    persist restorable steps to HDF5 under DIR (SNAP_FLUSH_DIR)\n"
		"  --flush-every F    flush every F-th new restorable step (SNAP_FLUSH_EVERY, 0 = off)\n"
		"  --flush-interval T flush the newest restorable step every T seconds (SNAP_FLUSH_INTERVAL)\n"
		"  --flush-keep N     persisted steps kept per job (SNAP_FLUSH_KEEP, default 2)\n"
		"  --flush-codec C    none or lz4 (SNAP_FLUSH_CODEC, default none)\n"
		"  --flush-mode MODE  octal permission bits of flushed files (SNAP_FLUSH_MODE, default 0600;\n"
		"                     directories get x where r is set), whatever the umask\n"
		"  --flush-files 0|1  copy captured files (LD_PRELOAD) to their real paths right after each\n"
		"                     commit (1, the default) or only on SIGUSR1/SIGTERM/request (SNAP_FLUSH_FILES)\n"
		"  --flush-direct 0|1 write flushed data and codec frames with O_DIRECT (1, the default: none of\n"
		"                     it stays in the page cache) or through the page cache (SNAP_FLUSH_DIRECT)\n"
		"  --allow-older      restore from an older persisted step if the newest is damaged\n"
		"                     (SNAP_ALLOW_OLDER=1)\n"
		"  --scrub-rate SIZE  bytes per second the background scrub verifies of the committed slots,\n"
		"                     repairing bad chunks from the flush (SNAP_SCRUB_RATE, default 16M; 0 = off)\n"
		"  --ec K+M           run as one node of an MPI mesh (mpirun -np NODES snapsmp --ec 4+2 ...):\n"
		"                     erasure-code every globally complete step across groups of K+M nodes,\n"
		"                     rebuild lost nodes' stores at start (SNAP_EC). \"%%n\" in --store and\n"
		"                     --socket is replaced by the mesh rank (several nodes on one machine).\n"
		"                     With --flush-dir the nodes persist protected steps together\n"
		"                     (--flush-every counts protected steps): into one directory every node\n"
		"                     reaches, node 0 sealing a step once every node wrote its ranks' files;\n"
		"                     or with \"%%n\" in it (D/node%%n) each node into its own, sealing its part\n"
		"                     there. A step is persisted once the parts cover every rank; readers\n"
		"                     (snaptool, restore from disk) take the pattern and need every node's\n"
		"                     directory reachable (a parallel file system, or one machine)\n"
		"  --log-level L      error, warn, info or debug (SNAP_LOG_LEVEL, default info): error = fatal\n"
		"                     errors only, warn = also what was refused, lost or damaged, info = also\n"
		"                     each state change (connections, steps flushed, persisted, protected,\n"
		"                     verified), debug = also the effective settings at start\n"
		"  --log DEST         where the log goes (SNAP_LOG): stderr (the default), syslog (facility\n"
		"                     daemon), or a file appended to (\"%%n\" = mesh rank with --ec). Each line:\n"
		"                     UTC time, level, snapsmp[pid]: message (syslog: its own time and pid)\n"
		"  --metrics-file P   keep the daemon's state in Prometheus' text format in file P, for\n"
		"                     node_exporter's textfile collector (SNAP_METRICS_FILE; \"%%n\" = mesh rank\n"
		"                     with --ec): steps, their ages, bytes, durations, failures (docs/deploy.md,\n"
		"                     \"Metrics\"); rewritten atomically, removed at a clean shutdown\n"
		"  --metrics-interval S  seconds between rewrites of the metrics file (SNAP_METRICS_INTERVAL,\n"
		"                     default 10)\n"
		"  --detach           run in the background, in a session of its own, once serving: the command\n"
		"                     returns 0 when clients can connect, 3 when another snapsmp holds the store\n"
		"                     (it serves it), 1 or 2 if this one failed to start. The log defaults to\n"
		"                     STORE/snapsmp.log. What libsnap runs when no snapsmp answers (SNAP_AUTOSTART)\n"
		"  -q, --quiet        --log-level warn\n"
		"  -h, --help         this text\n\n"
		"SIGUSR1 is a preemption notice: flush the newest restorable (in a mesh: protected) step of every job\n"
		"and every captured file not yet on disk now. SIGTERM or SIGINT flush the same\n"
		"(steps with a flush directory; captured files always), then shut down\n"
		"cleanly; a second one stops at once. SIGKILL is safe too: the store is rescanned\n"
		"on the next start. Exit codes: 0 clean shutdown, 1 error, 2 usage, 3 the store is in use by\n"
		"another snapsmp.\n");
}

/* What the command line says besides the config. */
struct flags {
	int quiet, socket_set, slots_set, detach;
	const char *ec;   /* --ec / SNAP_EC: K+M, NULL without a mesh */
};

/* Flags over the SNAP_* settings already in cfg. -1 to go on, else the exit code. */
/* A 0|1 flag's value into *out; -1 (said on stderr) for anything else. */
static int flag01(const char *flag, const char *arg, int *out)
{
	if (strcmp(arg, "0") && strcmp(arg, "1")) {
		fprintf(stderr, "snapsmp: %s %s: expected 0 or 1\n", flag, arg);
		return -1;
	}
	*out = arg[0] == '1';
	return 0;
}

static int parse_flags(int argc, char **argv, struct snap_smp_config *cfg, struct flags *f)
{
	static const struct option opts[] = {
		{ "store", required_argument, NULL, 's' },  { "socket", required_argument, NULL, 'k' },
		{ "mem-limit", required_argument, NULL, 'm' }, { "slots", required_argument, NULL, 'n' },
		{ "verify-commit", no_argument, NULL, 'v' }, { "quiet", no_argument, NULL, 'q' },
		{ "flush-dir", required_argument, NULL, 'F' }, { "flush-every", required_argument, NULL, 'E' },
		{ "flush-interval", required_argument, NULL, 'I' }, { "flush-keep", required_argument, NULL, 'K' },
		{ "flush-codec", required_argument, NULL, 'C' }, { "allow-older", no_argument, NULL, 'O' },
		{ "help", no_argument, NULL, 'h' },          { "ec", required_argument, NULL, 'e' },
		{ "flush-mode", required_argument, NULL, 'M' }, { "flush-files", required_argument, NULL, 'L' },
		{ "flush-direct", required_argument, NULL, 'D' }, { "scrub-rate", required_argument, NULL, 'S' },
		{ "log-level", required_argument, NULL, 'g' }, { "log", required_argument, NULL, 'G' },
		{ "metrics-file", required_argument, NULL, 'P' }, { "metrics-interval", required_argument, NULL, 'T' },
		{ "detach", no_argument, NULL, 'X' },
		{ NULL, 0, NULL, 0 },
	};
	int o;
	*f = (struct flags){ .slots_set = getenv("SNAP_SLOTS") != NULL, .ec = getenv("SNAP_EC") };
	if (f->ec && !*f->ec)
		f->ec = NULL;
	while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			snprintf(cfg->client.store, sizeof(cfg->client.store), "%s", optarg);
			break;
		case 'k':
			snprintf(cfg->client.socket, sizeof(cfg->client.socket), "%s", optarg);
			f->socket_set = 1;
			break;
		case 'm':
			if (snap_parse_size(optarg, &cfg->mem_limit)) {
				fprintf(stderr, "snapsmp: --mem-limit %s: expected a size like 512M or 4G\n", optarg);
				return 2;
			}
			break;
		case 'n':
			cfg->slots = (unsigned)atoi(optarg);
			f->slots_set = 1;
			break;
		case 'S':
			if (snap_parse_size(optarg, &cfg->scrub_rate)) {
				fprintf(stderr, "snapsmp: --scrub-rate %s: expected bytes per second like 64M, or 0\n", optarg);
				return 2;
			}
			break;
		case 'v': cfg->verify_commit = 1; break;
		case 'F': snprintf(cfg->flush_dir, sizeof(cfg->flush_dir), "%s", optarg); break;
		case 'E': cfg->flush_every = (unsigned)atoi(optarg); break;
		case 'I': cfg->flush_interval = (unsigned)atoi(optarg); break;
		case 'K': cfg->flush_keep = (unsigned)atoi(optarg); break;
		case 'C':
			if (snap_smp_flush_codec_parse(optarg, &cfg->flush_codec)) {
				fprintf(stderr, "snapsmp: --flush-codec %s: expected none or lz4\n", optarg);
				return 2;
			}
			break;
		case 'M':
			if (snap_smp_flush_mode_parse(optarg, &cfg->flush_mode)) {
				fprintf(stderr, "snapsmp: --flush-mode %s: expected octal permission bits that include 0600\n",
					optarg);
				return 2;
			}
			break;
		case 'L':
			if (flag01("--flush-files", optarg, &cfg->flush_files))
				return 2;
			break;
		case 'D':
			if (flag01("--flush-direct", optarg, &cfg->flush_direct))
				return 2;
			break;
		case 'g':
			if (snap_smp_log_level_parse(optarg, &cfg->log_level)) {
				fprintf(stderr, "snapsmp: --log-level %s: expected error, warn, info or debug\n", optarg);
				return 2;
			}
			break;
		case 'G':
			if (snprintf(cfg->log, sizeof(cfg->log), "%s", !strcmp(optarg, "stderr") ? "" : optarg) >=
			    (int)sizeof(cfg->log)) {
				fprintf(stderr, "snapsmp: --log %s: path too long\n", optarg);
				return 2;
			}
			break;
		case 'P':
			if (snprintf(cfg->metrics_file, sizeof(cfg->metrics_file), "%s", optarg) >=
			    (int)sizeof(cfg->metrics_file)) {
				fprintf(stderr, "snapsmp: --metrics-file %s: path too long\n", optarg);
				return 2;
			}
			break;
		case 'T': {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);
			if (end == optarg || *end || v < 1 || v > 86400) {
				fprintf(stderr, "snapsmp: --metrics-interval %s: expected seconds from 1 to 86400\n", optarg);
				return 2;
			}
			cfg->metrics_interval = (unsigned)v;
			break;
		}
		case 'O': cfg->allow_older = 1; break;
		case 'e': f->ec = optarg; break;
		case 'q': f->quiet = 1; break;
		case 'X': f->detach = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (f->quiet && cfg->log_level > SNAP_SMP_LOG_WARN)
		cfg->log_level = SNAP_SMP_LOG_WARN;
	return -1;
}

/* --ec: become one node of the mesh; every path may name the node (%n).
 * -1 to go on, else the exit code. */
static int join_mesh(struct snap_mesh **mesh, int *argc, char ***argv, const char *ec, struct snap_smp_config *cfg,
		     char *err, size_t errlen)
{
	int ec_k = 0, ec_m = 0;
	if (snap_mesh_parse_ec(ec, &ec_k, &ec_m, err, errlen)) {
		fprintf(stderr, "snapsmp: %s\n", err);
		return 2;
	}
	/* Before MPI starts its threads: they (and the mesh thread) inherit
	 * the mask, so SIGTERM reaches only the poll loop's signalfd. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);
	int rc = snap_mesh_init(mesh, argc, argv, ec_k, ec_m, err, errlen);
	if (rc) {
		if (!*mesh || snap_mesh_rank(*mesh) == 0)
			fprintf(stderr, "snapsmp: %s\n", err);
		snap_mesh_finalize(*mesh);
		return 2;
	}
	char tmp[SNAP_PATH_MAX];
	int node = snap_mesh_rank(*mesh);
	if (snap_mesh_expand(cfg->client.store, node, tmp, sizeof(tmp)) ||
	    snprintf(cfg->client.store, sizeof(cfg->client.store), "%s", tmp) < 0 ||
	    snap_mesh_expand(cfg->client.socket, node, tmp, sizeof(tmp)) ||
	    snprintf(cfg->client.socket, sizeof(cfg->client.socket), "%s", tmp) < 0 ||
	    snap_mesh_expand(cfg->log, node, tmp, sizeof(tmp)) || snprintf(cfg->log, sizeof(cfg->log), "%s", tmp) < 0 ||
	    snap_mesh_expand(cfg->metrics_file, node, tmp, sizeof(tmp)) ||
	    snprintf(cfg->metrics_file, sizeof(cfg->metrics_file), "%s", tmp) < 0) {
		fprintf(stderr, "snapsmp: node %d: --store/--socket/--log/--metrics-file too long after %%n\n", node);
		snap_mesh_abort(*mesh, 2);
	}
	return -1;
}

/* What follows from the flags together: the socket beside the store, three
 * slots where a step gets pinned, and the checks. -1 to go on, else the
 * exit code. */
static int finish_config(struct snap_smp_config *cfg, const struct flags *f, struct snap_mesh *mesh, char *err,
			 size_t errlen)
{
	if (!f->socket_set && !getenv("SNAP_SOCKET") &&
	    snprintf(cfg->client.socket, sizeof(cfg->client.socket), "%s/smp.sock", cfg->client.store) >=
		    (int)sizeof(cfg->client.socket)) {
		fprintf(stderr, "snapsmp: --store path is too long for a socket path\n");
		return 2;
	}
	/* A flush or an encode pins the slots of the step it reads; a third
	 * slot lets the next saves go on meanwhile. */
	if ((cfg->flush_dir[0] || mesh) && !f->slots_set)
		cfg->slots = 3;
	if (!mesh && strstr(cfg->flush_dir, "%n")) {
		fprintf(stderr, "snapsmp: --flush-dir %s: %%n names a mesh node's directory; it needs --ec K+M\n",
			cfg->flush_dir);
		return 2;
	}
	if (snap_config_check(&cfg->client, err, errlen) || snap_smp_config_check(cfg, err, errlen)) {
		fprintf(stderr, "snapsmp: %s\n", err);
		return 2;
	}
	return -1;
}

/*
 * --detach: fork; the child leaves the caller's session, terminal and
 * descriptors and serves; the parent waits until the child serves (a byte on
 * the pipe) or exits (EOF), and returns 0 or the child's exit code. -1 in the
 * child, with *ready_fd the pipe's end to write to when serving.
 */
static int detach(const struct snap_smp_config *cfg, int *ready_fd)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		fprintf(stderr, "snapsmp: --detach: pipe: %s\n", strerror(errno));
		return 1;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "snapsmp: --detach: fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid > 0) {
		close(p[1]);
		char c;
		ssize_t n;
		do
			n = read(p[0], &c, 1);
		while (n < 0 && errno == EINTR);
		if (n == 1)
			return 0;
		int st = 0;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
		if (code == 3)
			fprintf(stderr, "snapsmp: store %s is in use by another snapsmp, which serves it\n", cfg->client.store);
		else
			fprintf(stderr, "snapsmp: failed to start (exit code %d); see %s\n", code, cfg->log);
		return code;
	}
	close(p[0]);
	setsid();
	/* The caller's pipes (a trainer's, a test's) must not stay open for as
	 * long as the daemon lives: whoever reads them would never see EOF. */
	int nul = open("/dev/null", O_RDWR);
	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
		dup2(nul, 2);
	}
	if (p[1] > 3)
		close_range(3, (unsigned)p[1] - 1, 0);
	close_range((unsigned)p[1] + 1, ~0u, 0);
	*ready_fd = p[1];
	return -1;
}

/* What --detach needs before it forks: a log that is not the terminal (by
 * default STORE/snapsmp.log, the store and its parents created for it), and
 * no mesh. -1 to
 * go on, else the exit code. */
static int detach_config(struct snap_smp_config *cfg, const struct flags *f)
{
	if (f->ec) {
		fprintf(stderr, "snapsmp: --detach runs one node's daemon alone; a mesh (--ec) is started by mpirun\n");
		return 2;
	}
	if (!cfg->log[0] &&
	    snprintf(cfg->log, sizeof(cfg->log), "%s/snapsmp.log", cfg->client.store) >= (int)sizeof(cfg->log)) {
		fprintf(stderr, "snapsmp: --store path is too long for STORE/snapsmp.log\n");
		return 2;
	}
	/* With its parents: a client that starts us cannot tell us to make them. */
	char dir[sizeof(cfg->client.store)];
	snprintf(dir, sizeof(dir), "%s", cfg->client.store);
	for (char *p = dir + 1;; p++) {
		if (*p && *p != '/')
			continue;
		char c = *p;
		*p = '\0';
		if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
			fprintf(stderr, "snapsmp: cannot create %s for store root %s: %s\n", dir, cfg->client.store,
				strerror(errno));
			return 1;
		}
		if (!c)
			break;
		*p = c;
	}
	return -1;
}

/* --log-level debug: the settings the daemon runs with, after flags,
 * SNAP_* variables and defaults, one line each. */
static void log_settings(const struct smp_log *lg, const struct snap_smp_config *c, const char *ec)
{
	if (!smp_log_enabled(SMP_LOG_DEBUG))
		return;
	smp_logf(lg, SMP_LOG_DEBUG, "setting store=%s socket=%s", c->client.store, c->client.socket);
	smp_logf(lg, SMP_LOG_DEBUG, "setting mem_limit=%" PRIu64 " slots=%u verify_commit=%d allow_older=%d ec=%s",
		 c->mem_limit, c->slots, c->verify_commit, c->allow_older, ec ? ec : "off");
	smp_logf(lg, SMP_LOG_DEBUG, "setting flush_dir=%s flush_every=%u flush_interval=%u flush_keep=%u "
		 "flush_codec=%s flush_mode=%04o flush_files=%d flush_direct=%d", c->flush_dir[0] ? c->flush_dir : "(none)",
		 c->flush_every, c->flush_interval, c->flush_keep, c->flush_codec ? "lz4" : "none", c->flush_mode,
		 c->flush_files, c->flush_direct);
	smp_logf(lg, SMP_LOG_DEBUG, "setting log_level=%s log=%s", snap_smp_log_level_name(c->log_level),
		 c->log[0] ? c->log : "stderr");
	smp_logf(lg, SMP_LOG_DEBUG, "setting metrics_file=%s metrics_interval=%u",
		 c->metrics_file[0] ? c->metrics_file : "(none)", c->metrics_interval);
}

int main(int argc, char **argv)
{
	struct snap_smp_config cfg;
	char err[768] = "";
	snap_smp_config_init(&cfg);
	if (snap_smp_config_from_env(&cfg, err, sizeof(err))) {
		fprintf(stderr, "snapsmp: %s\n", err);
		return 2;
	}
	struct flags f;
	struct snap_mesh *mesh = NULL;
	int code = parse_flags(argc, argv, &cfg, &f);
	if (code < 0 && f.ec)
		code = join_mesh(&mesh, &argc, &argv, f.ec, &cfg, err, sizeof(err));
	if (code < 0)
		code = finish_config(&cfg, &f, mesh, err, sizeof(err));
	int ready_fd = -1;
	if (code < 0 && f.detach && (code = detach_config(&cfg, &f)) < 0)
		code = detach(&cfg, &ready_fd);
	if (code >= 0)
		return code;
	if (smp_log_open(cfg.log_level, cfg.log, err, sizeof(err))) {
		fprintf(stderr, "snapsmp: %s\n", err);
		if (mesh)
			snap_mesh_abort(mesh, 2);
		return 2;
	}
	struct smp_log lg = { .node = mesh ? snap_mesh_rank(mesh) : -1 };
	log_settings(&lg, &cfg, f.ec);
	/* Below info, the daemon's info lines (and the store scan's) stay off. */
	int serving = 0;
	int rc = snap_smp_serve(&cfg, cfg.log_level < SNAP_SMP_LOG_INFO, mesh, ready_fd, &serving, err, sizeof(err));
	if (rc == SNAP_EBUSY && !serving && !mesh) {
		/* Not serving yet: the store's lock is another snapsmp's, which
		 * serves it (the race of clients that start one each is decided here). */
		smp_logf(&lg, f.detach ? SMP_LOG_INFO : SMP_LOG_ERROR, "%s: this one exits", err);
		if (cfg.log[0] && !f.detach)
			fprintf(stderr, "snapsmp: %s\n", err);
		smp_log_close();
		return 3;
	}
	if (rc) {
		smp_logf(&lg, SMP_LOG_ERROR, "%s (%s)", err, snap_strerror(rc));
		/* A log elsewhere (file, syslog): the launcher still sees why. */
		if (cfg.log[0] && mesh)
			fprintf(stderr, "snapsmp: node %d: %s (%s)\n", snap_mesh_rank(mesh), err, snap_strerror(rc));
		else if (cfg.log[0])
			fprintf(stderr, "snapsmp: %s (%s)\n", err, snap_strerror(rc));
		smp_log_close();
		/* The peers may be inside a collective: only an abort frees them. */
		if (mesh)
			snap_mesh_abort(mesh, 1);
		return 1;
	}
	smp_log_close();
	snap_mesh_finalize(mesh);
	return 0;
}
