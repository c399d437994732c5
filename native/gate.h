/* The client side of the exec gate (docs/protocol.md §1, §3, §6), shared by the interposer
 * (libexecgate.so) and the exec wrapper (execgate-wrapper).
 *
 * One call of eg_gate() decides one exec: it resolves the program the way the kernel (and, for
 * the `p` variants, glibc's PATH search) would, opens it once, consults the policy snapshot,
 * asks the server when it must, and hands a *plan* (what exactly to execute, with which argv and
 * which environment) to a caller-supplied function that carries it out: a raw exec syscall for
 * the exec family, the real posix_spawn for posix_spawn/system/popen, the in-process claim for
 * the wrapper.
 *
 * Everything here is async-signal-safe and usable in a vfork child: no malloc, no stdio, no
 * locks. Working memory is on the stack; only large argv/environments use mmap. Nothing reads
 * the process's environment after eg_session_load().
 */
#ifndef EXECGATE_GATE_H
#define EXECGATE_GATE_H

#include <stddef.h>
#include <sys/types.h>

#define EG_PATH 4096
#define EG_SUN_PATH 108
#define EG_TOKEN_LEN 32
#define EG_MAX_INTERP 4 /* #! levels followed, as the kernel does */

/* The gate environment captured at load time (protocol §1). */
struct eg_session {
    int ok;                        /* socket and token present and well-formed */
    const char *reason;            /* why not ok */
    char sock[EG_SUN_PATH];        /* EXECGATE_SOCKET */
    char token[EG_TOKEN_LEN + 1];  /* EXECGATE_TOKEN */
    char claim[EG_SUN_PATH];       /* <dir of the socket>/claim.sock ("" if it does not fit) */
    /* the strings below are never NULL ("" when unknown) */
    const char *snap;              /* EXECGATE_SNAPSHOT if /proc/PID/fd/N, else
                                      <dir of the socket>/policy.snap (protocol §6) */
    const char *wrapper;           /* EXECGATE_WRAPPER */
    const char *preload;           /* the interposer's own path, first in LD_PRELOAD */
    /* prebuilt "NAME=value" entries re-added to every exec's environment: the gate's, the
     * loader variables LD_AUDIT and GLIBC_TUNABLES as this process was loaded with them, and
     * in a proxied session (EXECGATE_PROXY set) the proxy variables */
    const char *env[9 + 19];
    int nenv;
    int proxied; /* EXECGATE_PROXY was set at load: the proxy variables are the gate's too */
    /* The strings above, packed right after them: loading writes this page anyway (the
     * loader zeroes the start of .bss on the page of the GOT), so a session that fits costs
     * no page of its own in every gated process. */
    size_t arena_used;
    char arena[6 * EG_PATH + 512];
};

extern struct eg_session eg_sess;

/* Capture the gate environment from envp. preload_self: the interposer's absolute path (NULL
 * or "" when unknown: LD_PRELOAD is then taken from the first entry of envp's LD_PRELOAD that
 * names libexecgate.so). Not async-signal-safe; call once, at load. */
void eg_session_load(char *const *envp, const char *preload_self);

/* The value of NAME in envp, or NULL (no libc getenv: usable in a vfork child). */
const char *eg_getenv(char *const *envp, const char *name);

/* What to execute, handed to the caller's eg_run_fn. */
enum eg_how {
    EG_HOW_FD,    /* execveat(fd, "", argv, envp, AT_EMPTY_PATH): exactly the checked file
                   * (for a script: its last judged interpreter, argv as binfmt_script's) */
    EG_HOW_CLAIM, /* escalation: claim TICKET (argv: the command) in this process (eg_claim)
                   * or exec the wrapper, path = wrapper, argv = [execgate-claim, TICKET] */
    EG_HOW_GATE,  /* resolve_only calls: start the wrapper in its gate mode on path (the
                   * absolute path of the file found), argv: the caller's; it decides */
    EG_HOW_STANDING, /* only for calls with `standing` set, before asking the server: claim
                      * a standing authorization (eg_claim_standing) for fd (path: the
                      * absolute path sent to the server) if this process may claim here;
                      * return 0 (a miss) to ask the server as usual */
};

struct eg_plan {
    enum eg_how how;
    int fd;              /* EG_HOW_FD: the open program (close-on-exec) */
    const char *path;    /* the path as the caller gave it (NULL for fexecve); CLAIM: wrapper;
                          * GATE: the absolute path of the file found */
    const char *ticket;  /* EG_HOW_CLAIM */
    char *const *argv;
    char *const *envp;   /* the caller's environment with the gate environment re-added */
};

/* Carry out a plan. Returns 0 on success (a spawn started; an exec never returns), else an
 * errno value: the gate then goes on as glibc would (PATH search continues on ENOENT, EACCES, …;
 * ENOEXEC falls back to /bin/sh for the execvp family). */
typedef int (*eg_run_fn)(void *ctx, const struct eg_plan *plan);

struct eg_call {
    const char *via;          /* protocol VIA field */
    int dirfd;                /* AT_FDCWD, or execveat's directory descriptor */
    const char *path;         /* the program as given; NULL: fexecve/execveat on fd `fd` */
    int fd;
    int atflags;              /* execveat flags: AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH */
    int search;               /* `p` variant: PATH search when path has no '/' */
    int sh_fallback;          /* ENOEXEC → /bin/sh FILE ARGS… (execvp, execvpe, execlp) */
    int resolve_only;         /* find and open the program only (errors as usual), then
                               * hand run() an EG_HOW_GATE plan: posix_spawn cannot execute a
                               * descriptor, so the wrapper it starts decides and execs */
    int spawn_fd;             /* with resolve_only: a program the snapshot lets run is handed
                               * to run() as an EG_HOW_FD plan instead (the caller can spawn
                               * the descriptor itself, spawn.h); the rest still EG_HOW_GATE */
    const char *search_path;  /* PATH value; NULL = "/bin:/usr/bin" */
    int standing;             /* try run() with an EG_HOW_STANDING plan before asking the
                               * server about a stand-in the server marked (§4, §5) */
    char *const *argv;
    char *const *envp;
    /* out */
    int denied;               /* the exec was refused (message already written to fd 2) */
    int settled;              /* set by run(): its failure is the call's answer (a spawned
                               * child that failed); no further PATH candidate is tried */
};

/* Decide and carry out one exec. Returns 0 (a spawn succeeded; exec plans do not return on
 * success) or an errno value. On a denial the line has been written to fd 2 and EACCES is
 * returned with call->denied set. */
int eg_gate(struct eg_call *call, eg_run_fn run, void *ctx);

/* Build envp + the gate environment into mem (cap bytes). Returns the new envp, or NULL when
 * mem is too small; eg_env_size() tells how much is needed. */
size_t eg_env_size(char *const *envp);
char **eg_env_build(char *const *envp, void *mem, size_t cap);

/* Write "execgate: denied: <cmd>: <reason><detail>\n" to fd 2 (cmd rendered from argv, or
 * `path` when argv is empty). Every text is rendered visible (control and bidi characters,
 * bytes that are not UTF-8 escaped; a cut says how many bytes it hides). Async-signal- and
 * vfork-safe: no malloc, no locale, no stdio. */
void eg_deny_line(char *const *argv, const char *path, const char *reason, const char *detail);
void eg_deny_line_fd(int fd, char *const *argv, const char *path, const char *reason,
                     const char *detail);

/* Raw exec syscalls (never interposed). Return -errno. */
int eg_sys_execve(const char *path, char *const *argv, char *const *envp);
int eg_sys_execveat(int dirfd, const char *path, char *const *argv, char *const *envp, int flags);

/* Carry out a plan with a raw exec syscall (the exec family and the wrapper's run). Returns an
 * errno value on failure. */
int eg_exec_plan(const struct eg_plan *plan);

/* Claim an escalation ticket (protocol §4) at the launcher's claim socket, in the calling
 * process, and end the process the way the escalated program ended: _exit with its code, or die
 * by its signal; a denial prints its message and exits 126 (127 for a missing program).
 * cmd: the command, for messages (NULL: unknown). in_process: the caller is a program that was
 * exec'ing, not the wrapper: the process turns into the claim as an exec would have turned it
 * into the wrapper (caught signals reset to their default, every descriptor but the claim's
 * closed once it is sent). The caller must be single-threaded (other threads would go on
 * running) and must not be a vfork child (its parent waits for an exec). Async-signal-safe. */
__attribute__((noreturn)) void eg_claim(const char *ticket, char *const *envp, char *const *cmd,
                                        int in_process);

/* Claim a standing authorization (protocol §4 "Standing claims") for the stand-in open at
 * prog (path: its absolute path as the exec request would name it), with argv
 * and envp as the exec would have them, in the calling process. Returns only on a miss (or
 * when the claim socket cannot be reached): nothing ran, every descriptor and the signal mask
 * are as they were; the caller asks the server as usual. On `go` it is eg_claim(…, in_process
 * = 1) from there: the process ends as the program ends. The same constraints as eg_claim's
 * in-process claims (single-threaded, not a vfork child). Async-signal-safe. */
void eg_claim_standing(const char *path, int prog, char *const *argv, char *const *envp,
                       char *const *cmd);
/* Map the session's current snapshot (protocol §6) in this process if it is not mapped yet or
 * is stale, before a fork: its children then find it mapped and checked, where each would map
 * and validate it again (a shell forks once per program it runs and never execs itself). For
 * the interposed fork(); raw system calls only, no locks, async-signal-safe. */
void eg_snapshot_before_fork(void);
/* The interposer's snapshot check (protocol §6) for the program at path (absolute, or relative
 * to cwd), with the snapshot snap (len bytes, validated here) instead of the session's: 1 = it
 * must ask the server (a rule may name it, a script, set-id, several links, ASK_ALWAYS, a
 * malformed snapshot, the wrapper (a gate of its own), …), 0 = it runs without asking, -errno =
 * it cannot be opened as the kernel would open it. fd_out (may be NULL): on 0, the descriptor
 * (close-on-exec) of the file that was judged, the caller's to execute and close. real (real_cap bytes) receives its canonical path ("" when unknown). For the
 * native front of `execgate run` (docs/protocol.md §8); not async-signal-safe only in that it
 * is not meant for signal handlers (no malloc, no stdio). */
int eg_snapshot_verdict(const void *snap, size_t len, const char *cwd, const char *path,
                        const char *wrapper, char *real, size_t real_cap, int *fd_out);

/* Small helpers. */
const char *eg_basename(const char *path);
const char *eg_strerror(int err);  /* static English text for the errnos an exec can give */

#endif
