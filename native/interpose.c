/* libexecgate.so: the LD_PRELOAD exec interposer (docs/protocol.md §1, §3).
 *
 * Every way a dynamically linked program can start another program goes through eg_gate():
 * the eleven exec/spawn entry points (glibc's execvp & co. call the internal __execve, so each
 * needs its own interposer), and system()/popen(), which glibc implements with its internal,
 * non-interposable posix_spawn and which are therefore re-implemented here on top of the gated
 * one.
 *
 * The exec path is async-signal-safe and vfork-safe: no malloc, no stdio, no locks, no libc
 * call at all (raw syscalls, sys.h; the string functions are the library's own, strings.c), so
 * nothing here is re-entered and no lazy binding happens in a vfork child. posix_spawn, system,
 * popen and pclose keep glibc's contracts (none of them is async-signal- or vfork-safe): the real
 * posix_spawn/pclose are looked up at their first call.
 *
 * Every program a gated process starts loads this library, so loading it does as little as
 * possible: no symbol is bound before its first call (no -z now), the constructor makes two
 * system calls (getpid, and prctl only after an exec by descriptor), reads no file and maps
 * nothing, unless the launcher holds the process for its call (hold.h: EXECGATE_HOLD set). The
 * snapshot is mapped at the first exec, or at a fork() (interposed for that alone): a shell
 * forks a child per program and never execs itself, so without that every child would map and
 * validate the snapshot afresh.
 *
 * An escalated exec is claimed in this very process (eg_claim) when that is safe: the process
 * is not a vfork child (whose parent is suspended until the exec) and has no other thread (an
 * exec would end them). Otherwise it execs the wrapper in claim mode.
 *
 * posix_spawn (and so system/popen) cannot execute a descriptor: it only resolves the program
 * here (errors are the caller's) and spawns the wrapper in its gate mode on the path found; the
 * wrapper asks and executes by descriptor (docs/protocol.md §3).
 */
#include <dlfcn.h>
#include <link.h>
#include <linux/kcmp.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "gate.h"
#include "hold.h"
#include "spawn.h"
#include "sys.h"

#define EXPORT __attribute__((visibility("default")))

extern char **environ;

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
typedef int (*pclose_fn)(FILE *);

static spawn_fn real_posix_spawn_fn;
static pclose_fn real_pclose_fn;

/* libc's own function NAME, looked up at the first call (once per process; a race only looks it
 * up twice). */
static void *real_fn(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!fn) {
        fn = dlsym(RTLD_NEXT, name);
        __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

static spawn_fn real_posix_spawn(void)
{
    return (spawn_fn)real_fn((void **)&real_posix_spawn_fn, "posix_spawn");
}

static pclose_fn real_pclose(void) { return (pclose_fn)real_fn((void **)&real_pclose_fn, "pclose"); }

/* The pid of this process as of its start: a process whose getpid() differs is a child that
 * did not exec (fork, vfork, posix_spawn's or a raw clone). */
static pid_t own_pid;

/* ---------------------------------------------------------------- load */

/* After an exec by descriptor (execveat AT_EMPTY_PATH, or posix_spawn of /proc/self/fd/N) older
 * kernels name the process after the descriptor number; give it back the name an exec by path
 * would have given: the basename of the program as invoked (argv[0]). Every exec in a session
 * is by descriptor, so an all-digit name is taken to be one (asking the loader how this process
 * was exec'd, getauxval(AT_EXECFN), would cost a libc page and a symbol lookup in every
 * process); a program that is really named with digits only keeps its name when argv[0] says
 * the same. */
static void restore_comm(char **argv)
{
    char comm[17] = {0};
    if (eg_sys_prctl(PR_GET_NAME, (unsigned long)comm, 0) != 0 || !comm[0])
        return;
    for (const char *c = comm; *c; c++)
        if (*c < '0' || *c > '9')
            return; /* the kernel already named it after the file (Linux >= 6.14) */
    if (argv && argv[0] && argv[0][0]) {
        const char *name = eg_basename(argv[0]);
        if (*name)
            eg_sys_prctl(PR_SET_NAME, (unsigned long)name, 0);
    }
}

/* This library's own path, as the dynamic loader loaded it: the entry of the loader's list of
 * objects (<link.h>'s r_debug, the debuggers' interface) whose dynamic section is ours. Read
 * without dladdr: no libc call, no loader lock, no symbol bound at load (the constructor runs
 * single-threaded at start-up, or inside the dlopen that holds the loader's lock). */
extern ElfW(Dyn) _DYNAMIC[] __attribute__((visibility("hidden")));

static const char *own_path(void)
{
    for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next)
        if (m->l_ld == _DYNAMIC)
            return m->l_name && m->l_name[0] == '/' ? m->l_name : NULL;
    return NULL;
}

__attribute__((constructor)) static void execgate_init(int argc, char **argv, char **envp)
{
    char **env = envp ? envp : environ;
    eg_hold(argc, argv, &env); /* a held spawn: its call's arguments and environment first */
    own_pid = eg_sys_getpid();
    eg_session_load(env, own_path());
    restore_comm(argv);
}

/* ---------------------------------------------------------------- fork */

/* libc's fork under its other name (GLIBC_2.2.5, the same function: atfork handlers and all) */
extern pid_t __fork(void);

/* A shell forks a child per program and never execs itself: map the snapshot here, once, so
 * its children inherit it instead of each mapping and validating it (gate.h). Not a
 * pthread_atfork handler: registering one writes two pages of libc's data in every process
 * that loads the library, most of which never fork. */
EXPORT pid_t fork(void)
{
    if (eg_sess.ok)
        eg_snapshot_before_fork();
    return __fork();
}

/* ---------------------------------------------------------------- the exec family */

/* glibc declares most of these arguments nonnull; callers pass NULL anyway (execl(p, NULL)),
 * so hide the pointer from the optimizer before testing it. */
static inline const void *launder(const void *p)
{
    __asm__("" : "+r"(p));
    return p;
}

/* May this exec turn the process into the claim itself? Not in a process that shares its memory
 * with another (a vfork child, whose parent is suspended until the exec; a CLONE_VM clone), and
 * not with other threads: an exec would have ended them, a claim would let them run on.
 * unshare(CLONE_VM) asks the kernel exactly that in one call without changing anything: it
 * succeeds only in a single-threaded process whose memory and signal handlers no other shares,
 * and fails with EINVAL otherwise (no /proc: its lookups cost a fresh process ~10 µs). Where it
 * is refused otherwise (a seccomp filter: EPERM), a child is told from a vfork child by kcmp
 * KCMP_VM against the parent and threads are counted in /proc/self/task (2 + threads links);
 * no fork handler is registered at load (that would cost every process a libc page and a
 * write). Unknown (kcmp refused) means no: the wrapper then claims. */
static int claim_here(void)
{
    long r = EG_SC(SYS_unshare, CLONE_VM, 0, 0, 0, 0, 0);
    if (r == 0 || r == -EINVAL)
        return r == 0;
    pid_t pid = eg_sys_getpid();
    if (pid != own_pid &&
        EG_SC(SYS_kcmp, pid, eg_sys_getppid(), KCMP_VM, 0, 0, 0) <= 0) /* 0: the same memory */
        return 0;
    struct stat st;
    return eg_sys_fstatat(AT_FDCWD, "/proc/self/task", &st, 0) == 0 && st.st_nlink == 3;
}

static int exec_run(void *ctx, const struct eg_plan *plan)
{
    if (plan->how == EG_HOW_STANDING) {
        if (claim_here())
            eg_claim_standing(plan->path, plan->fd, plan->argv, plan->envp, plan->argv);
        return 0; /* a miss: ask the server */
    }
    if (plan->how == EG_HOW_CLAIM && claim_here())
        eg_claim(plan->ticket, plan->envp, plan->argv, 1);
    return eg_exec_plan(plan);
}

static int exec_call(struct eg_call *c)
{
    if (!launder(c->path) && c->fd < 0) {
        errno = EFAULT;
        return -1;
    }
    c->standing = 1; /* exec_run claims a standing authorization when it may (claim_here) */
    int r = eg_gate(c, exec_run, NULL);
    errno = r ? r : EINVAL;
    return -1;
}

static const char *caller_path(void) { return eg_getenv(environ, "PATH"); }

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    struct eg_call c = {.via = "execve", .dirfd = AT_FDCWD, .path = path, .fd = -1,
                        .argv = argv, .envp = envp};
    return exec_call(&c);
}

EXPORT int execv(const char *path, char *const argv[])
{
    struct eg_call c = {.via = "execv", .dirfd = AT_FDCWD, .path = path, .fd = -1,
                        .argv = argv, .envp = environ};
    return exec_call(&c);
}

EXPORT int execvp(const char *file, char *const argv[])
{
    struct eg_call c = {.via = "execvp", .dirfd = AT_FDCWD, .path = file, .fd = -1,
                        .search = 1, .sh_fallback = 1, .search_path = caller_path(),
                        .argv = argv, .envp = environ};
    return exec_call(&c);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    struct eg_call c = {.via = "execvpe", .dirfd = AT_FDCWD, .path = file, .fd = -1,
                        .search = 1, .sh_fallback = 1, .search_path = caller_path(),
                        .argv = argv, .envp = envp};
    return exec_call(&c);
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
                    int flags)
{
    if (flags & ~(AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)) {
        errno = EINVAL;
        return -1;
    }
    if (!launder(path)) {
        errno = EFAULT;
        return -1;
    }
    struct eg_call c = {.via = "execveat", .dirfd = dirfd, .path = path, .fd = -1,
                        .atflags = flags, .argv = argv, .envp = envp};
    return exec_call(&c);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    if (fd < 0 || !launder(argv) || !launder(envp)) {
        errno = fd < 0 ? EBADF : EINVAL;
        return -1;
    }
    struct eg_call c = {.via = "fexecve", .dirfd = AT_FDCWD, .path = NULL, .fd = fd,
                        .argv = argv, .envp = envp};
    return exec_call(&c);
}

/* execl*: collect the variadic arguments into an array on the stack. */
#define COUNT_ARGS(last, n)                                                                   \
    do {                                                                                      \
        va_list ap_;                                                                          \
        va_start(ap_, last);                                                                  \
        n = launder(last) ? 1 : 0;                                                            \
        if (n)                                                                                \
            while (va_arg(ap_, char *))                                                       \
                n++;                                                                          \
        va_end(ap_);                                                                          \
    } while (0)

#define COLLECT_ARGS(last, n, argv, envp_out)                                                 \
    do {                                                                                      \
        va_list ap_;                                                                          \
        va_start(ap_, last);                                                                  \
        argv[0] = (char *)last;                                                               \
        for (size_t i_ = 1; i_ < n; i_++)                                                     \
            argv[i_] = va_arg(ap_, char *);                                                   \
        argv[n] = NULL;                                                                       \
        if (n)                                                                                \
            (void)va_arg(ap_, char *); /* the terminating NULL */                             \
        envp_out = va_arg(ap_, char **);                                                      \
        va_end(ap_);                                                                          \
    } while (0)

EXPORT int execl(const char *path, const char *arg, ...)
{
    size_t n;
    COUNT_ARGS(arg, n);
    char *argv[n + 1];
    va_list ap;
    va_start(ap, arg);
    argv[0] = (char *)arg;
    for (size_t i = 1; i < n; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[n] = NULL;
    struct eg_call c = {.via = "execl", .dirfd = AT_FDCWD, .path = path, .fd = -1,
                        .argv = argv, .envp = environ};
    return exec_call(&c);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
    size_t n;
    COUNT_ARGS(arg, n);
    char *argv[n + 1];
    va_list ap;
    va_start(ap, arg);
    argv[0] = (char *)arg;
    for (size_t i = 1; i < n; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[n] = NULL;
    struct eg_call c = {.via = "execlp", .dirfd = AT_FDCWD, .path = file, .fd = -1,
                        .search = 1, .sh_fallback = 1, .search_path = caller_path(),
                        .argv = argv, .envp = environ};
    return exec_call(&c);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
    size_t n;
    COUNT_ARGS(arg, n);
    char *argv[n + 1];
    char **envp;
    COLLECT_ARGS(arg, n, argv, envp);
    struct eg_call c = {.via = "execle", .dirfd = AT_FDCWD, .path = path, .fd = -1,
                        .argv = argv, .envp = envp};
    return exec_call(&c);
}

/* ---------------------------------------------------------------- posix_spawn */

struct spawn_ctx {
    const char *wrapper_argv0;
    pid_t *pid;
    const posix_spawn_file_actions_t *fa;
    const posix_spawnattr_t *attr;
    struct eg_call *call;
};

static int spawn_run(void *vctx, const struct eg_plan *plan)
{
    struct spawn_ctx *x = vctx;
    if (plan->how == EG_HOW_FD) { /* decided here: spawn the judged descriptor (spawn.h) */
        x->call->settled = 1;   /* a child ran: its failure is posix_spawn's answer */
        return eg_spawn_fd(x->pid, plan->fd, x->fa, x->attr, plan->argv, plan->envp);
    }
    spawn_fn spawn = real_posix_spawn();
    if (!spawn)
        return ENOSYS;
    if (plan->how != EG_HOW_GATE)
        return EINVAL;
    /* posix_spawn can only execute a path, and a path can be swapped after any check (and its
     * file actions may close a descriptor we would pass): the child is the wrapper in its gate
     * mode, which opens FILE, asks, and executes by descriptor itself (§3, §5). */
    size_t argc = 0;
    while (plan->argv && plan->argv[argc])
        argc++;
    size_t bytes = (argc + 3) * sizeof(char *);
    void *map = NULL;
    char *vla[bytes <= 64 * 1024 ? argc + 3 : 1];
    char **argv = vla;
    if (bytes > 64 * 1024) {
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED)
            return ENOMEM;
        argv = map;
    }
    argv[0] = (char *)x->wrapper_argv0; /* execgate-via-VIA: the request's VIA field */
    argv[1] = (char *)plan->path;
    for (size_t i = 0; i < argc; i++)
        argv[2 + i] = plan->argv[i];
    argv[argc + 2] = NULL;
    int r = spawn(x->pid, eg_sess.wrapper, x->fa, x->attr, argv, plan->envp);
    if (map)
        munmap(map, bytes);
    return r;
}

static int gated_spawn(const char *via, int search, pid_t *pid, const char *path,
                       const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                       char *const argv[], char *const envp[], int *denied)
{
    pid_t dummy;
    char argv0[48] = "execgate-via-";
    size_t vlen = strlen(via);
    memcpy(argv0 + 13, via, vlen < 34 ? vlen + 1 : 1);
    struct eg_call c = {.via = via, .dirfd = AT_FDCWD, .path = path, .fd = -1, .search = search,
                        .search_path = search ? caller_path() : NULL, .resolve_only = 1,
                        .argv = argv, .envp = envp};
    struct spawn_ctx x = {.wrapper_argv0 = argv0, .pid = pid ? pid : &dummy, .fa = fa,
                          .attr = attr, .call = &c};
    if (!path)
        return EFAULT;
    c.spawn_fd = argv && eg_spawn_supported(fa, attr);
    int saved = errno;
    int r = eg_gate(&c, spawn_run, &x);
    if (denied)
        *denied = c.denied;
    errno = saved;
    return r;
}

typedef int (*fa_init_fn)(posix_spawn_file_actions_t *);
static fa_init_fn real_fa_init_fn;

/* Where a program builds file actions, glibc's layout of them is checked (spawn.h): here it
 * is in an ordinary context, as the actions' own malloc calls are. */
EXPORT int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa)
{
    fa_init_fn init = (fa_init_fn)real_fn((void **)&real_fa_init_fn,
                                          "posix_spawn_file_actions_init");
    if (!init)
        return ENOSYS;
    eg_spawn_check_layout(init);
    return init(fa);
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    return gated_spawn("posix_spawn", 0, pid, path, fa, attr, argv, envp, NULL);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    return gated_spawn("posix_spawnp", 1, pid, file, fa, attr, argv, envp, NULL);
}

/* ---------------------------------------------------------------- system() */

static void spin_lock(int *l)
{
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void spin_unlock(int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

static int sys_lock, sys_refs;
static struct sigaction sys_intr, sys_quit;

EXPORT int system(const char *line)
{
    if (!line)
        return 1; /* a shell is available (the gate decides about each command) */

    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    spin_lock(&sys_lock);
    if (sys_refs++ == 0) {
        sigaction(SIGINT, &ign, &sys_intr);
        sigaction(SIGQUIT, &ign, &sys_quit);
    }
    struct sigaction intr = sys_intr, quit = sys_quit;
    spin_unlock(&sys_lock);

    sigset_t chld, omask;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &omask);

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t reset;
    sigemptyset(&reset);
    if (intr.sa_handler != SIG_IGN)
        sigaddset(&reset, SIGINT);
    if (quit.sa_handler != SIG_IGN)
        sigaddset(&reset, SIGQUIT);
    posix_spawnattr_setsigmask(&attr, &omask);
    posix_spawnattr_setsigdefault(&attr, &reset);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

    char *argv[] = {(char *)"sh", (char *)"-c", (char *)line, NULL};
    pid_t pid;
    int denied = 0, status;
    int ret = gated_spawn("system", 0, &pid, "/bin/sh", NULL, &attr, argv, environ, &denied);
    if (ret == 0) {
        while (waitpid(pid, &status, 0) < 0) {
            if (errno != EINTR) {
                status = -1;
                break;
            }
        }
    } else {
        /* POSIX: as if the shell had exited 127; a denial looks like "cannot execute" (126) */
        status = W_EXITCODE(denied ? 126 : 127, 0);
    }
    posix_spawnattr_destroy(&attr);

    int saved = errno;
    spin_lock(&sys_lock);
    if (--sys_refs == 0) {
        sigaction(SIGINT, &sys_intr, NULL);
        sigaction(SIGQUIT, &sys_quit, NULL);
    }
    spin_unlock(&sys_lock);
    sigprocmask(SIG_SETMASK, &omask, NULL);
    errno = ret ? ret : saved;
    return status;
}

/* ---------------------------------------------------------------- popen() / pclose() */

struct popen_entry {
    FILE *fp;
    int fd;
    pid_t pid;
    struct popen_entry *next;
};

static int popen_lock;
static struct popen_entry *popen_list;

EXPORT FILE *popen(const char *command, const char *mode)
{
    int do_read = 0, do_write = 0, do_cloexec = 0;
    for (const char *m = mode; m && *m; m++) {
        switch (*m) {
        case 'r': do_read = 1; break;
        case 'w': do_write = 1; break;
        case 'e': do_cloexec = 1; break;
        default: errno = EINVAL; return NULL;
        }
    }
    if (!mode || (do_read ^ do_write) == 0) {
        errno = EINVAL;
        return NULL;
    }
    struct popen_entry *entry = malloc(sizeof *entry);
    if (!entry)
        return NULL;

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        free(entry);
        return NULL;
    }
    int parent_end = do_read ? fds[0] : fds[1];
    int child_end = do_read ? fds[1] : fds[0];
    int child_std = do_read ? 1 : 0;
    if (child_end == child_std) {
        /* dup2 onto itself would not clear close-on-exec: move it first */
        int tmp = fcntl(child_end, F_DUPFD_CLOEXEC, 0);
        int e = errno;
        close(child_end);
        if (tmp < 0) {
            close(parent_end);
            free(entry);
            errno = e;
            return NULL;
        }
        child_end = tmp;
    }

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, child_end, child_std);

    spin_lock(&popen_lock);
    /* POSIX: streams of earlier popen() calls still open in the parent are closed in the
     * child */
    for (struct popen_entry *p = popen_list; p; p = p->next)
        if (p->fd != child_std)
            posix_spawn_file_actions_addclose(&fa, p->fd);

    char *argv[] = {(char *)"sh", (char *)"-c", (char *)command, NULL};
    pid_t pid;
    int ret = gated_spawn("popen", 0, &pid, "/bin/sh", &fa, NULL, argv, environ, NULL);
    posix_spawn_file_actions_destroy(&fa);
    close(child_end);
    if (ret != 0) {
        spin_unlock(&popen_lock);
        close(parent_end);
        free(entry);
        errno = ret;
        return NULL;
    }
    if (!do_cloexec)
        fcntl(parent_end, F_SETFD, 0);
    FILE *fp = fdopen(parent_end, do_read ? "r" : "w");
    if (!fp) {
        int e = errno;
        spin_unlock(&popen_lock);
        close(parent_end);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        free(entry);
        errno = e;
        return NULL;
    }
    entry->fp = fp;
    entry->fd = parent_end;
    entry->pid = pid;
    entry->next = popen_list;
    popen_list = entry;
    spin_unlock(&popen_lock);
    return fp;
}

EXPORT int pclose(FILE *fp)
{
    struct popen_entry *found = NULL;
    spin_lock(&popen_lock);
    for (struct popen_entry **pp = &popen_list; *pp; pp = &(*pp)->next) {
        if ((*pp)->fp == fp) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    spin_unlock(&popen_lock);
    if (!found) {
        pclose_fn real = real_pclose();
        if (real)
            return real(fp);
        errno = EINVAL;
        return -1;
    }
    pid_t pid = found->pid;
    free(found);
    fclose(fp);
    int status;
    pid_t r;
    do {
        r = waitpid(pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? -1 : status;
}
