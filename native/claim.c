/* Claiming an escalation (docs/protocol.md §4), shared by execgate-wrapper (claim mode and the
 * patched-shell convention) and the interposer (an escalated exec in a process that may turn
 * into the claim itself, without exec'ing the wrapper).
 *
 * The claimer connects to the launcher's claim socket (<session dir>/claim.sock), sends its
 * inheritable descriptors and environment with the ticket, forwards the signals it receives, and
 * ends the way the escalated program ended.
 *
 * Async-signal-safe: no malloc, no stdio, no locks (the interposer may be running in a signal
 * handler, or in a child of a multi-threaded process whose locks were copied held). The path
 * of a claim that succeeds makes raw system calls only (sys.h): it runs in a child that was
 * just forked, where the first call of each libc function would be bound by the loader, in
 * that child again every time (its parent never calls them), at a few page faults each.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "gate.h"
#include "sys.h"

static const int forwarded[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGUSR1,
                                SIGUSR2, SIGALRM, SIGWINCH, SIGCONT};
#define N_FORWARDED (int)(sizeof forwarded / sizeof forwarded[0])
#define MAX_SIG 64
#define MAX_SEEN 1024

static volatile sig_atomic_t pending[MAX_SIG + 1];
static volatile sig_atomic_t any_pending;

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    /* The terminal's signals (Ctrl-C, …) reached the escalated program through its process
     * group already. */
    if (si && si->si_code == SI_KERNEL)
        return;
    if (sig > 0 && sig <= MAX_SIG) {
        pending[sig] = 1;
        any_pending = 1;
    }
}

static int is_forwarded(int sig)
{
    for (int i = 0; i < N_FORWARDED; i++)
        if (forwarded[i] == sig)
            return 1;
    return 0;
}

/* Append s to buf (cap bytes, always NUL-terminated). */
static void cat(char *buf, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (*len + 1 >= cap)
        return;
    if (n > cap - 1 - *len)
        n = cap - 1 - *len;
    memcpy(buf + *len, s, n);
    *len += n;
    buf[*len] = '\0';
}

static void cat_num(char *buf, size_t cap, size_t *len, long long v)
{
    char num[24];
    eg_fmt_long(num, v);
    cat(buf, cap, len, num);
}

static void say(int errfd, const char *line)
{
    if (errfd < 0)
        return;
    char buf[1024];
    size_t n = 0;
    buf[0] = '\0';
    cat(buf, sizeof buf - 1, &n, line);
    buf[n++] = '\n';
    eg_write_all(errfd, buf, n);
}

__attribute__((noreturn)) static void deny(int errfd, char *const *cmd, const char *ticket,
                                           const char *reason, int err)
{
    char who[128];
    size_t n = 0;
    who[0] = '\0';
    int known = cmd && cmd[0];
    if (!known) {
        cat(who, sizeof who, &n, "escalated program (ticket ");
        char t[65];
        size_t tl = ticket ? strnlen(ticket, 64) : 0;
        memcpy(t, ticket, tl);
        t[tl] = '\0';
        cat(who, sizeof who, &n, t);
        cat(who, sizeof who, &n, ")");
    }
    char detail[128];
    size_t d = 0;
    detail[0] = '\0';
    if (err) {
        cat(detail, sizeof detail, &d, " (");
        cat(detail, sizeof detail, &d, eg_strerror(err));
        cat(detail, sizeof detail, &d, ")");
    }
    if (errfd >= 0)
        eg_deny_line_fd(errfd, known ? cmd : NULL, who, reason, detail);
    eg_sys_exit(126);
}

static int parse_fd(const char *s)
{
    long v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return (int)v;
}

/* The open descriptors /proc lists (not the one used to list them), at most MAX_SEEN into
 * out; -1 when /proc is unavailable. Uses getdents64 directly: no malloc (vfork-safe). */
static int list_fds(int *out)
{
    int dir = eg_sys_openat(AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return -1;
    int n = 0;
    char buf[4096];
    long k;
    while ((k = EG_SC(SYS_getdents64, dir, buf, sizeof buf, 0, 0, 0)) > 0) {
        for (long off = 0; off < k;) {
            struct {
                unsigned long long ino;
                long long off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *d = (void *)(buf + off);
            off += d->reclen;
            int fd = parse_fd(d->name);
            if (fd >= 0 && fd != dir && n < MAX_SEEN)
                out[n++] = fd;
        }
    }
    eg_sys_close(dir);
    return n;
}

/* Whether fd is open and not close-on-exec: an exec would have left it to the program. */
static int inherited(int fd)
{
    int fl = eg_sys_fcntl(fd, F_GETFD, 0);
    return fl >= 0 && !(fl & FD_CLOEXEC);
}

/* Appends fd to out (at most max of them; *dropped counts the others). */
static void add_fd(int fd, int *out, int max, int *n, int *dropped)
{
    if (*n < max)
        out[(*n)++] = fd;
    else
        (*dropped)++;
}

/* The inherited descriptors, ascending, as collect_fds; -1 when the descriptor table is larger
 * than MAX_TABLE. Without /proc, whose listing costs a fresh process ~30 µs: the table's size
 * bounds every open number, and select() tells whether a number is below it (it cuts its count
 * down to the table's size, then fails with EBADF on a closed number under that count); then
 * fcntl asks each number below it, ~70 ns a number (poll, which asks them all in one call,
 * reports O_PATH descriptors as closed). */
static int table_fds(int *out, int max, int *dropped)
{
    enum { WORD = 8 * sizeof(unsigned long), MAX_TABLE = 256 };
    unsigned long bits[MAX_TABLE / WORD + 1];
    int size = 64; /* the smallest table */
    for (;;) {
        if (size > MAX_TABLE)
            return -1;
        memset(bits, 0, sizeof bits);
        bits[size / WORD] = 1UL << (size % WORD);
        struct timespec zero = {0, 0};
        long r = EG_SC(SYS_pselect6, size + 1, bits, NULL, NULL, &zero, NULL);
        if (r < 0 && r != -EBADF)
            return -1;
        if (r < 0 || eg_sys_fcntl(size, F_GETFD, 0) >= 0)
            size *= 2; /* below the table's size (closed, or open) */
        else
            break; /* at or above it: every open number is below size */
    }
    int n = 0;
    for (int fd = 0; fd < size; fd++)
        if (inherited(fd))
            add_fd(fd, out, max, &n, dropped);
    return n;
}

/* collect_fds from what /proc lists, or from the low numbers without /proc. Apart: its list
 * is a page of the stack, which the usual path never touches. */
__attribute__((noinline)) static int listed_fds(int *out, int max, int *dropped)
{
    int listed[MAX_SEEN];
    int seen = list_fds(listed);
    if (seen < 0) /* no /proc: probe the low numbers */
        for (seen = 0; seen < MAX_SEEN; seen++)
            listed[seen] = seen;
    for (int i = 1; i < seen; i++) /* ascending */
        for (int j = i; j > 0 && listed[j - 1] > listed[j]; j--) {
            int t = listed[j];
            listed[j] = listed[j - 1];
            listed[j - 1] = t;
        }
    int n = 0;
    for (int i = 0; i < seen; i++)
        if (inherited(listed[i]))
            add_fd(listed[i], out, max, &n, dropped);
    return n;
}

/* The descriptors the escalated program must inherit: every open, non-close-on-exec one,
 * ascending; at most max of them (*dropped: how many more there were). */
static int collect_fds(int *out, int max, int *dropped)
{
    *dropped = 0;
    int n = table_fds(out, max, dropped);
    if (n < 0) {
        *dropped = 0;
        n = listed_fds(out, max, dropped);
    }
    return n;
}

/* Close every descriptor but keep1 and keep2 (either may be -1): what an exec would have left
 * of ours is only the claim. */
static void close_all_but(int keep1, int keep2)
{
    int lo = keep1 < keep2 ? keep1 : keep2, hi = keep1 < keep2 ? keep2 : keep1;
    unsigned next = 0;
    int ok = 1;
    int keep[2] = {lo, hi};
    for (int i = 0; i < 2 && ok; i++) {
        if (keep[i] < 0)
            continue;
        if ((unsigned)keep[i] > next)
            ok = eg_sys_close_range(next, (unsigned)keep[i] - 1, 0) == 0;
        next = (unsigned)keep[i] + 1;
    }
    if (ok && eg_sys_close_range(next, ~0U, 0) == 0)
        return;
    /* no close_range (Linux < 5.9): every descriptor /proc lists */
    int listed[MAX_SEEN];
    int n = list_fds(listed);
    for (int i = 0; i < n; i++)
        if (listed[i] != keep1 && listed[i] != keep2)
            eg_sys_close(listed[i]);
}

__attribute__((noreturn)) static void die_by_signal(int sig)
{
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    _exit(128 + sig); /* a signal that does not kill (should not happen) */
}

static void send_signal(int sock, int sig)
{
    char frame[64];
    struct eg_buf b;
    eg_buf_init(&b, frame, sizeof frame);
    eg_put(&b, EG_TAG);
    eg_put(&b, "signal");
    eg_put_long(&b, sig);
    eg_send_frame(sock, &b, NULL, 0); /* a launcher that is gone shows up as EOF */
}

/* Bytes the fields of envp take in a frame (NULL: none); *envc: how many entries.
 * Async-signal-safe. */
static size_t env_bytes(char *const *envp, size_t *envc)
{
    size_t size = 0, n = 0;
    if (envp)
        for (; envp[n]; n++)
            size += strlen(envp[n]) + 1;
    *envc = n;
    return size;
}

/* A claim's tail (§4): NFDS FD… ENVC ENV…  Async-signal-safe. */
static void put_fds_env(struct eg_buf *b, const int *fds, int nfds, char *const *envp,
                        size_t envc)
{
    eg_put_long(b, nfds);
    for (int i = 0; i < nfds; i++)
        eg_put_long(b, fds[i]);
    eg_put_ulong(b, envc);
    for (size_t i = 0; i < envc; i++)
        eg_put(b, envp[i]);
}

static void block_forwarded(sigset_t *waitmask);
static void take_signals(int in_process);
__attribute__((noreturn)) static void await_program(int sock, char *const *cmd,
                                                    const char *ticket, const sigset_t *mask);
__attribute__((noreturn)) static void end_as_program(int sock, int errfd, char *const *cmd,
                                                     const char *ticket);

void eg_claim(const char *ticket, char *const *envp, char *const *cmd, int in_process)
{
    int errfd = 2;
    if (!eg_sess.ok) {
        eg_deny_line(cmd, "execgate-claim", "no execgate session: ", eg_sess.reason);
        eg_sys_exit(126);
    }
    if (!eg_sess.claim[0])
        deny(errfd, cmd, ticket, "the session's claim socket path is too long", 0);
    int fds[EG_MAX_FDS];
    int dropped;
    int nfds = collect_fds(fds, EG_MAX_FDS, &dropped);
    if (dropped) {
        char msg[200];
        size_t n = 0;
        msg[0] = '\0';
        cat(msg, sizeof msg, &n, "execgate: warning: ");
        cat_num(msg, sizeof msg, &n, dropped);
        cat(msg, sizeof msg, &n, " inherited descriptors above fd ");
        cat_num(msg, sizeof msg, &n, fds[nfds - 1]);
        cat(msg, sizeof msg, &n, " not passed to the escalated program (at most ");
        cat_num(msg, sizeof msg, &n, EG_MAX_FDS);
        cat(msg, sizeof msg, &n, ")");
        say(errfd, msg);
    }

    /* the frame: EG1 claim TOKEN TICKET NFDS FD… ENVC ENV… */
    size_t envc;
    size_t size = EG_HEADER + 64 + EG_TOKEN_LEN + strlen(ticket) + (size_t)nfds * 12 + 24 +
                  env_bytes(envp, &envc);
    char small[16384] __attribute__((aligned(16)));
    void *mem = small;
    if (size > sizeof small && !(mem = eg_sys_map_anon(size)))
        deny(errfd, cmd, ticket, "out of memory", 0);
    struct eg_buf b;
    eg_buf_init(&b, mem, size);
    eg_put(&b, EG_TAG);
    eg_put(&b, "claim");
    eg_put(&b, eg_sess.token);
    eg_put(&b, ticket);
    put_fds_env(&b, fds, nfds, envp, envc);

    sigset_t waitmask;
    block_forwarded(&waitmask);
    take_signals(in_process);

    int sock = eg_connect(eg_sess.claim);
    if (sock < 0)
        deny(errfd, cmd, ticket, "execgate server unreachable", -sock);
    int r = eg_send_frame(sock, &b, fds, nfds);
    if (mem != small)
        eg_sys_munmap(mem, size);
    if (r < 0)
        deny(errfd, cmd, ticket, "cannot send the claim to the execgate server", -r);
    await_program(sock, cmd, ticket, &waitmask);
}

/* Block the forwarded signals; *waitmask: the mask to wait with (the old one without them). */
static void block_forwarded(sigset_t *waitmask)
{
    sigset_t block;
    eg_sigemptyset(&block);
    for (int i = 0; i < N_FORWARDED; i++)
        eg_sigaddset(&block, forwarded[i]);
    eg_sigemptyset(waitmask);
    eg_sys_sigprocmask(SIG_BLOCK, &block, waitmask);
    for (int i = 0; i < N_FORWARDED; i++)
        eg_sigdelset(waitmask, forwarded[i]);
}

/* Signals: forwarded while we wait, delivered only inside ppoll. A program that was
 * exec'ing gets what an exec gives: no handler of its own runs any more. */
static void take_signals(int in_process)
{
    if (in_process) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        for (int sig = 1; sig <= MAX_SIG; sig++) {
            struct sigaction old;
            if (sig == SIGKILL || sig == SIGSTOP || is_forwarded(sig) ||
                sigaction(sig, NULL, &old) < 0)
                continue;
            if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)
                sigaction(sig, &dfl, NULL);
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);
    for (int i = 0; i < N_FORWARDED; i++)
        sigaction(forwarded[i], &sa, NULL);
}

/* The claim is sent on sock: wait for the program's end, forwarding signals, and end the
 * same way. */
__attribute__((noreturn)) static void await_program(int sock, char *const *cmd,
                                                    const char *ticket, const sigset_t *mask)
{
    sigset_t waitmask = *mask;
    /* The program has its own copies now. Keep only the claim and a private stderr for our
     * messages, so that a reader of our stdout sees end-of-file when the program (not we)
     * closes it. */
    int errfd = eg_sys_fcntl(2, F_DUPFD_CLOEXEC, 3);
    if (errfd < 0)
        errfd = -1;
    close_all_but(sock, errfd);

    for (;;) {
        if (any_pending) {
            any_pending = 0;
            for (int s = 1; s <= MAX_SIG; s++) {
                if (!pending[s])
                    continue;
                pending[s] = 0;
                send_signal(sock, s);
            }
        }
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int k = eg_sys_ppoll_masked(&pfd, 1, NULL, &waitmask);
        if (k < 0) {
            if (k == -EINTR)
                continue;
            deny(errfd, cmd, ticket, "waiting for the escalated program failed", -k);
        }
        if (k > 0)
            break;
    }

    end_as_program(sock, errfd, cmd, ticket);
}

/* The program's end is the next frame on sock: read it and end the same way. */
__attribute__((noreturn)) static void end_as_program(int sock, int errfd, char *const *cmd,
                                                     const char *ticket)
{
    char ans[1024]; /* (a longer answer is read into fresh memory) */
    char *payload;
    void *map;
    size_t maplen;
    ssize_t len = eg_recv_frame_mm(sock, ans, sizeof ans, &payload, &map, &maplen);
    eg_sys_close(sock);
    if (len == -ENODATA || len == -ECONNRESET)
        deny(errfd, cmd, ticket, "the execgate server closed the connection without an exit "
                                 "status", 0);
    if (len < 0)
        deny(errfd, cmd, ticket, "no exit status from the execgate server", (int)-len);
    struct eg_fields f;
    eg_fields_init(&f, payload, (size_t)len);
    const char *tag = eg_next(&f, NULL);
    const char *kind = eg_next(&f, NULL);
    if (tag && kind && strcmp(tag, EG_TAG) == 0 && payload[len - 1] == '\0') {
        if (strcmp(kind, "exit") == 0) {
            long long code;
            if (eg_next_long(&f, &code) == 0 && eg_fields_done(&f) && code >= 0 && code <= 255)
                eg_sys_exit((int)code);
        } else if (strcmp(kind, "signal") == 0) {
            long long sig;
            if (eg_next_long(&f, &sig) == 0 && eg_fields_done(&f) && sig > 0 && sig <= MAX_SIG)
                die_by_signal((int)sig);
        } else if (strcmp(kind, "deny") == 0) {
            size_t n;
            const char *msg = eg_next(&f, &n);
            if (msg && eg_fields_done(&f)) {
                static const char missing[] = "No such file or directory";
                int code = memmem(msg, n, missing, sizeof missing - 1) ? 127 : 126;
                if (errfd >= 0) {
                    eg_write_all(errfd, msg, n);
                    eg_write_all(errfd, "\n", 1);
                }
                eg_sys_exit(code);
            }
        }
    }
    deny(errfd, cmd, ticket, "malformed answer from the execgate server", 0);
}

void eg_claim_standing(const char *path, int prog, char *const *argv, char *const *envp,
                       char *const *cmd)
{
    if (!eg_sess.ok || !eg_sess.claim[0] || prog < 0 || !argv || !argv[0])
        return;
    int fds[EG_MAX_FDS];
    int dropped;
    int nfds = collect_fds(fds, EG_MAX_FDS - 1, &dropped);
    if (dropped) /* the ticket's claim says so */
        return;
    fds[nfds] = prog;

    /* the frame: EG1 standing TOKEN PATH ARGC ARGV… NFDS FD… ENVC ENV… */
    size_t argc = 0, envc;
    size_t size = EG_HEADER + 64 + EG_TOKEN_LEN + strlen(path) + (size_t)nfds * 12 + 48 +
                  env_bytes(envp, &envc);
    for (; argv[argc]; argc++)
        size += strlen(argv[argc]) + 1;
    char small[16384] __attribute__((aligned(16)));
    void *mem = small;
    if (size > sizeof small && !(mem = eg_sys_map_anon(size)))
        return;
    struct eg_buf b;
    eg_buf_init(&b, mem, size);
    eg_put(&b, EG_TAG);
    eg_put(&b, "standing");
    eg_put(&b, eg_sess.token);
    eg_put(&b, path);
    eg_put_ulong(&b, argc);
    for (size_t i = 0; i < argc; i++)
        eg_put(&b, argv[i]);
    put_fds_env(&b, fds, nfds, envp, envc);

    /* Blocked until the answer: a `go` takes them over as a claim does, a miss gives them
     * back as they were. */
    sigset_t waitmask, before;
    eg_sigemptyset(&before);
    eg_sys_sigprocmask(SIG_BLOCK, NULL, &before);
    block_forwarded(&waitmask);
    int sock = eg_connect(eg_sess.claim);
    int r = sock < 0 ? sock : eg_send_frame(sock, &b, fds, nfds + 1);
    if (mem != small)
        eg_sys_munmap(mem, size);
    char ans[256];
    char *payload = NULL;
    void *map = NULL;
    size_t maplen = 0;
    if (r >= 0)
        r = eg_await_readable(sock);
    ssize_t len = r < 0 ? r : eg_recv_frame_mm(sock, ans, sizeof ans, &payload, &map, &maplen);
    if (map)
        eg_sys_munmap(map, maplen);
    if (len > 0 && payload[len - 1] == '\0') {
        struct eg_fields f;
        eg_fields_init(&f, payload, (size_t)len);
        const char *tag = eg_next(&f, NULL), *kind = eg_next(&f, NULL);
        int ours = tag && kind && !strcmp(tag, EG_TAG);
        if (ours && !strcmp(kind, "go") && eg_fields_done(&f)) {
            /* A short program may have ended already (the launcher can resume from its
             * vfork after that): nothing is left to take over, its end is the next frame. */
            struct pollfd now = {.fd = sock, .events = POLLIN};
            struct timespec zero = {0, 0};
            if (eg_sys_ppoll_masked(&now, 1, &zero, NULL) == 1)
                end_as_program(sock, 2, cmd, NULL);
            take_signals(1);
            await_program(sock, cmd, NULL, &waitmask);
        }
        if (ours && !strcmp(kind, "deny")) { /* it was a hit, and the program could not start */
            size_t n;
            const char *msg = eg_next(&f, &n);
            if (msg && eg_fields_done(&f)) {
                static const char missing[] = "No such file or directory";
                eg_write_all(2, msg, n);
                eg_write_all(2, "\n", 1);
                eg_sys_exit(memmem(msg, n, missing, sizeof missing - 1) ? 127 : 126);
            }
        }
        if (!ours || strcmp(kind, "miss") || !eg_fields_done(&f))
            deny(2, cmd, NULL, "malformed answer from the execgate server", 0);
    } else if (len != -ENODATA && r >= 0) {
        /* anything but a clean miss or no connection at all: the launcher may have started
         * the program, so nothing else may run in its place */
        deny(2, cmd, NULL, "malformed answer from the execgate server", 0);
    }
    if (sock >= 0)
        eg_sys_close(sock);
    eg_sys_sigprocmask(SIG_SETMASK, &before, NULL);
}
