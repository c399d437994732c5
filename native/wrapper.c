/* execgate-wrapper (docs/protocol.md §4, §5).
 *
 *   execgate-wrapper FILE [ARGV]...   patched-shell convention: gate FILE, then exec it
 *                                     (raw syscall: a preloaded interposer does not ask again),
 *                                     deny (126) or claim the escalation in-process
 *   argv = ["execgate-claim", TICKET] claim mode: started by the interposer for an escalation;
 *                                     sends its descriptors and environment, waits for the
 *                                     escalated program and ends the same way it did
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"
#include "gate.h"

static const int forwarded[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGUSR1,
                                SIGUSR2, SIGALRM, SIGWINCH, SIGCONT};
#define N_FORWARDED (int)(sizeof forwarded / sizeof forwarded[0])

static volatile sig_atomic_t pending[65];
static volatile sig_atomic_t any_pending;

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    /* The terminal's signals (Ctrl-C, …) reached the escalated program through its process
     * group already. */
    if (si && si->si_code == SI_KERNEL)
        return;
    if (sig > 0 && sig < 65) {
        pending[sig] = 1;
        any_pending = 1;
    }
}

static int errfd = 2;

static void say(const char *a, const char *b, const char *c)
{
    char buf[2048];
    size_t n = 0;
    const char *parts[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        if (!parts[i])
            continue;
        size_t k = strlen(parts[i]);
        if (k > sizeof buf - 2 - n)
            k = sizeof buf - 2 - n;
        memcpy(buf + n, parts[i], k);
        n += k;
    }
    buf[n++] = '\n';
    if (errfd >= 0)
        eg_write_all(errfd, buf, n);
}

/* The descriptors the escalated program must inherit: every open, non-close-on-exec one. */
static int collect_fds(int *out, int max, int *dropped)
{
    int n = 0;
    *dropped = 0;
    int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        char buf[4096];
        for (;;) {
            long k = syscall(SYS_getdents64, dir, buf, sizeof buf);
            if (k <= 0)
                break;
            for (long off = 0; off < k;) {
                struct {
                    unsigned long long ino;
                    long long off;
                    unsigned short reclen;
                    unsigned char type;
                    char name[];
                } *d = (void *)(buf + off);
                off += d->reclen;
                if (d->name[0] < '0' || d->name[0] > '9')
                    continue;
                int fd = atoi(d->name);
                if (fd == dir)
                    continue;
                int fl = fcntl(fd, F_GETFD);
                if (fl < 0 || (fl & FD_CLOEXEC))
                    continue;
                if (n < 1024)
                    out[n++] = fd;
            }
        }
        close(dir);
    } else {
        for (int fd = 0; fd < 1024; fd++) {
            int fl = fcntl(fd, F_GETFD);
            if (fl >= 0 && !(fl & FD_CLOEXEC))
                out[n++] = fd;
        }
    }
    /* ascending order */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    if (n > max) {
        *dropped = n - max;
        n = max;
    }
    return n;
}

static void die_by_signal(int sig)
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

static void cmd_text(char *out, size_t cap, char *const *cmd, const char *ticket)
{
    out[0] = '\0';
    if (cmd && cmd[0])
        return;
    snprintf(out, cap, "escalated program (ticket %.64s)", ticket);
}

static int claim_deny(char *const *cmd, const char *ticket, const char *reason, int err)
{
    char who[128];
    cmd_text(who, sizeof who, cmd, ticket);
    char detail[256] = "";
    if (err)
        snprintf(detail, sizeof detail, " (%s)", eg_strerror(err));
    if (errfd >= 0)
        eg_deny_line_fd(errfd, cmd && cmd[0] ? cmd : NULL, who, reason, detail);
    return 126;
}

/* Claim an escalation ticket (§4). Returns the exit code; a signal death is re-raised. cmd is
 * the command (for messages) when known. */
static int claim(const char *ticket, char *const *envp, char *const *cmd)
{
    if (!eg_sess.ok) {
        eg_deny_line(cmd, "execgate-claim", "no execgate session: ", eg_sess.reason);
        return 126;
    }
    int fds[1024];
    int dropped;
    int nfds = collect_fds(fds, EG_MAX_FDS, &dropped);
    if (dropped) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "execgate: warning: %d inherited descriptors above fd %d not passed to the "
                 "escalated program (at most %d)", dropped, fds[nfds - 1], EG_MAX_FDS);
        say(msg, NULL, NULL);
    }

    /* the frame: EG1 claim TOKEN TICKET NFDS FD… ENVC ENV… */
    size_t size = EG_HEADER + 64 + EG_TOKEN_LEN + strlen(ticket) + (size_t)nfds * 12 + 24;
    size_t envc = 0;
    if (envp)
        for (; envp[envc]; envc++)
            size += strlen(envp[envc]) + 1;
    char *mem = malloc(size);
    if (!mem)
        return claim_deny(cmd, ticket, "out of memory", 0);
    struct eg_buf b;
    eg_buf_init(&b, mem, size);
    eg_put(&b, EG_TAG);
    eg_put(&b, "claim");
    eg_put(&b, eg_sess.token);
    eg_put(&b, ticket);
    eg_put_long(&b, nfds);
    for (int i = 0; i < nfds; i++)
        eg_put_long(&b, fds[i]);
    eg_put_ulong(&b, envc);
    for (size_t i = 0; i < envc; i++)
        eg_put(&b, envp[i]);

    /* signals: forwarded while we wait, delivered only inside ppoll */
    sigset_t block, waitmask;
    sigemptyset(&block);
    for (int i = 0; i < N_FORWARDED; i++)
        sigaddset(&block, forwarded[i]);
    sigprocmask(SIG_BLOCK, &block, &waitmask);
    for (int i = 0; i < N_FORWARDED; i++)
        sigdelset(&waitmask, forwarded[i]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);
    for (int i = 0; i < N_FORWARDED; i++)
        sigaction(forwarded[i], &sa, NULL);

    int sock = eg_connect(eg_sess.sock);
    if (sock < 0) {
        free(mem);
        return claim_deny(cmd, ticket, "execgate server unreachable", -sock);
    }
    int r = eg_send_frame(sock, &b, fds, nfds);
    free(mem);
    if (r < 0)
        return claim_deny(cmd, ticket, "cannot send the claim to the execgate server", -r);

    /* The program has its own copies now; keep only a private stderr for our messages, so a
     * reader of our stdout sees end-of-file when the program (not we) closes it. */
    errfd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);

    for (;;) {
        if (any_pending) {
            any_pending = 0;
            for (int s = 1; s < 65; s++) {
                if (!pending[s])
                    continue;
                pending[s] = 0;
                char frame[64];
                struct eg_buf sb;
                eg_buf_init(&sb, frame, sizeof frame);
                eg_put(&sb, EG_TAG);
                eg_put(&sb, "signal");
                eg_put_long(&sb, s);
                eg_send_frame(sock, &sb, NULL, 0); /* a gone server shows up as EOF below */
            }
        }
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int k = ppoll(&pfd, 1, NULL, &waitmask);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return claim_deny(cmd, ticket, "waiting for the escalated program failed", errno);
        }
        if (k == 0)
            continue;
        break;
    }

    char ans[8192];
    char *payload;
    void *map;
    size_t maplen;
    ssize_t len = eg_recv_frame_mm(sock, ans, sizeof ans, &payload, &map, &maplen);
    close(sock);
    if (len == -ENODATA || len == -ECONNRESET)
        return claim_deny(cmd, ticket, "the execgate server closed the connection without an "
                                       "exit status", 0);
    if (len < 0)
        return claim_deny(cmd, ticket, "no exit status from the execgate server", (int)-len);
    struct eg_fields f;
    eg_fields_init(&f, payload, (size_t)len);
    const char *tag = eg_next(&f, NULL);
    const char *kind = eg_next(&f, NULL);
    if (tag && kind && strcmp(tag, EG_TAG) == 0 && payload[len - 1] == '\0') {
        if (strcmp(kind, "exit") == 0) {
            long long code;
            if (eg_next_long(&f, &code) == 0 && eg_fields_done(&f) && code >= 0 && code <= 255)
                return (int)code;
        } else if (strcmp(kind, "signal") == 0) {
            long long sig;
            if (eg_next_long(&f, &sig) == 0 && eg_fields_done(&f) && sig > 0 && sig < 65)
                die_by_signal((int)sig);
        } else if (strcmp(kind, "deny") == 0) {
            size_t n;
            const char *msg = eg_next(&f, &n);
            if (msg && eg_fields_done(&f)) {
                say(msg, NULL, NULL);
                return strstr(msg, "No such file or directory") ? 127 : 126;
            }
        }
    }
    if (map)
        munmap(map, maplen);
    return claim_deny(cmd, ticket, "malformed answer from the execgate server", 0);
}

/* ---------------------------------------------------------------- patched-shell mode */

struct run_ctx {
    char *const *argv;
};

static int wrapper_run(void *vctx, const struct eg_plan *plan)
{
    struct run_ctx *x = vctx;
    if (plan->how == EG_HOW_CLAIM)
        exit(claim(plan->ticket, plan->envp, x->argv));
    return eg_exec_plan(plan);
}

/* libexecgate.so beside this executable (both live in execgate/_bin). */
static const char *sibling_preload(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 32);
    if (n <= 0 || (size_t)n >= cap - 32)
        return NULL;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash)
        return NULL;
    strcpy(slash + 1, "libexecgate.so");
    return access(out, R_OK) == 0 ? out : NULL;
}

int main(int argc, char **argv, char **envp)
{
    static char self[EG_PATH];
    eg_session_load(envp, sibling_preload(self, sizeof self));

    if (argc == 2 && argv[0] && strcmp(argv[0], "execgate-claim") == 0)
        return claim(argv[1], envp, NULL);

    if (argc < 2) {
        static const char usage[] = "usage: execgate-wrapper FILE [ARGV]...\n";
        eg_write_all(2, usage, sizeof usage - 1);
        return 2;
    }
    struct run_ctx x = {.argv = argv + 2};
    struct eg_call c = {.via = "wrapper", .dirfd = AT_FDCWD, .path = argv[1], .fd = -1,
                        .argv = argv + 2, .envp = envp};
    int r = eg_gate(&c, wrapper_run, &x);
    if (c.denied)
        return 126;
    say("execgate-wrapper: ", argv[1], r == ENOENT ? ": No such file or directory"
                                                   : r == EACCES ? ": Permission denied"
                                                   : r == ENOEXEC ? ": Exec format error"
                                                                  : ": cannot execute");
    return r == ENOENT ? 127 : 126;
}
