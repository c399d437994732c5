/* The git repository an escalated program would use, judged at the claim (docs/sandbox.md
 * "Protected names", docs/protocol.md §4).
 *
 * An escalated `git` runs the hooks and config of the repository it discovers (`core.fsmonitor`,
 * `core.pager`, filters, hooks): code. The server refuses to escalate out of a repository the
 * asking sandbox can write (gate/gitrepo.py), but a process speaking EG1 itself can make one
 * between the decision and its claim, or while git starts. So the launcher looks again when the
 * program is about to start, through the claimer's own root (/proc/PID/root: the mounts of its
 * sandbox, where everything outside the writable roots and every carve-out is a read-only
 * mount), and pins what it found: git's discovery is path-based and the sandbox can create a
 * `.git` in any folder it can write at any moment, so the only answer that holds against a
 * claimer retrying forever is to not let git discover at all when such a folder is on its way:
 * GIT_DIR (and GIT_WORK_TREE) name the repository found here, whose `.git` the sandbox cannot
 * change, or a GIT_DIR that is no repository when there was none.
 *
 * Not async-signal-safe and not for vfork children (stdio-free, but uses the launcher's stack
 * generously); for the launcher's main loop.
 */
#ifndef EXECGATE_GITREPO_H
#define EXECGATE_GITREPO_H

#include <limits.h>
#include <sys/types.h>

enum gr_outcome {
    GR_AS_IS,    /* the claimer is not sandboxed, or nothing the sandbox can write lies on git's
                  * way from the working directory: escalate unchanged */
    GR_PIN,      /* escalate with gr_pin_env's environment */
    GR_WRITABLE, /* git would use a repository the sandbox can write (or the claim cannot be
                  * examined): do not escalate; `dot_git` names it */
};

struct gr_found {
    char dot_git[PATH_MAX];          /* GR_WRITABLE: the `.git` the sandbox can write, or ""
                                      * when the claim could not be examined */
    char git_dir[PATH_MAX + 8];      /* GR_PIN: "GIT_DIR=..." */
    char work_tree[PATH_MAX + 16];   /* GR_PIN: "GIT_WORK_TREE=...", or "" (a bare repository
                                      * or none) */
};

struct sb_config;

/* Remember the read-only carve-outs that exist now, before the session's first sandboxed
 * program runs: every <writable root>/<protected name> and every --readonly path, by (dev, ino).
 * Protected names are looked up at each spawn, so a `.git` the session's sandbox made is
 * read-only in the next sandbox: a read-only `.git` in a folder the claimer can write is
 * trusted only if it is one of these. Call once, at start-up. */
void gr_remember_carveouts(const struct sb_config *c);

/* `--known-carveouts LIST` (comma-separated DEV:INO, possibly empty): the carve-outs the front
 * end remembered when it started (an MCP server opens a session per call, after earlier calls
 * may have made a `.git`), used instead of gr_remember_carveouts. 0, or -1 when malformed. */
int gr_known_carveouts(const char *list);

/* `standing`: a standing claim (protocol §4), which the server did not look at: at least what its
 * check (gate/gitrepo.py) would refuse is GR_WRITABLE — the claimer is examined in any mount
 * namespace, and a folder on git's way that it can write and that holds a HEAD (git could take
 * it for a repository) counts as a writable repository.
 * Judge the claim of process `peer` (SO_PEERCRED), whose program would start in `cwd`
 * (absolute, as the asking process saw it); `pidfd`: the claimer's (gr_peer_pidfd), or -1. A
 * claimer in the launcher's own mount namespace (an escalated program, a session without
 * sandbox) is GR_AS_IS, as the server does not check escalated callers either. A claimer that
 * is gone or was replaced by another process by the end of the check (its pidfd says so: every
 * /proc/PID read before this returns was the claimer's), or whose root or paths cannot be
 * examined, is GR_WRITABLE (fail closed). */
enum gr_outcome gr_examine_claim(int pidfd, pid_t peer, const char *cwd, struct gr_found *out,
                                 int standing);

/* The pidfd of the process that connected claim socket `sock` (SO_PEERPIDFD, Linux >= 6.5: it
 * names that process even if its pid is reused meanwhile), or -1. The caller closes it. */
int gr_peer_pidfd(int sock);

/* A copy of envp (the vector only: the strings stay envp's and found's) without GIT_DIR,
 * GIT_WORK_TREE, GIT_CEILING_DIRECTORIES and GIT_DISCOVERY_ACROSS_FILESYSTEM, with the pin
 * appended. malloc'ed; NULL when out of memory. */
char **gr_pin_env(char **envp, struct gr_found *found);

#endif
