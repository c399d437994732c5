/* execgate-wrapper (docs/protocol.md §4, §5).
 *
 *   execgate-wrapper FILE [ARGV]...   patched-shell convention: gate FILE, then exec it
 *                                     (raw syscall: a preloaded interposer does not ask again),
 *                                     deny (126) or claim the escalation in-process
 *   execgate-wrapper --shadow FILE [ARGS]...
 *                                     stand-in mode: FILE is a stand-in (`#!WRAPPER --shadow`)
 *                                     the sandbox mounted over a program a rule names, so the
 *                                     kernel started us for an exec of it that nothing else
 *                                     asked about (raw syscall, static binary, ...): ask with
 *                                     argv [FILE, ARGS...]; the server judges the program the
 *                                     stand-in's identity stands for and never answers `run`
 *   argv = ["execgate-claim", TICKET] claim mode: started by the interposer for an escalation
 *                                     it cannot claim in-process (vfork children, posix_spawn,
 *                                     multi-threaded callers); sends its descriptors and
 *                                     environment to the launcher's claim socket, waits for the
 *                                     escalated program and ends the same way it did
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "gate.h"

/* ---------------------------------------------------------------- patched-shell mode */

struct run_ctx {
    char *const *argv;
    int standin; /* --shadow: only a claim may follow (the stand-in itself is no program) */
};

static const char not_a_standin[] =
    "execgate: denied: this is a copy of the stand-in for a program a rule names, not the "
    "program\n";

static int wrapper_run(void *vctx, const struct eg_plan *plan)
{
    struct run_ctx *x = vctx;
    if (plan->how == EG_HOW_CLAIM)
        eg_claim(plan->ticket, plan->envp, x->argv, 0);
    if (x->standin) { /* `run` of a stand-in: a copy of one (memfd, workspace); never loop */
        eg_write_all(2, not_a_standin, sizeof not_a_standin - 1);
        _exit(126);
    }
    return eg_exec_plan(plan);
}

/* libexecgate.so beside this executable (both live in execgate/_bin). */
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
    eg_write_all(2, buf, n);
}

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
        eg_claim(argv[1], envp, NULL, 0);

    if (argc < 2) {
        static const char usage[] = "usage: execgate-wrapper FILE [ARGV]...\n";
        eg_write_all(2, usage, sizeof usage - 1);
        return 2;
    }
    if (argc >= 3 && !strcmp(argv[1], "--shadow")) {
        /* The kernel ran a stand-in's `#!` line: argv = [WRAPPER, --shadow, FILE, ARGS...]
         * (the caller's argv[0] is lost; FILE, as the caller named it, takes its place). */
        struct run_ctx x = {.argv = argv + 2, .standin = 1};
        struct eg_call c = {.via = "shadow", .dirfd = AT_FDCWD, .path = argv[2], .fd = -1,
                            .argv = argv + 2, .envp = envp};
        int r = eg_gate(&c, wrapper_run, &x);
        if (c.denied)
            return 126;
        say("execgate: denied: ", argv[2], r == ENOENT ? ": No such file or directory"
                                                       : ": cannot be asked about");
        return r == ENOENT ? 127 : 126;
    }
    struct run_ctx x = {.argv = argv + 2};
    /* Started by the interposer for posix_spawn/system/popen (argv[0] execgate-via-VIA): say
     * so in the request (informational, like every name a client sends). */
    const char *via = "wrapper";
    static const char *const spawned[] = {"posix_spawn", "posix_spawnp", "system", "popen"};
    for (size_t i = 0; argv[0] && i < sizeof spawned / sizeof *spawned; i++)
        if (!strncmp(argv[0], "execgate-via-", 13) && !strcmp(argv[0] + 13, spawned[i]))
            via = spawned[i];
    struct eg_call c = {.via = via, .dirfd = AT_FDCWD, .path = argv[1], .fd = -1,
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
