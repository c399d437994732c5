/* Confinement applied by execgate-launch in a spawned child, just before execve (docs/sandbox.md).
 *
 *   Landlock      filesystem: everything readable, writes only under the writable roots and to
 *                 the terminal/null-like devices; EXECUTE everywhere or (strict-exec) only below
 *                 the system directories and listed ones; TCP bind/connect denied (ABI >= 4)
 *                 when the network is off; signals and abstract Unix sockets scoped (ABI >= 6).
 *   mount ns      `.git` & co. inside writable roots and explicit read-only paths are bind-mounted
 *                 read-only in a private mount namespace (a user namespace when unprivileged);
 *                 hidden directories (control sockets) get an empty read-only tmpfs on top.
 *   capabilities  the bounding, inheritable and ambient sets are emptied (root stays uid 0 but
 *                 has no capability left, also after exec).
 *   proxy mode    (--proxy-port) a network namespace with only loopback (netns.h); Landlock
 *                 lets TCP connect only to the proxy's port there, binds nothing.
 *   stand-ins     every program a rule names is covered (bind mount, read-only) by a stand-in
 *                 `#!execgate-wrapper --shadow` file of the session, so whatever executes it —
 *                 interposed or not — asks the server (the kernel exec backstop, --shadows).
 *   seccomp       socket() only for AF_UNIX when the network is off (and AF_INET/AF_INET6 in
 *                 proxy mode: the namespace is the boundary); io_uring, TIOCSTI and
 *                 TIOCLINUX denied; ptrace and process_vm_readv/writev denied; under
 *                 strict-exec memfd_create only with MFD_NOEXEC_SEAL; other syscall ABIs
 *                 (i386, x32) killed.
 *
 * Nothing here runs in the launcher itself: only the forked child is confined.
 */
#ifndef EXECGATE_SANDBOX_H
#define EXECGATE_SANDBOX_H

#include <stddef.h>
#include <sys/types.h>

enum sb_mode { SB_OFF = 0, SB_READ_ONLY, SB_WORKSPACE_WRITE };

struct sb_list {
    const char **v;
    int n;
    int cap;
};

struct sb_config {
    enum sb_mode mode;
    int network;          /* 1: no network restriction */
    int strict_exec;      /* EXECUTE only below the system dirs + exec_dirs */
    struct sb_list writable;  /* --writable DIR: writable roots (workspace-write) */
    struct sb_list readonly;  /* --readonly PATH: kept read-only even inside a writable root */
    struct sb_list protect;   /* --protect NAME: <root>/NAME kept read-only in every root */
    struct sb_list exec_dirs; /* --exec-dir PATH: extra places programs may be executed from */
    struct sb_list hide;      /* --hide DIR: an empty read-only directory mounted over it */
    int proxy_port;           /* --proxy-port N: network through the proxy (netns.h), 0: no */
    int proxy_report;         /* --proxy-report-fd FD: where listeners go (launcher's), or -1 */
    const char *shadows;      /* --shadows FILE: (stand-in, program) path pairs, each NUL-ended:
                               * every program a rule names is covered by its stand-in */
    const char *uncovered;    /* not an option: the one program of the table left uncovered
                               * (a confined claim's script, which its interpreter reads by
                               * path); NULL: none */
};

/* The Landlock ABI the confined profiles need at least (TRUNCATE, Linux 6.2). */
#define SB_MIN_LANDLOCK_ABI 3

/* Parse the sandbox option at argv[*i] (advancing *i past its value). Returns 1 if it was one,
 * 0 if argv[*i] is not a sandbox option, -1 on a bad value (message in err). */
int sb_parse_option(struct sb_config *c, int argc, char **argv, int *i, char *err, size_t cap);

/* Confine the calling process (a freshly forked, single-threaded child) and chdir(cwd) at the
 * right moment (after the mounts). 0, or -errno with a one-line message in msg. With SB_OFF it
 * only changes directory. */
int sb_apply(const struct sb_config *c, const char *cwd, char *msg, size_t cap);

/* `execgate-launch --probe [SANDBOX OPTIONS]`: print what this kernel supports as key=value
 * lines on stdout (and, if a mode other than off was given, the result of a trial application
 * in a throwaway child). Returns the process exit status. */
int sb_probe(const struct sb_config *c);

/* After unshare(CLONE_NEWUSER | ...): map the caller's own uid and gid (given: read them before
 * the unshare) to themselves and deny setgroups. 0, or -errno with *what naming the file that
 * could not be written. For a freshly forked, single-threaded child; allocates nothing. */
int sb_map_own_ids(uid_t uid, gid_t gid, const char **what);

/* Highest supported Landlock ABI, or -errno. */
int sb_landlock_abi(void);

#endif
