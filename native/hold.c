/* A held spawn's wait for its call (see hold.h, docs/protocol.md §7 "Held spawns"). */
#include "hold.h"

#include "common.h"
#include "gate.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

/* The largest release taken (the server's placeholders are far smaller). */
#define HOLD_MAX (1u << 20)

static __attribute__((noreturn)) void give_up(const char *why)
{
    static const char head[] = "execgate: the held shell cannot take its call: ";
    (void)eg_sys_write(2, head, sizeof head - 1);
    (void)eg_sys_write(2, why, eg_strlen(why));
    (void)eg_sys_write(2, "\n", 1);
    eg_sys_exit(126);
}

/* Is fd a Unix socket whose other end our parent made? */
static int from_parent(int fd)
{
    struct stat st;
    if (eg_sys_fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
        return 0;
    struct ucred cred;
    unsigned len = sizeof cred;
    if (EG_SC(SYS_getsockopt, fd, SOL_SOCKET, SO_PEERCRED, (long)&cred, (long)&len, 0) < 0 ||
        len != sizeof cred)
        return 0;
    return cred.pid > 0 && cred.pid == eg_sys_getppid();
}

/* n strings from f into [*at, end), one after the other, each pointed to from out[]. */
static int put_strings(struct eg_fields *f, long long n, char **at, char *end, char **out)
{
    for (long long i = 0; i < n; i++) {
        size_t len;
        const char *s = eg_next(f, &len);
        if (!s || len + 1 > (size_t)(end - *at))
            return -1;
        memcpy(*at, s, len + 1);
        out[i] = *at;
        *at += len + 1;
    }
    return 0;
}

/* The end of v[0..n): its strings one after the other, as the kernel lays them out, or NULL
 * when they are not (then nothing is written over them). */
static char *run_end(char *const *v, size_t n)
{
    char *at = v[0];
    for (size_t i = 0; i < n; i++) {
        if (v[i] != at)
            return NULL;
        at += eg_strlen(v[i]) + 1;
    }
    return at;
}

/* Put src[i] at dst[i] (the received descriptors are close-on-exec, numbered above nothing
 * in particular: each goes up out of the way first, as the launcher places a spawn's). */
static void place(const int *src, const long long *dst, int n)
{
    int top = EG_HOLD_FD;
    for (int i = 0; i < n; i++)
        if (dst[i] > top)
            top = (int)dst[i];
    int moved[EG_MAX_FDS];
    for (int i = 0; i < n; i++) {
        moved[i] = eg_sys_fcntl(src[i], F_DUPFD_CLOEXEC, top + 1);
        if (moved[i] < 0)
            give_up("placing descriptors");
        eg_sys_close(src[i]);
    }
    for (int i = 0; i < n; i++) {
        if (EG_SC(SYS_dup2, moved[i], dst[i], 0, 0, 0, 0) < 0) /* dup2: inheritable */
            give_up("placing descriptors");
        eg_sys_close(moved[i]);
    }
}

void eg_hold(int argc, char **argv, char ***envp)
{
    const char *hold = eg_getenv(*envp, "EXECGATE_HOLD");
    if (!hold || strcmp(hold, "3") != 0 || !from_parent(EG_HOLD_FD) || argc < 1)
        return; /* not held by whoever spawned us: run as exec'd */

    char *buf = eg_sys_map_anon(HOLD_MAX);
    if (!buf)
        give_up("no memory");
    /* The shell sets its locale from the environment as it starts (bash, zsh): load that
     * locale's files now, ahead of the call. The process's own locale stays "C" (a program
     * that never sets one must not get it); the object only keeps the files' data in libc's
     * list of loaded locales, where the shell's setlocale finds it instead of reading them.
     * A call with other locale variables loads its own, as without this. */
    (void)newlocale(LC_ALL_MASK, "", (locale_t)0);
    int fds[EG_MAX_FDS], nfds = 0;
    ssize_t len = eg_recv_frame(EG_HOLD_FD, buf, HOLD_MAX, fds, &nfds, EG_MAX_FDS, 1);
    eg_sys_close(EG_HOLD_FD);
    if (len < 0)
        give_up(len == -ENODATA ? "the session ended first" : "malformed release");

    /* EG1 · release · CWD · NFDS · DST… · ARGC · ARGV… · ENVC · ENV… */
    struct eg_fields f;
    eg_fields_init(&f, buf, (size_t)len);
    const char *tag = eg_next(&f, NULL), *kind = eg_next(&f, NULL);
    const char *cwd = eg_next(&f, NULL);
    long long n, dst[EG_MAX_FDS], nargs, nenv;
    if (!tag || strcmp(tag, EG_TAG) || !kind || strcmp(kind, "release") || !cwd ||
        eg_next_long(&f, &n) < 0 || n != nfds)
        give_up("malformed release");
    for (long long i = 0; i < n; i++)
        if (eg_next_long(&f, &dst[i]) < 0 || dst[i] < 0 || dst[i] > 65535)
            give_up("malformed release");
    place(fds, dst, nfds); /* first: whatever goes wrong next is said on the call's stderr */
    if (eg_next_long(&f, &nargs) < 0 || nargs != argc)
        give_up("a release with another number of arguments");

    /* The strings of argv and of the environment are each one run of memory (the kernel put
     * them there at the exec): the call's are written over them, and what is left zeroed. */
    char *arg_at = argv[0], *arg_end = run_end(argv, (size_t)argc);
    if (!arg_end || put_strings(&f, nargs, &arg_at, arg_end, argv) < 0)
        give_up("the arguments do not fit the placeholder's");
    char **old_env = *envp;
    size_t old_n = 0;
    while (old_env[old_n])
        old_n++;
    if (!old_n || eg_next_long(&f, &nenv) < 0 || nenv < 0 || nenv > 1 << 20)
        give_up("malformed release");
    char *env_at = old_env[0], *env_end = run_end(old_env, old_n);
    char **env = (char **)eg_sys_map_anon((size_t)(nenv + 1) * sizeof *env);
    if (!env_end || !env || put_strings(&f, nenv, &env_at, env_end, env) < 0 ||
        !eg_fields_done(&f))
        give_up("the environment does not fit the placeholder's");
    env[nenv] = NULL;

    if (EG_SC(SYS_chdir, (long)cwd, 0, 0, 0, 0, 0) < 0)
        give_up("cannot enter the working directory");
    memset(arg_at, 0, (size_t)(arg_end - arg_at));
    memset(env_at, 0, (size_t)(env_end - env_at));
    eg_sys_munmap(buf, HOLD_MAX);
    environ = env;
    *envp = env;
}
