/* execgate-launch: the per-session supervisor (docs/protocol.md §4, §7, docs/sandbox.md).
 *
 *   execgate-launch --control FD [--claim-fd FD] [SANDBOX OPTIONS]
 *   execgate-launch --probe [SANDBOX OPTIONS]
 *
 * A child subreaper: every process of the session stays its descendant. It spawns what the
 * server asks for (optionally confined), reports spawned / failed / exited, forwards signals,
 * and at the end (shutdown request, control channel EOF, SIGTERM) kills every descendant,
 * including daemons that setsid'ed or double-forked, and reaps them all before exiting: exit
 * status 0 says none is left (the server then has nothing to sweep), EXIT_LEFT_BEHIND that
 * some outlived the SIGKILL rounds.
 *
 * Escalations: the server authorizes a ticket (what to run, how to build its environment) on
 * the control channel; the claimer (the interposer in the exec'ing process, or the wrapper)
 * then connects to the claim socket with its descriptors and environment, and the launcher
 * spawns the program unconfined, forwards the claimer's signals and answers its exit status.
 * The server is not involved in a claim at all.
 *
 * Single-threaded; one poll() loop over the control socket, a signalfd (SIGCHLD, SIGTERM), the
 * claim socket and its connections (read without blocking, each into its own buffer, so a
 * claimer that sends half a frame stalls nobody; unfinished claims are bounded in number, bytes
 * and time, so claimers cannot make the launcher hold much memory) and the close-on-exec error
 * pipes of spawns that have not exec'ed yet.
 */
#include "common.h"
#include "gitrepo.h"
#include "netns.h"
#include "sandbox.h"
#include "sys.h"
#include "tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define EOF_GRACE_MS 500
#define MAX_GRACE_MS 600000
#define KILL_ROUNDS_MS 10000 /* bound on the SIGKILL rounds of a shutdown */
#define EXIT_LEFT_BEHIND 3   /* a shutdown gave up on descendants (they go to our parent) */
#define MSG_CAP 1024
#define MAX_LIFETIME_MS 3600000LL /* bound on a ticket's lifetime */
#define MAX_CONNS 4096             /* claim connections open at once */
/* Unfinished claims (accepted, claim frame not complete yet), protocol §4: at most this many
 * at once (more wait in the listen backlog: a claimer is often accepted before it sends), ... */
#define MAX_UNFINISHED_CLAIMS 16
/* ... buffers of at most this many bytes in all (two claims of the largest frame, and room),
 * a connection whose buffer would not fit is closed ... */
#define MAX_UNFINISHED_BYTES ((size_t)2 * EG_MAX_PAYLOAD + ((size_t)8 << 20))
/* ... and each one closed if its claim frame is not complete this long after it was accepted. */
#define CLAIM_DEADLINE_MS 30000LL
/* A standing claim's `go` waits this long for the end of its program (§4 "Standing claims"). */
#define GO_AFTER_MS 1LL
/* An answered claim's connection is closed at our next wake-up, or this much later. */
#define LINGER_MS 20
#define MAX_SIGNAL_FRAME 256 /* frames after the claim are `signal` frames: small */
#define MAX_TICKET 255
#define MAX_TICKETS 256 /* outstanding authorizations; the oldest goes first */
#define MAX_STANDING 64 /* standing authorizations; the oldest goes first */
#define MAX_STANDING_BYTES (4u << 20) /* ... and their messages together, at most */

static const int IGNORED_SIGNALS[] = {SIGINT, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGHUP, SIGPIPE};

enum state { P_PENDING, P_RUNNING, P_FAILED };

struct conn;

struct proc {
    long long id;
    pid_t pid;
    int pipe;     /* read end of the error pipe while P_PENDING */
    enum state state;
    int main;     /* FLAGS had `main` */
    int last;     /* FLAGS had `last`: the session ends with it */
    pid_t pgid;   /* its process group, for a main that took the terminal */
    struct conn *conn; /* an escalated program: its claimer's connection (no events sent) */
    int hold;     /* a `held` spawn not released yet: our end of its hold socket, else -1 */
};

/* A claim connection (protocol §4). It lives while its socket is open or its program has not
 * been reaped. */
struct conn {
    int fd;                   /* -1 once closed */
    pid_t peer;               /* SO_PEERCRED pid of the claimer */
    int claimed;              /* the claim frame has been handled */
    int unfinished;           /* counted in g_unfinished (its incap in g_unfinished_bytes) */
    long long deadline;       /* now_ms() by which its claim frame must be complete */
    pid_t pid;                /* the escalated program until it is reaped, else 0 */
    int running;              /* it exec'ed: signals go to it directly */
    unsigned long long held;  /* signals that arrived before it exec'ed (bit n-1: signal n) */
    char *in;                 /* bytes read and not consumed yet */
    size_t inlen, incap;
    int fds[EG_MAX_FDS];      /* descriptors that came with the claim */
    int nfds;
    int bad;                  /* too many or truncated descriptors: malformed */
    char *display;            /* the command, for messages */
    long long go_due;         /* a standing claim's `go` is owed by now_ms() then, 0: not */
    struct conn *next_dead;
};

/* An authorized escalation (control message `authorize`). Every string points into mem. */
struct ticket {
    struct ticket *next;
    char *mem;
    const char *id, *token, *display, *path, *cwd;
    char **argv, **drop, **prefix, **keep, **set; /* NULL-terminated */
    long long expires;        /* now_ms() deadline */
    int fd;                   /* the judged program (close-on-exec): what a claim executes */
    int confined;             /* `authorize-confined`: the claim runs it inside the sandbox */
    size_t memlen;            /* the message's size (standing authorizations) */
    /* A standing authorization (control message `standing`): what the server judged, each
     * compared with what the launcher derives itself at every standing claim (§4). */
    const char *realpath;     /* the judged descriptor's canonical path */
    size_t argc;
    long long dev, ino, ctime_ns, mtime_ns, size, mode, nlink; /* the server's fstat */
    long long standin_dev, standin_ino; /* the stand-in the request came through (§5) */
    /* The names DROP and SET take away from the claimer's environment, hashed (apply_env, made
     * at the first claim): nslots a power of two, an empty slot NULL. */
    const char **skip;
    size_t nslots;
};

static struct sb_config g_sandbox;
static int g_control = -1;   /* -1 once closed */
static int g_report = 1;     /* events can still be sent */
static int g_sigfd = -1;
static pid_t g_self, g_pgrp;
static struct rlimit g_nofile; /* as inherited: restored in children */
static struct proc *g_procs;
static size_t g_nprocs, g_capprocs;
static int g_claim = -1;      /* the claim socket (listening), or -1 */
static int g_status_fd = -1;  /* --status-fd: where the main program's wait status goes, or -1 */
static uid_t g_uid;
static struct conn **g_conns; /* open claim connections */
static size_t g_nconns, g_capconns;
static size_t g_unfinished;       /* connections whose claim frame is not complete */
static size_t g_unfinished_bytes; /* the capacity of their buffers */
static struct conn *g_dead;   /* released this round, freed at the top of the next */
static struct ticket *g_tickets;
static size_t g_ntickets;     /* at most MAX_TICKETS: each holds a descriptor */
static struct ticket *g_standing; /* standing authorizations, newest first */
static size_t g_nstanding;    /* at most MAX_STANDING: each holds a descriptor */
static size_t g_standing_bytes; /* their messages' sizes, at most MAX_STANDING_BYTES */
static int g_watch = -1;      /* the server's folder watch (inotify): pending events = revoked */
static int g_reports = -1;    /* where standing claims are reported (a SEQPACKET socket), or -1 */
static long long g_accept_paused; /* now_ms() until which the claim socket is not polled */
static int g_last_ended;      /* a `last` spawn was reaped: exit once no child is left */
static int g_reset[NSIG];     /* signals not at their default disposition here: reset in children */
static int g_nreset;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void note(const char *fmt, ...)
{
    char line[512];
    int n = snprintf(line, sizeof line, "execgate-launch: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len++] = '\n';
    }
    (void)eg_write_all(2, line, len);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -- events to the server ------------------------------------------------------------------- */

static void send_event(struct eg_buf *b)
{
    if (!g_report || g_control < 0)
        return;
    if (eg_send_frame(g_control, b, NULL, 0) < 0)
        g_report = 0; /* the server is gone: carry on, quietly */
}

static void send_spawned(long long id, pid_t pid)
{
    char mem[128];
    struct eg_buf b;
    eg_buf_init(&b, mem, sizeof mem);
    eg_put(&b, EG_TAG);
    eg_put(&b, "spawned");
    eg_put_long(&b, id);
    eg_put_long(&b, pid);
    send_event(&b);
}

static void send_failed(long long id, int err, const char *message)
{
    char mem[MSG_CAP + 128];
    struct eg_buf b;
    eg_buf_init(&b, mem, sizeof mem);
    eg_put(&b, EG_TAG);
    eg_put(&b, "failed");
    eg_put_long(&b, id);
    eg_put_long(&b, err);
    eg_put(&b, message);
    send_event(&b);
}

static void send_exited(long long id, int status)
{
    char mem[128];
    struct eg_buf b;
    eg_buf_init(&b, mem, sizeof mem);
    eg_put(&b, EG_TAG);
    eg_put(&b, "exited");
    eg_put_long(&b, id);
    eg_put_long(&b, status);
    send_event(&b);
}

/* Nothing of the session is left: `ended`, then the `exited` of the `last` program, sent when,
 * as it was reaped, the launcher had no child left (it exits 0 right after). One write: the
 * server reads both at one wake-up. */
static void send_ended_exited(long long id, int status)
{
    char mem[160];
    struct eg_buf ended, exited;
    eg_buf_init(&ended, mem, 32);
    eg_put(&ended, EG_TAG);
    eg_put(&ended, "ended");
    eg_buf_init(&exited, mem + ended.len, sizeof mem - ended.len);
    eg_put(&exited, EG_TAG);
    eg_put(&exited, "exited");
    eg_put_long(&exited, id);
    eg_put_long(&exited, status);
    if (!g_report || g_control < 0)
        return;
    if (eg_seal_frame(&ended) < 0 || eg_seal_frame(&exited) < 0) {
        send_exited(id, status); /* (cannot happen: both fit) */
        return;
    }
    size_t len = ended.len + exited.len, off = 0;
    while (off < len) {
        ssize_t k = send(g_control, mem + off, len - off, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            g_report = 0; /* the server is gone: carry on, quietly */
            return;
        }
        off += (size_t)k;
    }
}

/* -- the process table ---------------------------------------------------------------------- */

static struct proc *find_pid(pid_t pid)
{
    for (size_t i = 0; i < g_nprocs; i++)
        if (g_procs[i].pid == pid)
            return &g_procs[i];
    return NULL;
}

static struct proc *find_id(long long id)
{
    for (size_t i = 0; i < g_nprocs; i++)
        if (g_procs[i].id == id && !g_procs[i].conn)
            return &g_procs[i];
    return NULL;
}

static void claim_failed(struct conn *c, const char *message);
static void claim_running(struct conn *c);
static void claim_ended(struct conn *c, int ran, int status);

static void remove_proc(struct proc *p)
{
    if (p->hold >= 0)
        close(p->hold); /* never released: its interposer sees end-of-file and exits */
    size_t i = (size_t)(p - g_procs);
    g_procs[i] = g_procs[--g_nprocs];
}

/* The child behind p exec'ed (EOF on its error pipe) or failed (a message). */
static void resolve(struct proc *p)
{
    struct {
        int err;
        char msg[MSG_CAP];
    } buf;
    size_t got = 0;
    for (;;) {
        ssize_t k = read(p->pipe, (char *)&buf + got, sizeof buf - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(p->pipe);
    p->pipe = -1;
    if (got >= sizeof buf.err) {
        ((char *)&buf)[got] = '\0';
        p->state = P_FAILED;
        if (p->conn)
            claim_failed(p->conn, buf.msg);
        else
            send_failed(p->id, buf.err, buf.msg);
    } else {
        p->state = P_RUNNING;
        if (p->conn) {
            claim_running(p->conn);
            return;
        }
        if (p->main)
            p->pgid = getpgid(p->pid);
        send_spawned(p->id, p->pid);
    }
}

/* Give the terminal back to our own group if a main spawn's group had it. */
static void restore_terminal(pid_t pgid)
{
    if (pgid <= 0 || pgid == g_pgrp)
        return;
    int tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (tty < 0)
        return;
    if (tcgetpgrp(tty) == pgid)
        (void)tcsetpgrp(tty, g_pgrp); /* SIGTTOU is ignored */
    close(tty);
}

/* --status-fd: the main program's wait status in decimal and a newline, once (the native
 * front of `execgate run` exits with it; the control channel is its server's). */
static void report_status(int status)
{
    if (g_status_fd < 0)
        return;
    char line[32];
    size_t n = eg_fmt_long(line, status);
    line[n++] = '\n';
    (void)eg_write_all(g_status_fd, line, n);
    close(g_status_fd);
    g_status_fd = -1;
}

/* Reap every child that is ready. 1: reaped some, 0: none ready, -1: no children left.
 * The `last` program's `exited` goes out at the end, preceded by `ended` when no child is
 * left then (the server may answer its caller without waiting for our exit). */
static int reap(void)
{
    int any = 0, left;
    long long last_id = -1;
    int last_status = 0;
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            left = errno == ECHILD ? -1 : any;
            break;
        }
        if (pid == 0) {
            left = any;
            break;
        }
        any = 1;
        struct proc *p = find_pid(pid);
        if (!p)
            continue; /* an orphan we inherited */
        if (p->state == P_PENDING)
            resolve(p);
        if (p->conn) {
            claim_ended(p->conn, p->state == P_RUNNING, st);
        } else if (p->state == P_RUNNING) {
            if (p->main) { /* before telling: the server may use the terminal right away */
                restore_terminal(p->pgid);
                report_status(st);
            }
            if (p->last) {
                last_id = p->id;
                last_status = st;
            } else {
                send_exited(p->id, st);
            }
        }
        if (p->last)
            g_last_ended = 1;
        remove_proc(p);
    }
    if (last_id >= 0) {
        if (left < 0)
            send_ended_exited(last_id, last_status);
        else
            send_exited(last_id, last_status);
    }
    return left;
}

/* -- killing the session -------------------------------------------------------------------- */

/* Wait up to ms for a signal on the signalfd (drained); SIGCHLD is handled by the caller. */
static void wait_signal(long long ms)
{
    struct pollfd pfd = {.fd = g_sigfd, .events = POLLIN};
    if (ms < 0)
        ms = 0;
    int r = poll(&pfd, 1, (int)(ms > INT_MAX ? INT_MAX : ms));
    if (r > 0) {
        struct signalfd_siginfo si[16];
        while (read(g_sigfd, si, sizeof si) > 0)
            ;
    }
}

/* SIGTERM (and SIGCONT) to everyone, wait up to grace_ms, then SIGKILL rounds until no child is
 * left (bounded), reaping all along; then exit. */
static void shutdown_session(long long grace_ms) __attribute__((noreturn));

static void shutdown_session(long long grace_ms)
{
    if (reap() >= 0) {
        eg_signal_descendants(g_self, 0, SIGTERM, 1);
        long long deadline = now_ms() + grace_ms;
        while (reap() >= 0) {
            long long left = deadline - now_ms();
            if (left <= 0)
                break;
            wait_signal(left);
        }
    }
    long long limit = now_ms() + KILL_ROUNDS_MS;
    int status = 0;
    while (reap() >= 0) {
        eg_signal_descendants(g_self, 0, SIGKILL, 0);
        if (reap() < 0)
            break;
        if (now_ms() > limit) {
            note("giving up: descendants still alive after %d ms of SIGKILL", KILL_ROUNDS_MS);
            status = EXIT_LEFT_BEHIND;
            break;
        }
        wait_signal(2);
    }
    /* Pending spawns whose child never reported (killed before exec): nothing to say. */
    if (g_control >= 0)
        close(g_control);
    exit(status);
}

/* -- spawning ------------------------------------------------------------------------------- */

struct spawn {
    long long id;
    int sandbox, main, last;
    int held;                   /* the child's end of its hold socket goes to EG_HOLD_FD */
    int uncover;                /* a confined claim: its program is not covered by a stand-in */
    long long pgid;
    const char *cwd, *path;     /* path: executed, or only named in messages (execfd) */
    int execfd;                 /* >= 0: execute this descriptor instead of path */
    int nfds;
    int *dst;
    char **argv, **envp;
};

/* Why a child failed before (or at) its exec. */
struct failure {
    int err;
    char msg[MSG_CAP];
};

/* Where a child reports a failure: the error pipe of a fork()ed child (errfd), or the memory
 * it shares with the launcher (a CLONE_VM | CLONE_VFORK child: the launcher resumes once the
 * child exec'ed or exited, and then reads it). */
struct report {
    int errfd;
    struct failure *shared;
};

static void child_fail(struct report *out, int err, const char *fmt, ...)
    __attribute__((noreturn)) __attribute__((format(printf, 3, 4)));

static void child_fail(struct report *out, int err, const char *fmt, ...)
{
    struct failure buf;
    buf.err = err ? err : EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf.msg, sizeof buf.msg, fmt, ap);
    va_end(ap);
    if (out->errfd >= 0)
        (void)eg_write_all(out->errfd, &buf, sizeof buf.err + strlen(buf.msg));
    else
        memcpy(out->shared, &buf, sizeof buf);
    _exit(127);
}

static void close_from_to(unsigned first, unsigned last)
{
    if (first > last)
        return;
    if (syscall(SYS_close_range, first, last, 0) == 0)
        return;
    struct rlimit rl;
    unsigned top = last;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur - 1 < top)
        top = (unsigned)rl.rlim_cur - 1;
    for (unsigned fd = first; fd <= top; fd++)
        close((int)fd);
}

/* In the child: put src[i] at dst[i], close everything else but *errfd and *execfd (each
 * moved above them, close-on-exec; -1: none). */
static int place_fds(const int *src, const int *dst, int n, int *errfd, int *execfd)
{
    int top = 2;
    for (int i = 0; i < n; i++)
        if (dst[i] > top)
            top = dst[i];
    int moved[EG_MAX_FDS];
    int e = -1, x = -1;
    if (*errfd >= 0) {
        e = fcntl(*errfd, F_DUPFD_CLOEXEC, top + 1);
        if (e < 0)
            return -errno;
        *errfd = e;
    }
    if (*execfd >= 0) {
        /* the program to execute, right above the error pipe (kept together: one range) */
        x = fcntl(*execfd, F_DUPFD_CLOEXEC, (e >= 0 ? e : top) + 1);
        if (x < 0)
            return -errno;
        *execfd = x;
    }
    for (int i = 0; i < n; i++) {
        moved[i] = fcntl(src[i], F_DUPFD_CLOEXEC, top + 1);
        if (moved[i] < 0)
            return -errno;
    }
    for (int i = 0; i < n; i++)
        if (dup2(moved[i], dst[i]) < 0) /* dup2 leaves dst[i] inheritable */
            return -errno;
    int sorted[EG_MAX_FDS]; /* insertion sort: no qsort (it may allocate) in a vfork child */
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && sorted[j - 1] > dst[i]; j--)
            sorted[j] = sorted[j - 1];
        sorted[j] = dst[i];
    }
    unsigned next = 0;
    for (int i = 0; i < n; i++) {
        if ((unsigned)sorted[i] > next)
            close_from_to(next, (unsigned)sorted[i] - 1);
        next = (unsigned)sorted[i] + 1;
    }
    if (e >= 0) {
        close_from_to(next, (unsigned)e - 1);
        next = (unsigned)e + 1;
    }
    if (x >= 0) {
        close_from_to(next, (unsigned)x - 1);
        next = (unsigned)x + 1;
    }
    close_from_to(next, ~0U);
    return 0;
}

/* The child's side of a spawn. Also runs as a CLONE_VM | CLONE_VFORK child (claims): it may
 * only touch its own stack and report through `out`. */
static void child(const struct spawn *s, const int *fds, struct report *out)
    __attribute__((noreturn));

static void child(const struct spawn *s, const int *fds, struct report *out)
{
    /* Die with the launcher, even if it is SIGKILLed (our descendants are its job anyway). */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != g_self)
        _exit(127);

    if (s->pgid == 0) {
        setpgid(0, 0);
    } else if (s->pgid > 0) {
        if (setpgid(0, (pid_t)s->pgid) < 0)
            setpgid(0, 0); /* the group is gone or in another session: a new one */
    }
    if (s->main && s->pgid != -1) {
        /* The session's main program: give it the terminal if our group has it. */
        int tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (tty >= 0) {
            if (tcgetpgrp(tty) == g_pgrp)
                (void)tcsetpgrp(tty, getpgrp()); /* SIGTTOU still ignored here */
            close(tty);
        }
    }

    char msg[MSG_CAP] = "";
    int r;
    /* Before place_fds closes the report socket: the listener leaves through it. */
    if (s->sandbox && g_sandbox.proxy_port > 0 &&
        (r = sb_enter_proxy_netns(&g_sandbox, s->id, msg, sizeof msg)) < 0)
        child_fail(out, -r, "%s", msg);

    int execfd = s->execfd;
    r = place_fds(fds, s->dst, s->nfds, &out->errfd, &execfd);
    if (r < 0)
        child_fail(out, -r, "placing descriptors: %s", strerror(-r));

    for (int i = 0; i < g_nreset; i++)
        signal(g_reset[i], SIG_DFL);
    (void)setrlimit(RLIMIT_NOFILE, &g_nofile);

    if (s->sandbox) {
        /* A confined claim runs the program a stand-in covers (protocol §7
         * authorize-confined): leave that program uncovered in its own sandbox, so that a
         * script's interpreter, which reads it by path, reads the script. */
        struct sb_config confined = g_sandbox;
        if (s->uncover)
            confined.uncovered = s->path;
        r = sb_apply(&confined, s->cwd, msg, sizeof msg);
        if (r < 0)
            child_fail(out, -r, "%s", msg[0] ? msg : strerror(-r));
    } else if (chdir(s->cwd) < 0) {
        child_fail(out, errno, "chdir %s: %s", s->cwd, strerror(errno));
    }

    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (execfd >= 0) /* exactly the file that was judged (an escalation, §7 authorize) */
        syscall(SYS_execveat, execfd, "", s->argv, s->envp, AT_EMPTY_PATH);
    else
        execve(s->path, s->argv, s->envp);
    int e = errno;
    child_fail(out, e, "exec %s: %s", s->path, strerror(e));
}

static int add_proc(const struct proc *p)
{
    if (g_nprocs == g_capprocs) {
        size_t cap = g_capprocs ? g_capprocs * 2 : 16;
        struct proc *v = realloc(g_procs, cap * sizeof *v);
        if (!v)
            return -1;
        g_procs = v;
        g_capprocs = cap;
    }
    g_procs[g_nprocs++] = *p;
    return 0;
}

/* Fork the child for s and track it as p (pid and pipe filled in). 0 or -errno (nothing
 * runs then). */
static int start_child(const struct spawn *s, const int *fds, struct proc *p)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        struct report out = {.errfd = pipefd[1]};
        child(s, fds, &out);
    }
    int e = errno;
    close(pipefd[1]);
    if (pid < 0) {
        close(pipefd[0]);
        return -e;
    }
    p->pid = pid;
    p->pipe = pipefd[0];
    if (add_proc(p) < 0) { /* cannot track it: it must not run */
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
            ;
        close(pipefd[0]);
        return -ENOMEM;
    }
    return 0;
}

struct vfork_args {
    const struct spawn *s;
    const int *fds;
    struct failure *failure;
};

static int vfork_child(void *arg)
{
    struct vfork_args *a = arg;
    struct report out = {.errfd = -1, .shared = a->failure};
    child(a->s, a->fds, &out);
}

/* Spawn an unsandboxed program the cheap way: CLONE_VM | CLONE_VFORK shares our memory (no
 * page tables to copy) and suspends us until the child exec'ed or failed, so the outcome is
 * known on return (no error pipe, no second wake-up). p is tracked as P_RUNNING, or P_FAILED
 * with *failure filled in (the child has exited then). 0 or -errno (nothing ran). */
static int start_child_vfork(const struct spawn *s, const int *fds, struct proc *p,
                             struct failure *failure)
{
    enum { STACK = 256 << 10 };
    static char *stack;
    if (!stack) {
        void *m = mmap(NULL, STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (m == MAP_FAILED)
            return -errno;
        stack = m;
    }
    failure->err = 0;
    failure->msg[0] = '\0';
    struct vfork_args args = {.s = s, .fds = fds, .failure = failure};
    pid_t pid = clone(vfork_child, stack + STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
    if (pid < 0)
        return -errno;
    p->pid = pid;
    p->pipe = -1;
    p->state = *(volatile int *)&failure->err ? P_FAILED : P_RUNNING;
    if (add_proc(p) < 0) {
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
            ;
        return -ENOMEM;
    }
    return 0;
}

/* A claim's N descriptor targets (§4): each a distinct fd number the program gets, in dst.
 * 0, or -1 when one is malformed, out of range or repeated. */
static int read_targets(struct eg_fields *f, long long n, int *dst)
{
    for (long long i = 0; i < n; i++) {
        long long d;
        if (eg_next_long(f, &d) < 0 || d < 0 || d > INT_MAX - 1)
            return -1;
        dst[i] = (int)d;
        for (long long j = 0; j < i; j++)
            if (dst[j] == dst[i])
                return -1;
    }
    return 0;
}

/* Parse a counted list of strings (N · item…) into a NULL-terminated vector. */
static char **counted(struct eg_fields *f)
{
    long long n;
    if (eg_next_long(f, &n) < 0 || n < 0 || n > (long long)EG_MAX_PAYLOAD)
        return NULL;
    char **v = calloc((size_t)n + 1, sizeof *v);
    if (!v)
        return NULL;
    for (long long i = 0; i < n; i++) {
        const char *s = eg_next(f, NULL);
        if (!s) {
            free(v);
            return NULL;
        }
        v[i] = (char *)s;
    }
    return v;
}

/* EG1 · spawn · ID · FLAGS · PGID · CWD · PATH · NFDS · DSTFD… · ARGC · ARGV… · ENVC · ENV…
 * Returns 0, or -EPROTO for a malformed message (the caller ends the session). */
static int handle_spawn(struct eg_fields *f, int *fds, int nfds)
{
    struct spawn s = {.execfd = -1};
    int dst[EG_MAX_FDS];
    long long n;
    size_t flen;
    const char *flags;
    if (eg_next_long(f, &s.id) < 0 || !(flags = eg_next(f, &flen)) ||
        eg_next_long(f, &s.pgid) < 0 || !(s.cwd = eg_next(f, NULL)) ||
        !(s.path = eg_next(f, NULL)) || eg_next_long(f, &n) < 0)
        return -EPROTO;

    /* FLAGS: comma-separated. */
    const char *bad = NULL;
    int execfd = 0;
    for (const char *p = flags; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 7 && !strncmp(p, "sandbox", 7))
            s.sandbox = 1;
        else if (len == 4 && !strncmp(p, "main", 4))
            s.main = 1;
        else if (len == 4 && !strncmp(p, "last", 4))
            s.last = 1;
        else if (len == 6 && !strncmp(p, "execfd", 6))
            execfd = 1;
        else if (len == 4 && !strncmp(p, "held", 4))
            s.held = 1;
        else if (len)
            bad = p;
        p += len + (end ? 1 : 0);
    }
    /* execfd: one more descriptor than NFDS is attached, last: the program to execute (the
     * file the server judged), never placed in the child */
    if (n != nfds - execfd || s.pgid < -1 || s.pgid > INT_MAX)
        return -EPROTO;
    nfds = (int)n;
    if (execfd)
        s.execfd = fds[nfds];
    for (int i = 0; i < nfds; i++) {
        long long d;
        if (eg_next_long(f, &d) < 0 || d < 0 || d > INT_MAX - 1)
            return -EPROTO;
        dst[i] = (int)d;
        for (int j = 0; j < i; j++)
            if (dst[j] == dst[i])
                return -EPROTO;
        if (s.held && dst[i] == EG_HOLD_FD) /* that number is the hold socket's */
            return -EPROTO;
    }
    s.nfds = nfds;
    s.dst = dst;
    s.argv = counted(f);
    s.envp = s.argv ? counted(f) : NULL;
    if (!s.argv || !s.envp || !eg_fields_done(f)) {
        free(s.argv);
        free(s.envp);
        return -EPROTO;
    }

    if (bad) {
        send_failed(s.id, EINVAL, "unknown spawn flag");
    } else if (find_id(s.id)) {
        send_failed(s.id, EEXIST, "spawn id already in use");
    } else if (!s.path[0] || !s.cwd[0]) {
        send_failed(s.id, EINVAL, "empty program path or working directory");
    } else {
        struct proc p = {.id = s.id, .state = P_PENDING, .main = s.main, .last = s.last,
                         .pgid = -1, .hold = -1};
        /* A held spawn: the child gets one end of a socket pair we made at EG_HOLD_FD, its
         * interposer waits there for `release` (protocol §7 "Held spawns"). */
        int hold[2] = {-1, -1}, placed[EG_MAX_FDS + 1], targets[EG_MAX_FDS + 1];
        const int *src = fds;
        if (s.held) {
            if (nfds >= EG_MAX_FDS ||
                socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, hold) < 0) {
                send_failed(s.id, nfds >= EG_MAX_FDS ? E2BIG : errno, "hold socket");
                goto done;
            }
            memcpy(placed, fds, (size_t)nfds * sizeof *fds);
            memcpy(targets, dst, (size_t)nfds * sizeof *dst);
            placed[nfds] = hold[1];
            targets[nfds] = EG_HOLD_FD;
            src = placed;
            s.dst = targets;
            s.nfds = nfds + 1;
            p.hold = hold[0];
        }
        if (s.sandbox) { /* forked: the sandbox set-up allocates (and may need a user ns) */
            int r = start_child(&s, src, &p);
            if (r < 0)
                send_failed(s.id, -r, strerror(-r));
        } else { /* the cheap way: no page tables to copy, no error pipe to wait on */
            struct failure failure;
            int r = start_child_vfork(&s, src, &p, &failure);
            struct proc *q = r < 0 ? NULL : find_id(s.id);
            if (!q)
                send_failed(s.id, r < 0 ? -r : ENOMEM, strerror(r < 0 ? -r : ENOMEM));
            else if (q->state == P_FAILED)
                send_failed(s.id, failure.err, failure.msg);
            else {
                if (q->main)
                    q->pgid = getpgid(q->pid);
                send_spawned(s.id, q->pid);
            }
        }
        if (s.held) {
            close(hold[1]); /* the child's */
            if (!find_id(s.id)) /* not tracked: nobody else closes ours (remove_proc does) */
                close(hold[0]);
        }
    }
done:
    free(s.argv);
    free(s.envp);
    return 0;
}

/* EG1 · release · ID · LAST · CWD · NFDS · DSTFD… · ARGC · ARGV… · ENVC · ENV… with NFDS
 * descriptors (protocol §7 "Held spawns"): everything after LAST goes to the held child as
 * its `release` frame, with the descriptors, and the hold socket is closed. Returns 0, or
 * -EPROTO for a malformed message; a spawn that is not held (or is gone) gets `failed`. */
static int handle_release(struct eg_fields *f, int *fds, int nfds)
{
    long long id, last;
    if (eg_next_long(f, &id) < 0 || eg_next_long(f, &last) < 0 || (last != 0 && last != 1))
        return -EPROTO;
    const char *rest = f->p;
    size_t restlen = (size_t)(f->end - f->p);
    struct proc *p = find_id(id);
    if (!p || p->hold < 0 || p->state != P_RUNNING) {
        send_failed(id, ESRCH, "no held program to release");
        return 0;
    }
    size_t cap = EG_HEADER + sizeof EG_TAG + sizeof "release" + restlen;
    char *mem = malloc(cap);
    if (!mem) {
        send_failed(id, ENOMEM, strerror(ENOMEM));
        return 0;
    }
    struct eg_buf b;
    eg_buf_init(&b, mem, cap);
    eg_put(&b, EG_TAG);
    eg_put(&b, "release");
    memcpy(b.data + b.len, rest, restlen); /* the fields as they came, verbatim: cap fits */
    b.len += restlen;
    int r = eg_send_frame(p->hold, &b, fds, nfds);
    free(mem);
    close(p->hold);
    p->hold = -1;
    if (r < 0) { /* it died meanwhile (its exit comes as usual) or the frame was too big */
        kill(p->pid, SIGKILL);
        send_failed(id, -r, "releasing the held program");
        return 0;
    }
    p->last = (int)last;
    return 0;
}

/* -- escalation tickets (control message `authorize`) --------------------------------------- */

static void free_ticket(struct ticket *t)
{
    if (!t)
        return;
    free(t->argv);
    free(t->drop);
    free(t->prefix);
    free(t->keep);
    free(t->set);
    free(t->skip);
    free(t->mem);
    if (t->fd >= 0)
        close(t->fd);
    free(t);
}

static void unlink_ticket(struct ticket **pp)
{
    *pp = (*pp)->next;
    g_ntickets--;
}

static void drop_expired_tickets(void)
{
    long long now = now_ms();
    for (struct ticket **pp = &g_tickets; *pp;) {
        struct ticket *t = *pp;
        if (now >= t->expires) {
            unlink_ticket(pp);
            free_ticket(t);
        } else {
            pp = &t->next;
        }
    }
}

/* Remove the ticket named id from the table and return it (NULL: unknown). Single use. */
static struct ticket *take_ticket(const char *id)
{
    for (struct ticket **pp = &g_tickets; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->id, id)) {
            struct ticket *t = *pp;
            unlink_ticket(pp);
            return t;
        }
    }
    return NULL;
}

/* EG1 · authorize · TICKET · LIFETIME_MS · TOKEN · DISPLAY · PATH · CWD · ARGC · ARGV… ·
 *       DROPC · NAME… · PREFIXC · PREFIX… · KEEPC · ENTRY… · SETC · ENTRY…   + the program's fd
 * (`authorize-confined`: the same fields; the claim runs the program inside the sandbox).
 * Takes ownership of payload (the ticket's strings point into it) and of fd. 0 or -EPROTO. */
static int handle_authorize(struct eg_fields *f, char *payload, int fd, int confined)
{
    struct ticket *t = calloc(1, sizeof *t);
    if (!t) {
        free(payload);
        close(fd);
        return 0; /* not authorized: its claim is denied */
    }
    t->mem = payload;
    t->fd = fd;
    t->confined = confined;
    long long lifetime;
    size_t idlen;
    if (!(t->id = eg_next(f, &idlen)) || eg_next_long(f, &lifetime) < 0 ||
        !(t->token = eg_next(f, NULL)) || !(t->display = eg_next(f, NULL)) ||
        !(t->path = eg_next(f, NULL)) || !(t->cwd = eg_next(f, NULL)) || !(t->argv = counted(f)) ||
        !(t->drop = counted(f)) || !(t->prefix = counted(f)) || !(t->keep = counted(f)) ||
        !(t->set = counted(f)) || !eg_fields_done(f) || idlen == 0 || idlen > MAX_TICKET ||
        lifetime < 0 || !t->path[0] || !t->cwd[0]) {
        free_ticket(t);
        return -EPROTO;
    }
    for (char **e = t->set; *e; e++)
        if (!strchr(*e, '=')) {
            free_ticket(t);
            return -EPROTO;
        }
    struct stat st;
    if (fstat(t->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        free_ticket(t);
        return -EPROTO;
    }
    t->expires = now_ms() + (lifetime > MAX_LIFETIME_MS ? MAX_LIFETIME_MS : lifetime);
    drop_expired_tickets();
    free_ticket(take_ticket(t->id)); /* the same ticket again replaces it */
    if (g_ntickets >= MAX_TICKETS) { /* the oldest (last) one goes: its claim is denied */
        struct ticket **pp = &g_tickets;
        while ((*pp)->next)
            pp = &(*pp)->next;
        struct ticket *old = *pp;
        unlink_ticket(pp);
        free_ticket(old);
    }
    t->next = g_tickets;
    g_tickets = t;
    g_ntickets++;
    return 0;
}

/* Every standing authorization goes (control message `revoke`, or the server is gone). */
static void revoke_standing(void)
{
    while (g_standing) {
        struct ticket *t = g_standing;
        g_standing = t->next;
        free_ticket(t);
    }
    g_nstanding = 0;
    g_standing_bytes = 0;
}

/* EG1 · standing · ID · TOKEN · DISPLAY · PATH · REALPATH · CWD · DEV · INO · CTIME_NS ·
 *       MTIME_NS · SIZE · MODE · NLINK · STANDIN_DEV · STANDIN_INO · ARGC · ARGV… ·
 *       DROPC · NAME… · PREFIXC · PREFIX… ·
 *       KEEPC · ENTRY… · SETC · ENTRY…
 *   + the program's fd, the server's folder watch, the socket claims are reported on
 * Takes ownership of payload and the three fds. 0 or -EPROTO. */
static int handle_standing(struct eg_fields *f, char *payload, size_t len, const int fds[3])
{
    int fd = fds[0], watch = fds[1], reports = fds[2];
    struct ticket *t = len <= MAX_STANDING_BYTES ? calloc(1, sizeof *t) : NULL;
    if (!t) {
        free(payload);
        close(fd);
        close(watch);
        close(reports);
        return 0; /* not kept: its claims ask the server */
    }
    t->mem = payload;
    t->memlen = len;
    t->fd = fd;
    size_t idlen;
    if (!(t->id = eg_next(f, &idlen)) || !(t->token = eg_next(f, NULL)) ||
        !(t->display = eg_next(f, NULL)) || !(t->path = eg_next(f, NULL)) ||
        !(t->realpath = eg_next(f, NULL)) || !(t->cwd = eg_next(f, NULL)) ||
        eg_next_long(f, &t->dev) < 0 || eg_next_long(f, &t->ino) < 0 ||
        eg_next_long(f, &t->ctime_ns) < 0 || eg_next_long(f, &t->mtime_ns) < 0 ||
        eg_next_long(f, &t->size) < 0 || eg_next_long(f, &t->mode) < 0 ||
        eg_next_long(f, &t->nlink) < 0 || eg_next_long(f, &t->standin_dev) < 0 ||
        eg_next_long(f, &t->standin_ino) < 0 || !(t->argv = counted(f)) ||
        !(t->drop = counted(f)) ||
        !(t->prefix = counted(f)) || !(t->keep = counted(f)) || !(t->set = counted(f)) ||
        !eg_fields_done(f) || idlen == 0 || idlen > MAX_TICKET || t->path[0] != '/' ||
        t->cwd[0] != '/' || t->realpath[0] != '/' || !t->argv[0] || !t->standin_ino) {
        free_ticket(t);
        close(watch);
        close(reports);
        return -EPROTO;
    }
    for (char **e = t->set; *e; e++)
        if (!strchr(*e, '=')) {
            free_ticket(t);
            close(watch);
            close(reports);
            return -EPROTO;
        }
    while (t->argv[t->argc])
        t->argc++;
    /* The judged file is the one the fields describe: while its descriptor is held, no other
     * file can take its (dev, ino), so a claim compares the path's fstat with the fields. */
    struct stat st, sock;
    int type = 0;
    socklen_t typelen = sizeof type;
    if (fstat(t->fd, &st) < 0 || !S_ISREG(st.st_mode) || (long long)st.st_dev != t->dev ||
        (long long)st.st_ino != t->ino || fstat(watch, &sock) < 0 ||
        getsockopt(reports, SOL_SOCKET, SO_TYPE, &type, &typelen) < 0 ||
        type != SOCK_SEQPACKET) {
        free_ticket(t);
        close(watch);
        close(reports);
        return -EPROTO;
    }
    if (g_watch >= 0)
        close(g_watch);
    g_watch = watch;
    if (g_reports >= 0)
        close(g_reports);
    g_reports = reports;
    while (g_standing && (g_nstanding >= MAX_STANDING ||
                          g_standing_bytes + len > MAX_STANDING_BYTES)) { /* the oldest goes */
        struct ticket **pp = &g_standing;
        while ((*pp)->next)
            pp = &(*pp)->next;
        g_standing_bytes -= (*pp)->memlen;
        free_ticket(*pp);
        *pp = NULL;
        g_nstanding--;
    }
    t->next = g_standing;
    g_standing = t;
    g_nstanding++;
    g_standing_bytes += len;
    return 0;
}

static uint64_t name_hash(const char *name, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t k = 0; k < n; k++)
        h = (h ^ (unsigned char)name[k]) * 0x100000001b3ULL;
    return h;
}

static size_t name_len(const char *s)
{
    const char *eq = strchr(s, '=');
    return eq ? (size_t)(eq - s) : strlen(s);
}

/* Is the n bytes at name one of t's skipped names (t->skip: a NAME or a NAME=value)? */
static int skipped(const struct ticket *t, const char *name, size_t n)
{
    for (size_t at = (size_t)name_hash(name, n) & (t->nslots - 1); t->skip[at];
         at = (at + 1) & (t->nslots - 1))
        if (name_len(t->skip[at]) == n && !memcmp(t->skip[at], name, n))
            return 1;
    return 0;
}

/* t->skip from DROP and SET's names, once: an exec's environment is looked up name by name
 * instead of against each of the ~100 rules. 0, or -1 (out of memory). */
static int index_skipped(struct ticket *t)
{
    if (t->skip)
        return 0;
    size_t n = 0;
    for (char **d = t->drop; *d; d++)
        n++;
    for (char **e = t->set; *e; e++)
        n++;
    size_t cap = 16;
    while (cap < 2 * (n + 1))
        cap *= 2;
    const char **skip = calloc(cap, sizeof *skip);
    if (!skip)
        return -1;
    for (int list = 0; list < 2; list++)
        for (char **e = list ? t->set : t->drop; *e; e++) {
            if (!list && strchr(*e, '='))
                continue; /* a name to drop with '=' in it matches no variable's name */
            size_t k = name_len(*e);
            size_t at = (size_t)name_hash(*e, k) & (cap - 1);
            while (skip[at])
                at = (at + 1) & (cap - 1);
            skip[at] = *e;
        }
    t->skip = skip;
    t->nslots = cap;
    return 0;
}

/* The escalated program's environment: the claimer's, through the ticket's rules (§7):
 * entries without '=' and names in DROP go; names with a PREFIX go unless the entry is one of
 * KEEP; names SET assigns go; the last value of a repeated name wins, at its first place; then
 * the SET entries are appended. The strings stay the caller's; the vector is malloc'ed. */
static char **apply_env(struct ticket *t, char **env)
{
    size_t n = 0, nset = 0;
    while (env[n])
        n++;
    while (t->set[nset])
        nset++;
    size_t cap = 16;
    while (cap < 2 * (n + 1))
        cap *= 2;
    if (index_skipped(t) < 0)
        return NULL;
    char **out = malloc((n + nset + 1) * sizeof *out);
    size_t *slot = malloc(cap * sizeof *slot); /* hash of kept names -> index + 1 in out */
    if (!out || !slot) {
        free(out);
        free(slot);
        return NULL;
    }
    memset(slot, 0, cap * sizeof *slot);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        char *e = env[i];
        const char *eq = strchr(e, '=');
        if (!eq)
            continue;
        size_t nl = (size_t)(eq - e);
        int skip = skipped(t, e, nl);
        for (char **p = t->prefix; *p && !skip; p++) {
            size_t pl = strlen(*p);
            if (pl <= nl && !strncmp(e, *p, pl)) {
                skip = 1;
                for (char **k = t->keep; *k && skip; k++)
                    skip = strcmp(*k, e) != 0;
            }
        }
        if (skip)
            continue;
        size_t at = (size_t)name_hash(e, nl) & (cap - 1);
        while (slot[at] && strncmp(out[slot[at] - 1], e, nl + 1) != 0)
            at = (at + 1) & (cap - 1);
        if (slot[at]) {
            out[slot[at] - 1] = e; /* a repeated name: the last value wins, at the first place */
        } else {
            out[m] = e;
            slot[at] = ++m;
        }
    }
    for (size_t j = 0; j < nset; j++)
        out[m++] = t->set[j];
    out[m] = NULL;
    free(slot);
    return out;
}

/* -- claim connections (protocol §4) ---------------------------------------------------------- */

/* Its claim frame is complete, or it closed: it leaves the bounds of unfinished claims. */
static void conn_settle(struct conn *c)
{
    if (!c->unfinished)
        return;
    c->unfinished = 0;
    g_unfinished--;
    g_unfinished_bytes -= c->incap;
}

static void conn_release(struct conn *c)
{
    c->next_dead = g_dead;
    g_dead = c;
}

static void free_dead_conns(void)
{
    while (g_dead) {
        struct conn *c = g_dead;
        g_dead = c->next_dead;
        free(c->in);
        free(c->display);
        free(c);
    }
}

/* Answered claim connections, closed at our next wake-up (LINGER_MS at the latest). Closed
 * right after the answer, the close woke the claimer a second time (its end of the
 * connection changed state), about as costly as the answer's own wake-up; by our next
 * wake-up it has read its answer and gone, and the close wakes no one. */
static int g_linger[64];
static int g_nlinger;

static void close_lingering(void)
{
    while (g_nlinger > 0)
        close(g_linger[--g_nlinger]);
}

/* conn_close; linger (an answered connection): its socket is closed by close_lingering, if
 * there is room for it there. */
static void conn_drop(struct conn *c, int linger)
{
    if (c->fd < 0)
        return;
    conn_settle(c);
    for (int i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    c->nfds = 0;
    if (linger && g_nlinger < (int)(sizeof g_linger / sizeof g_linger[0]))
        g_linger[g_nlinger++] = c->fd;
    else
        close(c->fd);
    c->fd = -1;
    for (size_t i = 0; i < g_nconns; i++)
        if (g_conns[i] == c) {
            g_conns[i] = g_conns[--g_nconns];
            break;
        }
    if (c->pid > 0)
        kill(c->pid, SIGKILL); /* not reaped yet: still this process */
    else
        conn_release(c);
}

/* Close the connection. A program it claimed that has not been reaped yet is killed: its
 * claimer is gone (or has been answered already, and then it is dead anyway). */
static void conn_close(struct conn *c)
{
    conn_drop(c, 0);
}

/* Start the answer frame EG1 · KIND in mem. */
static void answer_frame(struct eg_buf *b, char *mem, size_t cap, const char *kind)
{
    eg_buf_init(b, mem, cap);
    eg_put(b, EG_TAG);
    eg_put(b, kind);
}

static void conn_send(struct conn *c, const char *kind, const char *text, long long num)
{
    char mem[MSG_CAP * 8 + 64];
    struct eg_buf b;
    answer_frame(&b, mem, sizeof mem, kind);
    if (text)
        eg_put_n(&b, text, strnlen(text, MSG_CAP * 8));
    else
        eg_put_long(&b, num);
    (void)eg_send_frame(c->fd, &b, NULL, 0); /* one small frame into an empty buffer */
}

static void conn_deny(struct conn *c, const char *a, const char *b, const char *d,
                      const char *e)
{
    char msg[MSG_CAP * 8];
    snprintf(msg, sizeof msg, "%s%s%s%s", a, b ? b : "", d ? d : "", e ? e : "");
    for (char *p = msg; *p; p++)
        if (*p == '\n')
            *p = ' ';
    conn_send(c, "deny", msg, 0);
    conn_close(c);
}

/* The program's exec failed in the child (resolve()). */
static void claim_failed(struct conn *c, const char *message)
{
    if (c->fd < 0)
        return;
    char who[MSG_CAP + 64];
    snprintf(who, sizeof who, "execgate: cannot run %s: ", c->display ? c->display : "");
    conn_deny(c, who, message, NULL, NULL);
}

/* The program exec'ed: signals that came meanwhile reach it now. */
static void claim_running(struct conn *c)
{
    c->running = 1;
    for (int sig = 1; sig <= 64 && c->held; sig++)
        if (c->held & (1ULL << (sig - 1))) {
            c->held &= ~(1ULL << (sig - 1));
            kill(c->pid, sig);
        }
}

static void conn_send_kind(struct conn *c, const char *kind);

/* A standing claim's `go`, if it is owed. */
static void send_go(struct conn *c)
{
    if (c->go_due && c->fd >= 0)
        conn_send_kind(c, "go");
    c->go_due = 0;
}

/* The program was reaped with wait status `status` (ran: it had exec'ed). */
static void claim_ended(struct conn *c, int ran, int status)
{
    c->pid = 0;
    if (c->fd < 0) {
        conn_release(c); /* its claimer is gone */
        return;
    }
    if (!ran) {
        send_go(c);
        conn_close(c);
        return;
    }
    /* An owed `go` and the end go out in one write: sent apart, the claimer woke at the
     * first, took over its signals and descriptors for nothing, and slept again. */
    char mem[128];
    struct eg_buf b;
    size_t at = 0; /* where the end's frame starts: after the `go` */
    if (c->go_due) {
        answer_frame(&b, mem, sizeof mem / 2, "go");
        if (eg_seal_frame(&b) == 0)
            at = b.len;
    }
    c->go_due = 0;
    answer_frame(&b, mem + at, sizeof mem - at, WIFSIGNALED(status) ? "signal" : "exit");
    eg_put_long(&b, WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    if (eg_seal_frame(&b) == 0)
        (void)eg_write_all(c->fd, mem, at + b.len); /* small frames into an empty buffer */
    conn_drop(c, 1);
}

static int control_step(void);

/* Pending control messages, without waiting: an `authorize` the server posted before
 * answering the exec request is in the control socket before the claim can arrive. */
static void drain_control(void)
{
    while (g_control >= 0) {
        struct pollfd p = {.fd = g_control, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0)
            return;
        control_step();
    }
}

/* A claim from inside the sandbox: look at the git repository the program would start in
 * again, now, through the claimer's root, and pin it in *envp (gitrepo.h) — the server's look
 * (gate/gitrepo.py) was at the decision, before the claimer could make one. 1: go on; 0: denied
 * (answered). repo holds the pinned entries: it must outlive the spawn. */
static int pin_repository(struct conn *c, const struct ticket *t, char ***envp,
                          struct gr_found *repo)
{
    int pidfd = gr_peer_pidfd(c->fd);
    enum gr_outcome where = gr_examine_claim(pidfd, c->peer, t->cwd, repo, t->realpath != NULL);
    if (pidfd >= 0)
        close(pidfd);
    switch (where) {
    case GR_AS_IS:
        return 1;
    case GR_PIN: {
        char **pinned = gr_pin_env(*envp, repo);
        if (!pinned)
            break;
        free(*envp);
        *envp = pinned;
        return 1;
    }
    case GR_WRITABLE:
        if (repo->dot_git[0])
            conn_deny(c, "execgate: not escalated: ", t->display, ": it would start in the git "
                      "repository ", repo->dot_git);
        else
            conn_deny(c, "execgate: not escalated: ", t->display, ": its working directory "
                      "cannot be examined from the sandbox", NULL);
        return 0;
    }
    conn_deny(c, "execgate: cannot run ", t->display, ": out of memory", NULL);
    return 0;
}

/* -- standing claims (protocol §4 "Standing claims") ----------------------------------------- */


/* EG1 · KIND: a standing claim's first answer, `go` (its program started) or `miss`. */
static void conn_send_kind(struct conn *c, const char *kind)
{
    char mem[64];
    struct eg_buf b;
    answer_frame(&b, mem, sizeof mem, kind);
    (void)eg_send_frame(c->fd, &b, NULL, 0);
}

/* Not a standing hit: the claimer asks the server as usual (it still holds everything). */
static void conn_miss(struct conn *c)
{
    conn_send_kind(c, "miss");
    conn_close(c);
}

/* envp with the repository pinned (gitrepo.h); envp is freed. NULL: out of memory. */
static char **pin_standing(char **envp, struct gr_found *repo)
{
    char **pinned = gr_pin_env(envp, repo);
    free(envp);
    return pinned;
}

/* The standing authorization the claim names: token, PATH and argv byte-equal. */
static struct ticket *find_standing(const char *token, const char *path, char **argv,
                                    size_t argc)
{
    for (struct ticket *t = g_standing; t; t = t->next) {
        if (t->argc != argc || strcmp(t->path, path) || strcmp(t->token, token))
            continue;
        size_t i = 0;
        while (i < argc && !strcmp(t->argv[i], argv[i]))
            i++;
        if (i == argc)
            return t;
    }
    return NULL;
}

static long long ns_of(const struct timespec *ts)
{
    return (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

/* fstat of the file the canonical path `real` names now, into *st; 0 when it names none or
 * reaches it through a symlink (then it is not its canonical path any more). A canonical path
 * has no ".", ".." or symlink, so opened through no symlink it is the opened file's canonical
 * path; before Linux 5.6 (no openat2) the opened file's path is read back from /proc. */
static int canonical_stat(const char *real, struct stat *st)
{
    int fd = eg_sys_open_no_symlinks(real, O_PATH | O_CLOEXEC);
    if (fd == -ENOSYS) {
        fd = open(real, O_PATH | O_CLOEXEC);
        if (fd < 0)
            return 0;
        char link[64], back[PATH_MAX + 1];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, back, sizeof back - 1);
        if (n <= 0 || (size_t)n != strlen(real) || memcmp(back, real, (size_t)n)) {
            close(fd);
            return 0;
        }
    }
    if (fd < 0)
        return 0;
    int r = fstat(fd, st);
    close(fd);
    return r == 0;
}

/* Every fact the server judged, derived again here, now, from the claimer and the file
 * (never from what the claimer says): the descriptor it attached is the judged file
 * (dev, ino) and that file did not change since the server looked at it (ctime, which every
 * change of content, mode, owner, links or extended attributes moves, and the rest of the
 * fstat); the descriptor's canonical path; PATH names that file (or is that path), as the
 * server's vouched() derives it; the claimer's working directory (/proc: the caller checks
 * the claimer's pidfd afterwards, gr_examine_claim). 1: all equal. */
static int standing_holds(const struct ticket *t, struct conn *c, int prog, int pidfd)
{
    struct stat theirs;
    /* The claimer's descriptor must be the very stand-in the request came through (§5), and
     * the file judged is the program it covers, opened by its path, as the server does. */
    if (fstat(prog, &theirs) < 0 || (long long)theirs.st_dev != t->standin_dev ||
        (long long)theirs.st_ino != t->standin_ino)
        return 0;
    if (!canonical_stat(t->realpath, &theirs))
        return 0;
    /* The kept descriptor holds the file of (t->dev, t->ino) (handle_standing): the same
     * (dev, ino) at the path is that very file, and its fstat now is the server's. */
    if (!S_ISREG(theirs.st_mode) || (long long)theirs.st_dev != t->dev ||
        (long long)theirs.st_ino != t->ino || ns_of(&theirs.st_ctim) != t->ctime_ns ||
        ns_of(&theirs.st_mtim) != t->mtime_ns || (long long)theirs.st_size != t->size ||
        (long long)theirs.st_mode != t->mode || (long long)theirs.st_nlink != t->nlink)
        return 0;
    if (strcmp(t->path, t->realpath)) {
        struct stat named;
        if (stat(t->path, &named) < 0 || named.st_dev != theirs.st_dev ||
            named.st_ino != theirs.st_ino)
            return 0;
    }
    if (pidfd < 0)
        return 0; /* no pidfd (Linux < 6.5): no standing claims */
    char link[64], cwd[PATH_MAX + 1];
    snprintf(link, sizeof link, "/proc/%d/cwd", (int)c->peer);
    ssize_t n = readlink(link, cwd, sizeof cwd - 1);
    if (n <= 0)
        return 0;
    cwd[n] = '\0';
    return !strcmp(cwd, t->cwd);
}

/* EG1 · standing · TOKEN · PATH · ARGC · ARGV… · NFDS · FD… · ENVC · ENV…
 *   (+ the NFDS descriptors, then the program's)
 * Answers `miss` unless a standing authorization holds for every fact (standing_holds, the
 * repository at the claim); then reports the claim to the server, answers `go` and runs the
 * launcher's own descriptor of the judged file, as a claim of a ticket does. */
static void handle_standing_claim(struct conn *c, struct eg_fields *f)
{
    const char *token, *path;
    long long argc, n;
    int dst[EG_MAX_FDS];
    if (!(token = eg_next(f, NULL)) || !(path = eg_next(f, NULL)) ||
        eg_next_long(f, &argc) < 0 || argc < 1 || argc > (long long)EG_MAX_PAYLOAD) {
        conn_close(c);
        return;
    }
    char **argv = calloc((size_t)argc + 1, sizeof *argv);
    if (!argv) {
        conn_close(c);
        return;
    }
    for (long long i = 0; i < argc; i++)
        if (!(argv[i] = (char *)eg_next(f, NULL))) {
            free(argv);
            conn_close(c);
            return;
        }
    if (eg_next_long(f, &n) < 0 || n < 0 || n >= EG_MAX_FDS || n + 1 != c->nfds) {
        free(argv);
        conn_close(c);
        return;
    }
    if (read_targets(f, n, dst) < 0) {
        free(argv);
        conn_close(c);
        return;
    }
    char **env = counted(f);
    if (!env || !eg_fields_done(f)) {
        free(env);
        free(argv);
        conn_close(c);
        return;
    }
    /* Revoked since? The server writes `revoke` before it reads a change from its folder
     * watch, so: a change still queued there, or a `revoke` pending on the control channel
     * (read after the watch, in this order), and this claim is a miss. */
    int queued = 1;
    if (g_watch >= 0 && ioctl(g_watch, FIONREAD, &queued) < 0)
        queued = 1;
    if (!queued)
        drain_control();
    struct ticket *t = NULL;
    if (!queued && g_control >= 0 && g_reports >= 0)
        t = find_standing(token, path, argv, (size_t)argc);
    int prog = c->fds[c->nfds - 1];
    char **envp = NULL;
    struct gr_found repo;
    enum gr_outcome where = GR_WRITABLE;
    pid_t ppid = 0;
    int pidfd = t ? gr_peer_pidfd(c->fd) : -1;
    if (t && standing_holds(t, c, prog, pidfd)) {
        /* for the claim's decision record */
        if (eg_pidfd_ppid(pidfd, &ppid) < 0 && eg_read_stat(c->peer, &ppid, NULL) < 0)
            ppid = 0;
        /* (checks the pidfd last: the /proc reads above were the claimer's) */
        where = gr_examine_claim(pidfd, c->peer, t->cwd, &repo, 1);
    }
    if (pidfd >= 0)
        close(pidfd);
    if (where == GR_WRITABLE || !(envp = apply_env(t, env)) ||
        (where == GR_PIN && !(envp = pin_standing(envp, &repo))) ||
        !(c->display = strdup(t->display))) {
        free(envp);
        free(env);
        free(argv);
        conn_miss(c);
        return;
    }
    /* Reported before it runs: the server logs every escalation. The report waits in the
     * socket until the server reads it (in batches: no wake-up of the server per claim); a
     * full socket (the server is behind) is a miss, the server gone takes every standing
     * authorization along. One datagram: never half a report. */
    char mem[MAX_TICKET + 128];
    struct eg_buf b;
    eg_buf_init(&b, mem, sizeof mem);
    eg_put(&b, EG_TAG);
    eg_put(&b, "stood");
    eg_put(&b, t->id);
    eg_put_long(&b, c->peer);
    eg_put_long(&b, ppid);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    eg_put_long(&b, (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000);
    ssize_t sent = -1;
    if (eg_seal_frame(&b) == 0)
        sent = send(g_reports, b.data, b.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent != (ssize_t)b.len) {
        if (sent >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            close(g_reports);
            g_reports = -1;
            revoke_standing();
        }
        free(envp);
        free(env);
        free(argv);
        conn_miss(c);
        return;
    }
    close(prog);
    c->nfds--;
    pid_t pgid = getpgid(c->peer);
    struct spawn s = {.pgid = pgid > 0 ? pgid : 0, .cwd = t->cwd, .path = t->realpath,
                      .execfd = t->fd, .nfds = c->nfds, .dst = dst, .argv = t->argv,
                      .envp = envp};
    struct proc p = {.id = -1, .state = P_PENDING, .pgid = -1, .conn = c, .hold = -1};
    struct failure failure;
    int r = start_child_vfork(&s, c->fds, &p, &failure);
    for (int i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    c->nfds = 0;
    if (r < 0) {
        conn_deny(c, "execgate: cannot run ", t->display, ": cannot start it: ", strerror(-r));
    } else {
        c->pid = p.pid;
        if (p.state == P_FAILED) {
            claim_failed(c, failure.msg); /* (a `deny` instead of `go`) */
        } else {
            /* `go` once the program runs (vfork: it has exec'ed), and not at once: waking the
             * claimer would take the CPU the program starts on (we resume before it, ~25 µs).
             * It is owed GO_AFTER_MS from now, or comes with the program's end (a short
             * program's claimer then wakes once, for both). */
            c->go_due = now_ms() + GO_AFTER_MS;
            claim_running(c);
        }
    }
    free(envp);
    free(env);
    free(argv);
}

/* EG1 · claim · TOKEN · TICKET · NFDS · FD… · ENVC · ENV…   (+ the NFDS descriptors)
 * Answers deny, or spawns the program (its end is answered by claim_ended). */
static void handle_claim(struct conn *c, char *payload, size_t len)
{
    struct eg_fields f;
    eg_fields_init(&f, payload, len);
    const char *tag = eg_next(&f, NULL), *kind = eg_next(&f, NULL), *token, *id;
    long long n;
    int dst[EG_MAX_FDS];
    if (tag && kind && !strcmp(tag, EG_TAG) && !strcmp(kind, "standing") && !c->bad) {
        handle_standing_claim(c, &f);
        return;
    }
    if (!tag || !kind || strcmp(tag, EG_TAG) || strcmp(kind, "claim") || c->bad ||
        !(token = eg_next(&f, NULL)) || !(id = eg_next(&f, NULL)) || eg_next_long(&f, &n) < 0 ||
        n < 0 || n > EG_MAX_FDS) {
        conn_close(c); /* malformed: no answer */
        return;
    }
    if (read_targets(&f, n, dst) < 0) {
        conn_close(c);
        return;
    }
    char **env = counted(&f);
    if (!env || !eg_fields_done(&f)) {
        free(env);
        conn_close(c);
        return;
    }

    struct ticket *t = take_ticket(id);
    if (!t) {
        drain_control();
        t = take_ticket(id);
    }
    char **envp = NULL;
    struct gr_found repo;
    if (!t || now_ms() >= t->expires) {
        conn_deny(c, "execgate: escalation ticket unknown or expired", NULL, NULL, NULL);
    } else if (strcmp(token, t->token)) {
        conn_deny(c, "execgate: claim not from this session", NULL, NULL, NULL);
    } else if (n != c->nfds) {
        conn_deny(c, "execgate: descriptor count mismatch", NULL, NULL, NULL);
    } else if (!(envp = apply_env(t, env)) || !(c->display = strdup(t->display))) {
        conn_deny(c, "execgate: cannot run ", t->display, ": out of memory", NULL);
    } else if (!t->confined && g_sandbox.mode != SB_OFF && !pin_repository(c, t, &envp, &repo)) {
        ; /* denied: it would start in a git repository its sandbox can write */
    } else {
        pid_t pgid = getpgid(c->peer); /* the claimer's group: the terminal's signals reach it */
        struct spawn s = {.pgid = pgid > 0 ? pgid : 0, .cwd = t->cwd, .path = t->path,
                          .execfd = t->fd, .nfds = c->nfds, .dst = dst, .argv = t->argv, .envp = envp,
                          .sandbox = t->confined, .uncover = t->confined};
        struct proc p = {.id = -1, .state = P_PENDING, .pgid = -1, .conn = c, .hold = -1};
        struct failure failure;
        /* A confined claim sets up a sandbox (allocations, namespaces): a forked child, whose
         * outcome resolve() reports when its error pipe closes. */
        int r = t->confined ? start_child(&s, c->fds, &p) : start_child_vfork(&s, c->fds, &p, &failure);
        for (int i = 0; i < c->nfds; i++)
            close(c->fds[i]);
        c->nfds = 0;
        if (r < 0) {
            conn_deny(c, "execgate: cannot run ", t->display, ": cannot start it: ",
                      strerror(-r));
        } else {
            c->pid = p.pid; /* the proc entry refers to c from now on */
            if (p.state == P_PENDING)
                ; /* confined: resolve() tells the claimer */
            else if (p.state == P_FAILED)
                claim_failed(c, failure.msg);
            else
                claim_running(c);
        }
    }
    free(envp);
    free(env);
    free_ticket(t);
}

/* EG1 · signal · SIGNUM from the claimer. 0, or -1: malformed. */
static int handle_claimer_signal(struct conn *c, char *payload, size_t len)
{
    struct eg_fields f;
    eg_fields_init(&f, payload, len);
    const char *tag = eg_next(&f, NULL), *kind = eg_next(&f, NULL);
    long long sig;
    if (!tag || !kind || strcmp(tag, EG_TAG) || strcmp(kind, "signal") ||
        eg_next_long(&f, &sig) < 0 || !eg_fields_done(&f) || sig < 1 || sig > 64)
        return -1;
    if (c->pid <= 0)
        return 0;
    if (c->running)
        kill(c->pid, (int)sig);
    else
        c->held |= 1ULL << (sig - 1);
    return 0;
}

/* Read what the connection has (never blocking) and handle every complete frame. */
static void conn_input(struct conn *c)
{
    for (int rounds = 0; rounds < 16 && c->fd >= 0; rounds++) {
        size_t want = 65536;
        if (c->inlen >= EG_HEADER) {
            uint32_t len = (uint32_t)(unsigned char)c->in[0] |
                           (uint32_t)(unsigned char)c->in[1] << 8 |
                           (uint32_t)(unsigned char)c->in[2] << 16 |
                           (uint32_t)(unsigned char)c->in[3] << 24;
            if (len == 0 || len > (c->claimed ? MAX_SIGNAL_FRAME : EG_MAX_PAYLOAD)) {
                conn_close(c);
                return;
            }
            if (EG_HEADER + (size_t)len - c->inlen > want)
                want = EG_HEADER + (size_t)len - c->inlen;
        }
        if (c->incap - c->inlen < want) {
            size_t cap = c->inlen + want;
            if (c->unfinished && g_unfinished_bytes - c->incap + cap > MAX_UNFINISHED_BYTES) {
                conn_close(c); /* over the budget: the claimer is denied */
                return;
            }
            char *in = realloc(c->in, cap);
            if (!in) {
                conn_close(c);
                return;
            }
            if (c->unfinished)
                g_unfinished_bytes += cap - c->incap;
            c->in = in;
            c->incap = cap;
        }
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int) * EG_MAX_FDS)];
        } control;
        struct iovec iov = {.iov_base = c->in + c->inlen, .iov_len = c->incap - c->inlen};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                             .msg_controllen = sizeof control.buf};
        ssize_t k = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (msg.msg_controllen > 0 && k >= 0) {
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                    continue;
                int nin = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                if (nin > EG_MAX_FDS) /* cannot be: the kernel sends at most 253 */
                    nin = EG_MAX_FDS;
                int got[EG_MAX_FDS];
                memcpy(got, CMSG_DATA(cm), sizeof(int) * (size_t)nin);
                for (int i = 0; i < nin; i++) {
                    /* only the claim (the first frame) carries descriptors */
                    if (!c->claimed && c->inlen == 0 && c->nfds < EG_MAX_FDS)
                        c->fds[c->nfds++] = got[i];
                    else {
                        close(got[i]);
                        c->bad = 1;
                    }
                }
            }
            if (msg.msg_flags & MSG_CTRUNC)
                c->bad = 1;
        }
        if (k <= 0) { /* the claimer is gone (or the connection failed) */
            conn_close(c);
            return;
        }
        c->inlen += (size_t)k;
        while (c->fd >= 0 && c->inlen >= EG_HEADER) {
            uint32_t len = (uint32_t)(unsigned char)c->in[0] |
                           (uint32_t)(unsigned char)c->in[1] << 8 |
                           (uint32_t)(unsigned char)c->in[2] << 16 |
                           (uint32_t)(unsigned char)c->in[3] << 24;
            if (len == 0 || len > (c->claimed ? MAX_SIGNAL_FRAME : EG_MAX_PAYLOAD)) {
                conn_close(c);
                return;
            }
            size_t whole = EG_HEADER + (size_t)len;
            if (c->inlen < whole)
                break;
            char *payload = c->in + EG_HEADER;
            if (!c->claimed) {
                c->claimed = 1;
                conn_settle(c);
                handle_claim(c, payload, len);
            } else if (handle_claimer_signal(c, payload, len) < 0) {
                conn_close(c);
            }
            if (c->fd < 0)
                return;
            memmove(c->in, c->in + whole, c->inlen - whole);
            c->inlen -= whole;
        }
        if (c->claimed && c->incap > 65536 && c->inlen < 4096) { /* the big claim is done */
            char *in = realloc(c->in, 4096);
            if (in) {
                c->in = in;
                c->incap = 4096;
            }
        }
    }
}

/* Close the unfinished claims past their deadline and send the `go`s owed by now; the next
 * deadline of either, or -1 if none. */
static long long expire_claims(void)
{
    long long now = now_ms(), next = -1;
    for (size_t i = g_nconns; i-- > 0;) { /* conn_close moves the last one to i */
        struct conn *c = g_conns[i];
        if (c->go_due && now >= c->go_due)
            send_go(c);
        else if (c->go_due && (next < 0 || c->go_due < next))
            next = c->go_due;
        if (!c->unfinished)
            continue;
        if (now >= c->deadline)
            conn_close(c);
        else if (next < 0 || c->deadline < next)
            next = c->deadline;
    }
    return next;
}

/* Accept pending claim connections while unfinished claims are under their bound. */
static void accept_claims(void)
{
    while (g_unfinished < MAX_UNFINISHED_CLAIMS) {
        int fd = accept4(g_claim, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                /* EMFILE & co.: the claimer waits in the backlog; we retry in a moment
                 * rather than spin on a socket that stays readable */
                note("claim socket: accept: %s", strerror(errno));
                g_accept_paused = now_ms() + 100;
            }
            return;
        }
        struct ucred cred;
        socklen_t clen = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
            (cred.uid != g_uid && cred.uid != 0) || g_nconns >= MAX_CONNS) {
            close(fd); /* not ours to serve: the claimer sees end-of-file, a denial */
            continue;
        }
        struct conn *c = calloc(1, sizeof *c);
        if (c && g_nconns == g_capconns) {
            size_t cap = g_capconns ? g_capconns * 2 : 16;
            struct conn **v = realloc(g_conns, cap * sizeof *v);
            if (v) {
                g_conns = v;
                g_capconns = cap;
            }
        }
        if (!c || g_nconns == g_capconns) {
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->peer = cred.pid;
        c->unfinished = 1;
        c->deadline = now_ms() + CLAIM_DEADLINE_MS;
        g_unfinished++;
        g_conns[g_nconns++] = c;
        conn_input(c); /* the claim is usually there already */
    }
}

/* -- control messages ------------------------------------------------------------------------ */

/* One message from the server. 1: go on, 0: shut down (grace in *grace), <0: malformed.
 * *payload is the malloc'ed message; it is set to NULL when kept (a ticket). */
static int handle_message(char **payload, size_t len, int *fds, int nfds, long long *grace)
{
    struct eg_fields f;
    eg_fields_init(&f, *payload, len);
    const char *tag = eg_next(&f, NULL), *kind = eg_next(&f, NULL);
    int r = 1;
    if (!tag || !kind || strcmp(tag, EG_TAG))
        r = -EPROTO;
    else if (!strcmp(kind, "spawn"))
        r = handle_spawn(&f, fds, nfds) < 0 ? -EPROTO : 1;
    else if (!strcmp(kind, "release"))
        r = handle_release(&f, fds, nfds) < 0 ? -EPROTO : 1;
    else if (!strcmp(kind, "authorize") || !strcmp(kind, "authorize-confined")) {
        if (nfds != 1)
            return -EPROTO; /* the caller closes what came */
        char *kept = *payload;
        *payload = NULL;
        int confined = kind[9] != '\0';
        r = handle_authorize(&f, kept, fds[0], confined) < 0 ? -EPROTO : 1;
        fds[0] = -1; /* the ticket's now (or closed) */
    } else if (!strcmp(kind, "standing")) {
        if (nfds != 3)
            return -EPROTO;
        char *kept = *payload;
        *payload = NULL;
        r = handle_standing(&f, kept, len, fds) < 0 ? -EPROTO : 1;
        fds[0] = fds[1] = fds[2] = -1;
    } else if (nfds)
        r = -EPROTO;
    else if (!strcmp(kind, "signal")) {
        long long id, sig;
        if (eg_next_long(&f, &id) < 0 || eg_next_long(&f, &sig) < 0 || !eg_fields_done(&f) ||
            sig < 0 || sig >= NSIG)
            r = -EPROTO;
        else {
            struct proc *p = find_id(id);
            /* Not reaped yet, so the pid is still this process (dead or alive). */
            if (p && p->state != P_FAILED)
                kill(p->pid, (int)sig);
        }
    } else if (!strcmp(kind, "revoke")) {
        if (!eg_fields_done(&f))
            r = -EPROTO;
        else
            revoke_standing();
    } else if (!strcmp(kind, "shutdown")) {
        long long ms;
        if (eg_next_long(&f, &ms) < 0 || !eg_fields_done(&f) || ms < 0)
            r = -EPROTO;
        else {
            *grace = ms > MAX_GRACE_MS ? MAX_GRACE_MS : ms;
            r = 0;
        }
    } else
        r = -EPROTO;
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    return r;
}

/* Read and handle one control message (the socket is readable). Returns only to go on. */
static int control_step(void)
{
    char *payload = NULL;
    int fds[EG_MAX_FDS], nfds = 0;
    ssize_t len = eg_recv_frame_alloc(g_control, &payload, fds, &nfds, EG_MAX_FDS);
    if (len < 0) {
        if (len != -ENODATA)
            note("control channel: %s", strerror((int)-len));
        close(g_control);
        g_control = -1;
        g_report = 0;
        shutdown_session(EOF_GRACE_MS);
    }
    long long grace = EOF_GRACE_MS;
    int r = handle_message(&payload, (size_t)len, fds, nfds, &grace);
    free(payload);
    if (r < 0) {
        note("malformed message on the control channel: ending the session");
        close(g_control);
        g_control = -1;
        g_report = 0;
        shutdown_session(EOF_GRACE_MS);
    }
    if (r == 0)
        shutdown_session(grace);
    return 1;
}

/* -- main ----------------------------------------------------------------------------------- */

static void usage(void)
{
    note("usage: execgate-launch --control FD [--claim-fd FD] [--terminal FD] [--status-fd FD] "
         "[--known-carveouts DEV:INO,...] "
         "[--sandbox read-only|workspace-write|off] "
         "[--writable DIR]... [--readonly PATH]... [--protect NAME]... [--hide DIR]... "
         "[--network] [--proxy-port N --proxy-report-fd FD] [--strict-exec] [--exec-dir PATH]...\n"
         "       execgate-launch --probe [SANDBOX OPTIONS]");
}

static int parse_fd(const char *opt, const char *text, long long *out)
{
    char *end;
    errno = 0;
    *out = strtoll(text, &end, 10);
    if (errno || *end || !*text || *out < 0 || *out > INT_MAX) {
        note("%s: bad descriptor '%s'", opt, text);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int probe = 0;
    long long control = -1, claim = -1, terminal = -1, status_fd = -1;
    char err[256];
    /* Claim buffers of 1 MiB and more are mapped and go back to the system when freed (a
     * fixed threshold: glibc's adaptive one would keep them in the heap after the first). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    /* No fastbins: a claim's 64 KiB buffer is a large request, and glibc merged the fastbins'
     * chunks (the last claim's small frees) before each one, ~5% of our CPU per claim. The
     * thread cache still serves the small ones. */
    mallopt(M_MXFAST, 0);
    g_sandbox.proxy_report = -1;
    for (int i = 1; i < argc; i++) {
        int r = sb_parse_option(&g_sandbox, argc, argv, &i, err, sizeof err);
        if (r < 0) {
            note("%s", err);
            return 2;
        }
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--probe")) {
            probe = 1;
        } else if (!strcmp(argv[i], "--control") && i + 1 < argc) {
            if (parse_fd("--control", argv[++i], &control) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--claim-fd") && i + 1 < argc) {
            if (parse_fd("--claim-fd", argv[++i], &claim) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--status-fd") && i + 1 < argc) {
            if (parse_fd("--status-fd", argv[++i], &status_fd) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--known-carveouts") && i + 1 < argc) {
            if (gr_known_carveouts(argv[++i]) < 0) {
                note("--known-carveouts: bad list '%s'", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--terminal") && i + 1 < argc) {
            if (parse_fd("--terminal", argv[++i], &terminal) < 0)
                return 2;
        } else {
            usage();
            return 2;
        }
    }
    if (probe)
        return sb_probe(&g_sandbox);
    if (control < 0 || fcntl((int)control, F_GETFD) < 0) {
        usage();
        return 2;
    }
    g_control = (int)control;
    fcntl(g_control, F_SETFD, FD_CLOEXEC);
    if (g_sandbox.mode != SB_OFF)
        gr_remember_carveouts(&g_sandbox); /* before anything of the session runs */
    if (claim >= 0) {
        int listening = 0;
        socklen_t ln = sizeof listening;
        if (getsockopt((int)claim, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ln) < 0 ||
            !listening) {
            note("--claim-fd: descriptor %lld is not a listening socket", claim);
            return 2;
        }
        g_claim = (int)claim;
        fcntl(g_claim, F_SETFD, FD_CLOEXEC);
        fcntl(g_claim, F_SETFL, fcntl(g_claim, F_GETFL) | O_NONBLOCK);
    }
    if (g_sandbox.proxy_port > 0) {
        int type = 0;
        socklen_t tl = sizeof type;
        if (g_sandbox.proxy_report < 0 ||
            getsockopt(g_sandbox.proxy_report, SOL_SOCKET, SO_TYPE, &type, &tl) < 0) {
            note("--proxy-port needs --proxy-report-fd (a socket)");
            return 2;
        }
        fcntl(g_sandbox.proxy_report, F_SETFD, FD_CLOEXEC);
    }
    if (status_fd >= 0) {
        if (fcntl((int)status_fd, F_GETFD) < 0) {
            note("--status-fd: descriptor %lld is not open", status_fd);
            return 2;
        }
        g_status_fd = (int)status_fd;
        fcntl(g_status_fd, F_SETFD, FD_CLOEXEC);
    }
    if (terminal >= 0) {
        /* A session leader (the server started us with setsid) takes the terminal as its
         * controlling terminal, so a main spawn in a group of its own gets it (Ctrl-C reaches
         * that group) and /dev/tty works for its programs. */
        if (ioctl((int)terminal, TIOCSCTTY, 0) < 0) {
            note("--terminal: cannot make descriptor %lld our terminal: %s", terminal,
                 strerror(errno));
            return 2;
        }
        close((int)terminal);
    }
    g_uid = geteuid();

    g_self = getpid();
    g_pgrp = getpgrp();
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        note("cannot become a subreaper: %s", strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < sizeof IGNORED_SIGNALS / sizeof IGNORED_SIGNALS[0]; i++)
        signal(IGNORED_SIGNALS[i], SIG_IGN);
    /* What children must reset: ours, and whatever we inherited ignored. */
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &old) == 0 &&
            old.sa_handler != SIG_DFL)
            g_reset[g_nreset++] = sig;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    g_sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (g_sigfd < 0) {
        note("signalfd: %s", strerror(errno));
        return 1;
    }
    /* Room for the pidfds and /proc files of a shutdown; children get the original back. */
    getrlimit(RLIMIT_NOFILE, &g_nofile);
    struct rlimit raised = g_nofile;
    raised.rlim_cur = raised.rlim_max;
    setrlimit(RLIMIT_NOFILE, &raised);

    /* Ready (subreaper, signals ignored): say so on stdout, which the server may have made
     * a pipe, and close it (so the server can simply read to EOF). */
    (void)eg_write_all(1, "ready\n", 6);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 1);
        if (null != 1)
            close(null);
    }

    struct pollfd *pfds = NULL;
    struct conn **polled = NULL;
    size_t pcap = 0;
    for (;;) {
        free_dead_conns();
        size_t n = 3 + g_nconns + g_nprocs;
        if (n > pcap) {
            struct pollfd *v = realloc(pfds, n * 2 * sizeof *v);
            struct conn **w = v ? realloc(polled, n * 2 * sizeof *w) : NULL;
            if (!v || !w) {
                note("out of memory");
                shutdown_session(EOF_GRACE_MS);
            }
            pfds = v;
            polled = w;
            pcap = n * 2;
        }
        pfds[0] = (struct pollfd){.fd = g_control, .events = POLLIN};
        pfds[1] = (struct pollfd){.fd = g_sigfd, .events = POLLIN};
        long long now = now_ms(), paused = g_accept_paused - now, wake = expire_claims();
        int full = g_unfinished >= MAX_UNFINISHED_CLAIMS; /* newcomers wait in the backlog */
        pfds[2] = (struct pollfd){.fd = paused > 0 || full ? -1 : g_claim, .events = POLLIN};
        if (paused > 0 && (wake < 0 || g_accept_paused < wake))
            wake = g_accept_paused;
        int timeout = wake < 0 ? -1 : (int)(wake > now ? wake - now : 0);
        if (g_nlinger > 0 && (timeout < 0 || timeout > LINGER_MS))
            timeout = LINGER_MS; /* a claimer that reads to end-of-file waits no longer */
        size_t np = 3, nc = g_nconns;
        for (size_t i = 0; i < nc; i++) {
            polled[i] = g_conns[i];
            pfds[np++] = (struct pollfd){.fd = g_conns[i]->fd, .events = POLLIN};
        }
        size_t first_pipe = np;
        for (size_t i = 0; i < g_nprocs; i++)
            if (g_procs[i].state == P_PENDING)
                pfds[np++] = (struct pollfd){.fd = g_procs[i].pipe, .events = POLLIN};
        if (poll(pfds, np, timeout) < 0) {
            if (errno == EINTR)
                continue;
            note("poll: %s", strerror(errno));
            shutdown_session(EOF_GRACE_MS);
        }
        close_lingering();
        /* Error pipes first, so `spawned` always precedes `exited`. */
        for (size_t i = first_pipe; i < np; i++) {
            if (!pfds[i].revents)
                continue;
            for (size_t j = 0; j < g_nprocs; j++)
                if (g_procs[j].state == P_PENDING && g_procs[j].pipe == pfds[i].fd) {
                    resolve(&g_procs[j]);
                    break;
                }
        }
        if (pfds[1].revents) {
            struct signalfd_siginfo si;
            int term = 0;
            while (read(g_sigfd, &si, sizeof si) == (ssize_t)sizeof si)
                if (si.ssi_signo == SIGTERM)
                    term = 1;
            int left = reap();
            if (term)
                shutdown_session(EOF_GRACE_MS);
            /* The session's last program ended and nothing of the session is left (orphans
             * come to us, so no child means no descendant): end now, without waiting for the
             * server's `shutdown` (it comes after the `exited` it reads; we are gone by then). */
            if (g_last_ended && left < 0) {
                /* The server answers its caller now: its work comes first. Block for a
                 * moment, so this CPU can take the server we just woke (idle CPUs of a VM
                 * wake slowly; execgate/handoff.py), and end at the lowest priority. */
                setpriority(PRIO_PROCESS, 0, 19);
                struct timespec moment = {0, 100000};
                nanosleep(&moment, NULL);
                shutdown_session(0);
            }
        }
        /* Control before claims: an authorization is read before the claim it is for. */
        if (pfds[0].revents)
            control_step();
        for (size_t i = 0; i < nc; i++) /* a connection closed meanwhile has fd -1 */
            if (pfds[3 + i].revents && polled[i]->fd == pfds[3 + i].fd)
                conn_input(polled[i]);
        if (pfds[2].revents)
            accept_claims();
    }
}
