/* posix_spawn of a judged descriptor (spawn.h). The child's steps and their error rules are
 * glibc's (sysdeps/unix/sysv/linux/spawni.c): signal dispositions, scheduling, session, process
 * group, ids, file actions in order, signal mask, exec. The child runs on its own stack in the
 * caller's memory, so it uses raw system calls only (sys.h): no errno, no lock, no libc state.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include "spawn.h"
#include "sys.h"

/* glibc's struct __spawn_action (posix/spawn_int.h): tags appended over the years (chdir and
 * fchdir in 2.29, closefrom in 2.34, tcsetpgrp in 2.35), never reordered. probe_layout()
 * checks it against actions glibc itself built before any is read. */
enum { DO_CLOSE, DO_DUP2, DO_OPEN, DO_CHDIR, DO_FCHDIR, DO_CLOSEFROM, DO_TCSETPGRP };

struct glibc_action {
    int tag;
    union {
        struct { int fd; } close;
        struct { int fd, newfd; } dup2;
        struct { int fd; char *path; int oflag; mode_t mode; } open;
        struct { char *path; } chdir;
        struct { int fd; } fchdir;
        struct { int from; } closefrom;
        struct { int fd; } tcsetpgrp;
    } u;
};

#ifndef POSIX_SPAWN_USEVFORK
#define POSIX_SPAWN_USEVFORK 0
#endif
#ifndef POSIX_SPAWN_SETSID
#define POSIX_SPAWN_SETSID 0
#endif
/* POSIX_SPAWN_SETCGROUP (clone3 into a cgroup) is glibc's alone. */
#define FLAGS_DONE                                                                            \
    (POSIX_SPAWN_RESETIDS | POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |                   \
     POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSCHEDPARAM | POSIX_SPAWN_SETSCHEDULER |          \
     POSIX_SPAWN_USEVFORK | POSIX_SPAWN_SETSID)

static const struct glibc_action *actions_of(const posix_spawn_file_actions_t *fa, int *n)
{
    *n = fa ? fa->__used : 0;
    return fa ? (const struct glibc_action *)(const void *)fa->__actions : NULL;
}

/* ---------------------------------------------------------------- the layout, checked */

/* The highest tag whose layout probe_layout() checked; -1: none, or not checked yet (file
 * actions are then left to glibc). Written once, under pthread_once. */
static int checked_tag = -1;

typedef int (*add_path_fn)(posix_spawn_file_actions_t *, const char *);
typedef int (*add_fd_fn)(posix_spawn_file_actions_t *, int);

static int probe_matches(const posix_spawn_file_actions_t *fa, int want)
{
    int n;
    const struct glibc_action *a = actions_of(fa, &n);
    if (n != want + 1 || fa->__allocated < n || !a)
        return 0;
    int ok = a[0].tag == DO_CLOSE && a[0].u.close.fd == 7 && a[1].tag == DO_DUP2 &&
             a[1].u.dup2.fd == 1 && a[1].u.dup2.newfd == 9 && a[2].tag == DO_OPEN &&
             a[2].u.open.fd == 8 && a[2].u.open.path && strcmp(a[2].u.open.path, "/p") == 0 &&
             a[2].u.open.oflag == (O_RDONLY | O_NOCTTY) && a[2].u.open.mode == 0640;
    if (ok && want >= DO_CHDIR)
        ok = a[3].tag == DO_CHDIR && a[3].u.chdir.path && strcmp(a[3].u.chdir.path, "/c") == 0;
    if (ok && want >= DO_FCHDIR)
        ok = a[4].tag == DO_FCHDIR && a[4].u.fchdir.fd == 6;
    if (ok && want >= DO_CLOSEFROM)
        ok = a[5].tag == DO_CLOSEFROM && a[5].u.closefrom.from == 11;
    if (ok && want >= DO_TCSETPGRP)
        ok = a[6].tag == DO_TCSETPGRP && a[6].u.tcsetpgrp.fd == 5;
    return ok;
}

static int (*probe_init)(posix_spawn_file_actions_t *);

/* Build one action of every kind this glibc has with its own functions (the newer ones looked
 * up: this library must load on a glibc without them) and read them back. */
static void probe_layout(void)
{
    posix_spawn_file_actions_t fa;
    if (!probe_init || probe_init(&fa) != 0)
        return;
    int top = -1;
    if (posix_spawn_file_actions_addclose(&fa, 7) == 0 &&
        posix_spawn_file_actions_adddup2(&fa, 1, 9) == 0 &&
        posix_spawn_file_actions_addopen(&fa, 8, "/p", O_RDONLY | O_NOCTTY, 0640) == 0) {
        top = DO_OPEN;
        /* the later kinds, in tag order (probe_matches' values), as far as this glibc has them */
        static const char *const later[] = {
            "posix_spawn_file_actions_addchdir_np", "posix_spawn_file_actions_addfchdir_np",
            "posix_spawn_file_actions_addclosefrom_np", "posix_spawn_file_actions_addtcsetpgrp_np",
        };
        static const int later_fd[] = {-1, 6, 11, 5}; /* -1: the path "/c" */
        for (int i = 0; i < 4; i++) {
            void *add = dlsym(RTLD_DEFAULT, later[i]);
            int r = !add               ? -1
                    : later_fd[i] < 0 ? ((add_path_fn)add)(&fa, "/c")
                                      : ((add_fd_fn)add)(&fa, later_fd[i]);
            if (r != 0)
                break;
            top = DO_CHDIR + i;
        }
    }
    if (top >= DO_OPEN && !probe_matches(&fa, top))
        top = -1; /* a layout that differs anywhere is not read at all */
    posix_spawn_file_actions_destroy(&fa);
    __atomic_store_n(&checked_tag, top, __ATOMIC_RELEASE);
}

void eg_spawn_check_layout(int (*init)(posix_spawn_file_actions_t *))
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    __atomic_store_n(&probe_init, init, __ATOMIC_RELAXED); /* always glibc's, read in the once */
    pthread_once(&once, probe_layout);
}

int eg_spawn_supported(const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr)
{
    short flags = 0;
    if (attr && (posix_spawnattr_getflags(attr, &flags) != 0 || (flags & ~FLAGS_DONE)))
        return 0;
    int n;
    const struct glibc_action *a = actions_of(fa, &n);
    if (n == 0)
        return 1;
    int checked = __atomic_load_n(&checked_tag, __ATOMIC_ACQUIRE);
    if (n < 0 || n > fa->__allocated || !a)
        return 0;
    for (int i = 0; i < n; i++) {
        if (a[i].tag < 0 || a[i].tag > checked)
            return 0;
        if ((a[i].tag == DO_OPEN && !a[i].u.open.path) ||
            (a[i].tag == DO_CHDIR && !a[i].u.chdir.path))
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- the child */

struct child {
    int fd; /* the judged program */
    char *const *argv;
    char *const *envp;
    const struct glibc_action *acts;
    int nacts;
    short flags;
    pid_t pgrp;
    int policy;
    struct sched_param sp;
    unsigned long sigdef, sigmask, oldmask; /* the kernel's 64-signal sets */
    volatile int err; /* set by the child when it fails; CLONE_VFORK: read after it is gone */
};

/* The kernel's struct sigaction (rt_sigaction), the same on x86-64 and AArch64. */
struct ksigaction {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)(void);
    unsigned long mask;
};

#define KSIGSET 8 /* bytes of the kernel's signal set */

/* glibc's own signals, SIGCANCEL (32) and SIGSETXID (33), in a kernel set: its child ignores
 * them, and its sigprocmask never blocks them. */
#define GLIBC_SIGNALS (3UL << 31)

static int sig_is_member(unsigned long set, int sig) { return (int)((set >> (sig - 1)) & 1); }

/* No handler may run in the child (it runs in the caller's memory): every caught signal goes
 * back to its default, as glibc does; glibc's own signals are ignored; those in
 * POSIX_SPAWN_SETSIGDEF's set are defaulted. */
static void child_signals(const struct child *c)
{
    for (int sig = 1; sig <= 64; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        struct ksigaction sa = {0};
        if ((c->flags & POSIX_SPAWN_SETSIGDEF) && sig_is_member(c->sigdef, sig)) {
            sa.handler = SIG_DFL;
        } else if (sig_is_member(GLIBC_SIGNALS, sig)) {
            sa.handler = SIG_IGN;
        } else {
            struct ksigaction old;
            if (EG_SC(SYS_rt_sigaction, sig, NULL, &old, KSIGSET, 0, 0) < 0 ||
                old.handler == SIG_IGN || old.handler == SIG_DFL)
                continue;
            sa.handler = SIG_DFL;
        }
        (void)EG_SC(SYS_rt_sigaction, sig, &sa, NULL, KSIGSET, 0, 0);
    }
}

/* The descriptor numbers action a names, as a source or a target: how many, in fds. */
static int action_fds(const struct glibc_action *a, int fds[2])
{
    switch (a->tag) {
    case DO_DUP2:
        fds[0] = a->u.dup2.fd;
        fds[1] = a->u.dup2.newfd;
        return 2;
    case DO_CLOSE:
        fds[0] = a->u.close.fd;
        return 1;
    case DO_OPEN:
        fds[0] = a->u.open.fd;
        return 1;
    case DO_FCHDIR:
        fds[0] = a->u.fchdir.fd;
        return 1;
    case DO_TCSETPGRP:
        fds[0] = a->u.tcsetpgrp.fd;
        return 1;
    default:
        return 0;
    }
}

/* Move the judged descriptor above `above` (every number the file actions name, so one move
 * does); the new number, or -errno. Its old number is then free for the actions: one that uses
 * it as a source fails as it would have without the gate (it was not open before posix_spawn
 * was called). No free number up there (the table full to its limit): EMFILE, where glibc,
 * needing no descriptor of its own, might have succeeded. */
static int move_program(int fd, int above)
{
    int nfd = eg_sys_fcntl(fd, F_DUPFD_CLOEXEC, (above > fd ? above : fd) + 1);
    if (nfd < 0)
        return nfd == -EINVAL ? -EMFILE : nfd; /* EINVAL: the first candidate is past the limit */
    eg_sys_close(fd);
    return nfd;
}

static int close_from(int from, int spare)
{
    int r = 0;
    if (from < spare)
        r = (int)EG_SC(SYS_close_range, from, spare - 1, 0, 0, 0, 0);
    if (r == 0)
        r = (int)EG_SC(SYS_close_range, (from > spare ? from : spare + 1), ~0U, 0, 0, 0, 0);
    if (r == -ENOSYS) { /* before Linux 5.9 */
        struct rlimit rl;
        if (EG_SC(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl, 0, 0) < 0)
            return r;
        for (unsigned long fd = (unsigned long)from; fd < rl.rlim_cur; fd++)
            if (fd != (unsigned long)spare)
                eg_sys_close((int)fd);
        r = 0;
    }
    return r;
}

/* One file action, as glibc's child does it; 0 or -errno. */
static int child_action(const struct child *c, const struct glibc_action *a)
{
    long r = 0;
    switch (a->tag) {
    case DO_CLOSE:
        if (eg_sys_close(a->u.close.fd) < 0) { /* glibc: an error only for a number out of range */
            struct rlimit rl;
            if (a->u.close.fd < 0 ||
                (EG_SC(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl, 0, 0) == 0 &&
                 (unsigned long)a->u.close.fd >= rl.rlim_cur))
                return -EBADF;
        }
        return 0;
    case DO_OPEN: {
        int want = a->u.open.fd;
        eg_sys_close(want); /* POSIX: an open descriptor of that number is closed first */
        int fd = (int)EG_SC(SYS_openat, AT_FDCWD, a->u.open.path, a->u.open.oflag | O_LARGEFILE,
                            a->u.open.mode, 0, 0);
        if (fd < 0 || fd == want)
            return fd < 0 ? fd : 0;
        r = EG_SC(SYS_dup3, fd, want, 0, 0, 0, 0);
        eg_sys_close(fd);
        return r < 0 ? (int)r : 0;
    }
    case DO_DUP2:
        if (a->u.dup2.fd == a->u.dup2.newfd) { /* Austin Group 411: clears close-on-exec */
            int fl = eg_sys_fcntl(a->u.dup2.fd, F_GETFD, 0);
            if (fl < 0)
                return fl;
            return eg_sys_fcntl(a->u.dup2.fd, F_SETFD, fl & ~FD_CLOEXEC) < 0 ? -EBADF : 0;
        }
        r = EG_SC(SYS_dup3, a->u.dup2.fd, a->u.dup2.newfd, 0, 0, 0, 0);
        return r < 0 ? (int)r : 0;
    case DO_CHDIR:
        r = EG_SC(SYS_chdir, a->u.chdir.path, 0, 0, 0, 0, 0);
        return (int)r;
    case DO_FCHDIR:
        r = EG_SC(SYS_fchdir, a->u.fchdir.fd, 0, 0, 0, 0, 0);
        return (int)r;
    case DO_TCSETPGRP: {
        pid_t pgrp = (c->flags & POSIX_SPAWN_SETPGROUP) && c->pgrp != 0
                         ? c->pgrp
                         : (pid_t)EG_SC(SYS_getpgid, 0, 0, 0, 0, 0, 0);
        r = EG_SC(SYS_ioctl, a->u.tcsetpgrp.fd, TIOCSPGRP, &pgrp, 0, 0, 0);
        return (int)r;
    }
    default:
        return -EINVAL; /* eg_spawn_supported lets no other tag through */
    }
}

static int child_setup(const struct child *c, int *fd)
{
    child_signals(c);
    long r = 0;
    if ((c->flags & (POSIX_SPAWN_SETSCHEDPARAM | POSIX_SPAWN_SETSCHEDULER)) ==
        POSIX_SPAWN_SETSCHEDPARAM)
        r = EG_SC(SYS_sched_setparam, 0, &c->sp, 0, 0, 0, 0);
    else if (c->flags & POSIX_SPAWN_SETSCHEDULER)
        r = EG_SC(SYS_sched_setscheduler, 0, c->policy, &c->sp, 0, 0, 0);
    if (r < 0)
        return (int)r;
    if ((c->flags & POSIX_SPAWN_SETSID) && (r = EG_SC(SYS_setsid, 0, 0, 0, 0, 0, 0)) < 0)
        return (int)r;
    if ((c->flags & POSIX_SPAWN_SETPGROUP) &&
        (r = EG_SC(SYS_setpgid, 0, c->pgrp, 0, 0, 0, 0)) < 0)
        return (int)r;
    if (c->flags & POSIX_SPAWN_RESETIDS) {
        long uid = EG_SC(SYS_getuid, 0, 0, 0, 0, 0, 0), gid = EG_SC(SYS_getgid, 0, 0, 0, 0, 0, 0);
        if ((r = EG_SC(SYS_setresuid, -1, uid, -1, 0, 0, 0)) < 0 ||
            (r = EG_SC(SYS_setresgid, -1, gid, -1, 0, 0, 0)) < 0)
            return (int)r;
    }
    int named_top = 0, fds[2];
    for (int i = 0; i < c->nacts; i++)
        for (int k = action_fds(&c->acts[i], fds); k-- > 0;)
            named_top = fds[k] > named_top ? fds[k] : named_top;
    for (int i = 0; i < c->nacts; i++) {
        /* read once: what is checked against the program's number is what is carried out */
        const struct glibc_action copy = c->acts[i], *a = &copy;
        if (a->tag == DO_CLOSEFROM) { /* every descriptor from there on, but the program */
            if ((r = close_from(a->u.closefrom.from, *fd)) < 0)
                return (int)r;
            continue;
        }
        int names_program = 0, top = named_top; /* this copy's too, should another thread */
        for (int k = action_fds(a, fds); k-- > 0;) { /* have changed the actions since */
            names_program |= fds[k] == *fd;
            top = fds[k] > top ? fds[k] : top;
        }
        if (names_program && (*fd = move_program(*fd, top)) < 0)
            return *fd;
        if ((r = child_action(c, a)) < 0)
            return (int)r;
    }
    unsigned long mask = (c->flags & POSIX_SPAWN_SETSIGMASK) ? c->sigmask : c->oldmask;
    (void)EG_SC(SYS_rt_sigprocmask, SIG_SETMASK, &mask, NULL, KSIGSET, 0, 0);
    return 0;
}

static int child_main(void *arg)
{
    struct child *c = arg;
    int fd = c->fd;
    int r = child_setup(c, &fd);
    if (r == 0)
        r = (int)EG_SC(SYS_execveat, fd, "", c->argv, c->envp, AT_EMPTY_PATH, 0);
    c->err = r < 0 ? -r : ECHILD;
    eg_sys_exit(127);
}

/* ---------------------------------------------------------------- the caller */

#define CHILD_STACK (32 * 1024) /* glibc's slack too: the child's frames are small */

static unsigned long kernel_set(const sigset_t *s)
{
    unsigned long k = 0;
    for (int sig = 1; sig <= 64; sig++)
        if (sigismember(s, sig) == 1)
            k |= 1UL << (sig - 1);
    return k;
}

int eg_spawn_fd(pid_t *pid, int fd, const posix_spawn_file_actions_t *fa,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    struct child c = {.fd = fd, .argv = argv, .envp = envp, .err = 0};
    c.acts = actions_of(fa, &c.nacts);
    if (attr) {
        sigset_t s;
        (void)posix_spawnattr_getflags(attr, &c.flags);
        (void)posix_spawnattr_getpgroup(attr, &c.pgrp);
        (void)posix_spawnattr_getschedpolicy(attr, &c.policy);
        (void)posix_spawnattr_getschedparam(attr, &c.sp);
        if (posix_spawnattr_getsigdefault(attr, &s) == 0)
            c.sigdef = kernel_set(&s);
        if (posix_spawnattr_getsigmask(attr, &s) == 0)
            c.sigmask = kernel_set(&s) & ~GLIBC_SIGNALS;
    }
    void *stack = eg_sys_map_anon(CHILD_STACK);
    if (!stack)
        return ENOMEM;
    int cancel;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
    unsigned long all = ~0UL;
    (void)EG_SC(SYS_rt_sigprocmask, SIG_SETMASK, &all, &c.oldmask, KSIGSET, 0, 0);

    /* CLONE_VFORK: this thread goes on once the child has exec'ed or exited */
    int saved = errno;
    pid_t child = clone(child_main, (char *)stack + CHILD_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD,
                        &c);
    int err = child < 0 ? errno : c.err;
    errno = saved;
    if (child > 0 && err) /* it failed before its exec: reap it, as glibc does */
        while (EG_SC(SYS_wait4, child, NULL, 0, NULL, 0, 0) == -EINTR)
            ;

    (void)EG_SC(SYS_rt_sigprocmask, SIG_SETMASK, &c.oldmask, NULL, KSIGSET, 0, 0);
    pthread_setcancelstate(cancel, NULL);
    eg_sys_munmap(stack, CHILD_STACK);
    if (!err && pid)
        *pid = child;
    return err;
}
