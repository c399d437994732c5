/* execgate-launch: the per-session supervisor (docs/protocol.md §7, docs/sandbox.md).
 *
 *   execgate-launch --control FD [SANDBOX OPTIONS]
 *   execgate-launch --probe [SANDBOX OPTIONS]
 *
 * A child subreaper: every process of the session stays its descendant. It spawns what the
 * server asks for (optionally confined), reports spawned / failed / exited, forwards signals,
 * and at the end (shutdown request, control channel EOF, SIGTERM) kills every descendant,
 * including daemons that setsid'ed or double-forked, and reaps them all before exiting.
 *
 * Single-threaded; one poll() loop over the control socket, a signalfd (SIGCHLD, SIGTERM) and
 * the close-on-exec error pipes of spawns that have not exec'ed yet.
 */
#include "common.h"
#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#define EOF_GRACE_MS 500
#define MAX_GRACE_MS 600000
#define KILL_ROUNDS_MS 10000 /* bound on the SIGKILL rounds of a shutdown */
#define MSG_CAP 1024

static const int IGNORED_SIGNALS[] = {SIGINT, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGHUP, SIGPIPE};

enum state { P_PENDING, P_RUNNING, P_FAILED };

struct proc {
    long long id;
    pid_t pid;
    int pipe;     /* read end of the error pipe while P_PENDING */
    enum state state;
    int main;     /* FLAGS had `main` */
    pid_t pgid;   /* its process group, for a main that took the terminal */
};

static struct sb_config g_sandbox;
static int g_control = -1;   /* -1 once closed */
static int g_report = 1;     /* events can still be sent */
static int g_sigfd = -1;
static pid_t g_self, g_pgrp;
static struct rlimit g_nofile; /* as inherited: restored in children */
static struct proc *g_procs;
static size_t g_nprocs, g_capprocs;

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
        if (g_procs[i].id == id)
            return &g_procs[i];
    return NULL;
}

static void remove_proc(struct proc *p)
{
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
        send_failed(p->id, buf.err, buf.msg);
    } else {
        p->state = P_RUNNING;
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

/* Reap every child that is ready. 1: reaped some, 0: none ready, -1: no children left. */
static int reap(void)
{
    int any = 0;
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            return errno == ECHILD ? -1 : any;
        }
        if (pid == 0)
            return any;
        any = 1;
        struct proc *p = find_pid(pid);
        if (!p)
            continue; /* an orphan we inherited */
        if (p->state == P_PENDING)
            resolve(p);
        if (p->state == P_RUNNING) {
            if (p->main) /* before telling: the server may use the terminal right away */
                restore_terminal(p->pgid);
            send_exited(p->id, st);
        }
        remove_proc(p);
    }
}

/* -- killing the session -------------------------------------------------------------------- */

/* /proc/PID/stat: parent pid and start time (clock ticks since boot). */
static int read_stat(pid_t pid, pid_t *ppid, unsigned long long *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may contain anything */
    if (!p)
        return -1;
    p++;
    /* fields after comm: 3 state, 4 ppid, …, 22 starttime */
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 4 && ppid)
            *ppid = (pid_t)strtol(tok, NULL, 10);
        if (field == 22) {
            if (start)
                *start = strtoull(tok, NULL, 10);
            return 0;
        }
    }
    return -1;
}

struct pidvec {
    pid_t *v;
    size_t n, cap;
};

static int pidvec_push(struct pidvec *pv, pid_t pid)
{
    if (pv->n == pv->cap) {
        size_t cap = pv->cap ? pv->cap * 2 : 64;
        pid_t *v = realloc(pv->v, cap * sizeof *v);
        if (!v)
            return -1;
        pv->v = v;
        pv->cap = cap;
    }
    pv->v[pv->n++] = pid;
    return 0;
}

/* Append the children of every thread of pid (/proc/PID/task/TID/children). */
static void read_children(pid_t pid, struct pidvec *out)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char file[300];
        snprintf(file, sizeof file, "/proc/%d/task/%s/children", (int)pid, e->d_name);
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        char buf[4096], num[16];
        size_t nl = 0;
        ssize_t k;
        while ((k = read(fd, buf, sizeof buf)) > 0) {
            for (ssize_t i = 0; i < k; i++) {
                if (buf[i] >= '0' && buf[i] <= '9') {
                    if (nl < sizeof num - 1)
                        num[nl++] = buf[i];
                } else if (nl) {
                    num[nl] = '\0';
                    (void)pidvec_push(out, (pid_t)atoi(num));
                    nl = 0;
                }
            }
        }
        if (nl) {
            num[nl] = '\0';
            (void)pidvec_push(out, (pid_t)atoi(num));
        }
        close(fd);
    }
    closedir(d);
}

/* Send sig to pid, a process we found as a child of parent. Through a pidfd opened before the
 * parent check, so a pid that was reaped and reused meanwhile is never signalled: the pidfd
 * names one process for good, and the check shows that process was parent's child. */
static int signal_child_of(pid_t pid, pid_t parent, int sig, int also_cont,
                           unsigned long long *start)
{
    pid_t ppid = -1;
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0 && errno != ENOSYS)
        return -1; /* gone already */
    if (read_stat(pid, &ppid, start) < 0 || ppid != parent) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (fd >= 0) {
        syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
        if (also_cont)
            syscall(SYS_pidfd_send_signal, fd, SIGCONT, NULL, 0);
        close(fd);
    } else { /* kernel without pidfds (< 5.3): small reuse window */
        kill(pid, sig);
        if (also_cont)
            kill(pid, SIGCONT);
    }
    return 0;
}

/* Signal every descendant, top-down (breadth first). Returns how many were signalled. */
static size_t signal_descendants(int sig, int also_cont)
{
    struct pidvec queue = {0};
    unsigned long long *starts = NULL;
    size_t count = 0;

    struct pidvec kids = {0};
    read_children(g_self, &kids);
    for (size_t i = 0; i < kids.n; i++) {
        /* Our own children cannot be reused before we reap them: plain kill is exact. */
        if (kill(kids.v[i], sig) == 0) {
            count++;
            if (also_cont)
                kill(kids.v[i], SIGCONT);
        }
        unsigned long long st = 0;
        if (read_stat(kids.v[i], NULL, &st) == 0 && pidvec_push(&queue, kids.v[i]) == 0) {
            unsigned long long *s = realloc(starts, queue.n * sizeof *s);
            if (!s) {
                queue.n--;
                continue;
            }
            starts = s;
            starts[queue.n - 1] = st;
        }
    }
    free(kids.v);

    for (size_t qi = 0; qi < queue.n && queue.n < (1u << 22); qi++) {
        pid_t parent = queue.v[qi];
        struct pidvec ch = {0};
        read_children(parent, &ch);
        unsigned long long again = 0;
        /* The list is parent's only if parent is still the process we queued. */
        if (read_stat(parent, NULL, &again) < 0 || again != starts[qi]) {
            free(ch.v);
            continue;
        }
        for (size_t i = 0; i < ch.n; i++) {
            unsigned long long st = 0;
            if (signal_child_of(ch.v[i], parent, sig, also_cont, &st) < 0)
                continue;
            count++;
            if (pidvec_push(&queue, ch.v[i]) < 0)
                continue;
            unsigned long long *s = realloc(starts, queue.n * sizeof *s);
            if (!s) {
                queue.n--;
                continue;
            }
            starts = s;
            starts[queue.n - 1] = st;
        }
        free(ch.v);
    }
    free(queue.v);
    free(starts);
    return count;
}

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
        signal_descendants(SIGTERM, 1);
        long long deadline = now_ms() + grace_ms;
        while (reap() >= 0) {
            long long left = deadline - now_ms();
            if (left <= 0)
                break;
            wait_signal(left);
        }
    }
    long long limit = now_ms() + KILL_ROUNDS_MS;
    while (reap() >= 0) {
        signal_descendants(SIGKILL, 0);
        if (reap() < 0)
            break;
        if (now_ms() > limit) {
            note("giving up: descendants still alive after %d ms of SIGKILL", KILL_ROUNDS_MS);
            break;
        }
        wait_signal(2);
    }
    /* Pending spawns whose child never reported (killed before exec): nothing to say. */
    if (g_control >= 0)
        close(g_control);
    exit(0);
}

/* -- spawning ------------------------------------------------------------------------------- */

struct spawn {
    long long id;
    int sandbox, main;
    long long pgid;
    const char *cwd, *path;
    int nfds;
    int *dst;
    char **argv, **envp;
};

static void child_fail(int errfd, int err, const char *fmt, ...) __attribute__((noreturn))
__attribute__((format(printf, 3, 4)));

static void child_fail(int errfd, int err, const char *fmt, ...)
{
    struct {
        int err;
        char msg[MSG_CAP];
    } buf;
    buf.err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf.msg, sizeof buf.msg, fmt, ap);
    va_end(ap);
    (void)eg_write_all(errfd, &buf, sizeof buf.err + strlen(buf.msg));
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

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* In the child: put src[i] at dst[i], close everything else but errfd (moved above them). */
static int place_fds(const int *src, const int *dst, int n, int *errfd)
{
    int top = 2;
    for (int i = 0; i < n; i++)
        if (dst[i] > top)
            top = dst[i];
    int moved[EG_MAX_FDS];
    int e = fcntl(*errfd, F_DUPFD_CLOEXEC, top + 1);
    if (e < 0)
        return -errno;
    *errfd = e;
    for (int i = 0; i < n; i++) {
        moved[i] = fcntl(src[i], F_DUPFD_CLOEXEC, top + 1);
        if (moved[i] < 0)
            return -errno;
    }
    for (int i = 0; i < n; i++)
        if (dup2(moved[i], dst[i]) < 0) /* dup2 leaves dst[i] inheritable */
            return -errno;
    int sorted[EG_MAX_FDS];
    memcpy(sorted, dst, sizeof(int) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(int), cmp_int);
    unsigned next = 0;
    for (int i = 0; i < n; i++) {
        if ((unsigned)sorted[i] > next)
            close_from_to(next, (unsigned)sorted[i] - 1);
        next = (unsigned)sorted[i] + 1;
    }
    close_from_to(next, (unsigned)e - 1);
    close_from_to((unsigned)e + 1, ~0U);
    return 0;
}

static void child(const struct spawn *s, const int *fds, int errfd) __attribute__((noreturn));

static void child(const struct spawn *s, const int *fds, int errfd)
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

    int r = place_fds(fds, s->dst, s->nfds, &errfd);
    if (r < 0)
        child_fail(errfd, -r, "placing descriptors: %s", strerror(-r));

    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            signal(sig, SIG_DFL);
    (void)setrlimit(RLIMIT_NOFILE, &g_nofile);

    char msg[MSG_CAP] = "";
    if (s->sandbox) {
        r = sb_apply(&g_sandbox, s->cwd, msg, sizeof msg);
        if (r < 0)
            child_fail(errfd, -r, "%s", msg[0] ? msg : strerror(-r));
    } else if (chdir(s->cwd) < 0) {
        child_fail(errfd, errno, "chdir %s: %s", s->cwd, strerror(errno));
    }

    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(s->path, s->argv, s->envp);
    int e = errno;
    child_fail(errfd, e, "exec %s: %s", s->path, strerror(e));
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
    struct spawn s = {0};
    int dst[EG_MAX_FDS];
    long long n;
    size_t flen;
    const char *flags;
    if (eg_next_long(f, &s.id) < 0 || !(flags = eg_next(f, &flen)) ||
        eg_next_long(f, &s.pgid) < 0 || !(s.cwd = eg_next(f, NULL)) ||
        !(s.path = eg_next(f, NULL)) || eg_next_long(f, &n) < 0)
        return -EPROTO;
    if (n != nfds || s.pgid < -1 || s.pgid > INT_MAX)
        return -EPROTO;
    for (int i = 0; i < nfds; i++) {
        long long d;
        if (eg_next_long(f, &d) < 0 || d < 0 || d > INT_MAX - 1)
            return -EPROTO;
        dst[i] = (int)d;
        for (int j = 0; j < i; j++)
            if (dst[j] == dst[i])
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

    /* FLAGS: comma-separated. */
    const char *bad = NULL;
    for (const char *p = flags; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 7 && !strncmp(p, "sandbox", 7))
            s.sandbox = 1;
        else if (len == 4 && !strncmp(p, "main", 4))
            s.main = 1;
        else if (len)
            bad = p;
        p += len + (end ? 1 : 0);
    }

    if (bad) {
        send_failed(s.id, EINVAL, "unknown spawn flag");
    } else if (find_id(s.id)) {
        send_failed(s.id, EEXIST, "spawn id already in use");
    } else if (!s.path[0] || !s.cwd[0]) {
        send_failed(s.id, EINVAL, "empty program path or working directory");
    } else {
        int pipefd[2];
        if (pipe2(pipefd, O_CLOEXEC) < 0) {
            int e = errno;
            send_failed(s.id, e, strerror(e));
        } else {
            pid_t pid = fork();
            if (pid == 0) {
                close(pipefd[0]);
                child(&s, fds, pipefd[1]);
            }
            int e = errno;
            close(pipefd[1]);
            if (pid < 0) {
                close(pipefd[0]);
                send_failed(s.id, e, strerror(e));
            } else {
                struct proc p = {.id = s.id, .pid = pid, .pipe = pipefd[0],
                                 .state = P_PENDING, .main = s.main, .pgid = -1};
                if (add_proc(&p) < 0) { /* cannot track it: it must not run */
                    kill(pid, SIGKILL);
                    close(pipefd[0]);
                    send_failed(s.id, ENOMEM, "out of memory");
                }
            }
        }
    }
    free(s.argv);
    free(s.envp);
    return 0;
}

/* One message from the server. 1: go on, 0: shut down (grace in *grace), <0: malformed. */
static int handle_message(char *payload, size_t len, int *fds, int nfds, long long *grace)
{
    struct eg_fields f;
    eg_fields_init(&f, payload, len);
    const char *tag = eg_next(&f, NULL), *kind = eg_next(&f, NULL);
    int r = 1;
    if (!tag || !kind || strcmp(tag, EG_TAG))
        r = -EPROTO;
    else if (!strcmp(kind, "spawn"))
        r = handle_spawn(&f, fds, nfds) < 0 ? -EPROTO : 1;
    else if (nfds)
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

/* -- main ----------------------------------------------------------------------------------- */

static void usage(void)
{
    note("usage: execgate-launch --control FD [--sandbox read-only|workspace-write|off] "
         "[--writable DIR]... [--readonly PATH]... [--protect NAME]... [--network] "
         "[--strict-exec] [--exec-dir PATH]...\n"
         "       execgate-launch --probe [SANDBOX OPTIONS]");
}

int main(int argc, char **argv)
{
    int probe = 0;
    long long control = -1;
    char err[256];
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
            char *end;
            errno = 0;
            control = strtoll(argv[++i], &end, 10);
            if (errno || *end || control < 0 || control > INT_MAX) {
                note("--control: bad descriptor '%s'", argv[i]);
                return 2;
            }
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

    g_self = getpid();
    g_pgrp = getpgrp();
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        note("cannot become a subreaper: %s", strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < sizeof IGNORED_SIGNALS / sizeof IGNORED_SIGNALS[0]; i++)
        signal(IGNORED_SIGNALS[i], SIG_IGN);
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
    size_t pcap = 0;
    for (;;) {
        size_t n = 2 + g_nprocs;
        if (n > pcap) {
            struct pollfd *v = realloc(pfds, n * 2 * sizeof *v);
            if (!v) {
                note("out of memory");
                shutdown_session(EOF_GRACE_MS);
            }
            pfds = v;
            pcap = n * 2;
        }
        pfds[0] = (struct pollfd){.fd = g_control, .events = POLLIN};
        pfds[1] = (struct pollfd){.fd = g_sigfd, .events = POLLIN};
        size_t np = 2;
        for (size_t i = 0; i < g_nprocs; i++)
            if (g_procs[i].state == P_PENDING)
                pfds[np++] = (struct pollfd){.fd = g_procs[i].pipe, .events = POLLIN};
        if (poll(pfds, np, -1) < 0) {
            if (errno == EINTR)
                continue;
            note("poll: %s", strerror(errno));
            shutdown_session(EOF_GRACE_MS);
        }
        /* Error pipes first, so `spawned` always precedes `exited`. */
        for (size_t i = 2; i < np; i++) {
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
            reap();
            if (term)
                shutdown_session(EOF_GRACE_MS);
        }
        if (pfds[0].revents) {
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
            int r = handle_message(payload, (size_t)len, fds, nfds, &grace);
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
        }
    }
}
