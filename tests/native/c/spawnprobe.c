/* posix_spawn, case by case, and what the child it starts finds (tests/native/test_native_spawn.py).
 *
 *   spawnprobe CASE REPORT   set up this process for CASE, posix_spawn `spawnprobe report REPORT`
 *                            with CASE's file actions and attributes, wait; print the spawn's
 *                            return value and the child's status
 *   spawnprobe report FILE   (the child) write what it finds to FILE: its program, cwd, open
 *                            descriptors, process group and session, signal mask and
 *                            dispositions, ids
 *
 * Run plainly and under the gate, the two outputs and reports must be the same. The "hostile"
 * cases aim file actions at the descriptor numbers the gate would execute from (EVIL: a script
 * that writes PWNED to the report instead). SPAWNPROBE_BY_FD=1 spawns the program the way a
 * naive gate would, by its descriptor's /proc/self/fd name: the hostile cases then run EVIL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void on_signal(int sig) { (void)sig; }

static void status_line(FILE *out, const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)))
            fputs(line, out);
    if (f)
        fclose(f);
}

static int report(const char *file)
{
    FILE *out = fopen(file, "w");
    if (!out)
        return 1;
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    fprintf(out, "exe %s\n", strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf);
    fprintf(out, "cwd %s\n", getcwd(buf, sizeof buf) ? buf : "?");
    int self = fileno(out);
    for (int fd = 0; fd < 64; fd++) {
        int fl = fcntl(fd, F_GETFD);
        if (fl < 0 || fd == self)
            continue;
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        n = readlink(link, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = '\0';
        if (!strncmp(buf, "pipe:", 5) || !strncmp(buf, "socket:", 7))
            *strchr(buf, ':') = '\0'; /* inode numbers differ from run to run */
        fprintf(out, "fd %d %s%s\n", fd, buf, (fl & FD_CLOEXEC) ? " cloexec" : "");
    }
    fprintf(out, "pgrp %s\n", getpgrp() == getpid() ? "own" : "inherited");
    fprintf(out, "sid %s\n", getsid(0) == getpid() ? "own" : "inherited");
    fprintf(out, "ids %d %d %d %d\n", (int)getuid(), (int)geteuid(), (int)getgid(),
            (int)getegid());
    status_line(out, "SigBlk");
    status_line(out, "SigIgn");
    status_line(out, "SigCgt");
    fclose(out);
    return 0;
}

static int open_at(const char *path, int flags, int at)
{
    int fd = open(path, flags);
    if (fd >= 0 && at >= 0 && fd != at) {
        dup2(fd, at);
        close(fd);
        fd = at;
    }
    return fd;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "report"))
        return report(argv[2]);

    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    const char *evil = getenv("EVIL");
    char *child[] = {(char *)"spawnprobe", (char *)"report", argv[2], NULL};
    const char *prog = self;
    int use_path = 0;

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    const posix_spawn_file_actions_t *fap = &fa;
    const posix_spawnattr_t *attrp = &attr;
    sigset_t set;
    sigemptyset(&set);

    if (!strcmp(mode, "plain")) {
        fap = NULL;
        attrp = NULL;
    } else if (!strcmp(mode, "dup2")) {
        int fd = open_at("/dev/null", O_WRONLY, 7);
        posix_spawn_file_actions_adddup2(&fa, fd, 1);
        posix_spawn_file_actions_adddup2(&fa, fd, 12);
    } else if (!strcmp(mode, "dup2-same")) { /* clears close-on-exec */
        int fd = open_at("/dev/null", O_RDONLY | O_CLOEXEC, 8);
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        posix_spawn_file_actions_adddup2(&fa, fd, fd);
    } else if (!strcmp(mode, "open")) {
        posix_spawn_file_actions_addopen(&fa, 5, "/etc/passwd", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 3, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    } else if (!strcmp(mode, "close")) {
        open_at("/dev/null", O_RDONLY, 3);
        open_at("/dev/null", O_RDONLY, 4);
        posix_spawn_file_actions_addclose(&fa, 3);
        posix_spawn_file_actions_addclose(&fa, 40); /* not open: not an error */
    } else if (!strcmp(mode, "chdir")) {
        posix_spawn_file_actions_addchdir_np(&fa, "/usr");
    } else if (!strcmp(mode, "fchdir")) {
        int fd = open_at("/etc", O_RDONLY | O_DIRECTORY, 6);
        posix_spawn_file_actions_addfchdir_np(&fa, fd);
    } else if (!strcmp(mode, "closefrom")) {
        for (int fd = 3; fd <= 6; fd++)
            open_at("/dev/null", O_RDONLY, fd);
        posix_spawn_file_actions_addclosefrom_np(&fa, 4);
    } else if (!strcmp(mode, "signals")) {
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGUSR1, &sa, NULL);
        signal(SIGTERM, SIG_IGN);
        signal(SIGUSR2, SIG_IGN);
        sigaddset(&set, SIGUSR2);
        posix_spawnattr_setsigdefault(&attr, &set);
        sigemptyset(&set);
        sigaddset(&set, SIGHUP);
        sigaddset(&set, SIGWINCH);
        posix_spawnattr_setsigmask(&attr, &set);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    } else if (!strcmp(mode, "sigmask-full")) { /* glibc's internal signals included */
        memset(&set, 0xff, sizeof set);
        posix_spawnattr_setsigmask(&attr, &set);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    } else if (!strcmp(mode, "parent-mask")) {
        sigaddset(&set, SIGQUIT);
        sigaddset(&set, SIGALRM);
        sigprocmask(SIG_BLOCK, &set, NULL);
    } else if (!strcmp(mode, "pgroup")) {
        posix_spawnattr_setpgroup(&attr, 0);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    } else if (!strcmp(mode, "setsid")) {
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    } else if (!strcmp(mode, "resetids")) {
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_RESETIDS);
    } else if (!strcmp(mode, "tcsetpgrp")) { /* stdin is no terminal: ENOTTY */
        posix_spawn_file_actions_addtcsetpgrp_np(&fa, 0);
    } else if (!strcmp(mode, "table-full")) { /* two numbers free, both named by actions */
        struct rlimit rl = {20, 20};
        setrlimit(RLIMIT_NOFILE, &rl);
        while (open("/dev/null", O_RDONLY) >= 0)
            ;
        close(18);
        close(19);
        posix_spawn_file_actions_adddup2(&fa, 2, 18);
        posix_spawn_file_actions_adddup2(&fa, 2, 19);
    } else if (!strcmp(mode, "open-missing")) {
        posix_spawn_file_actions_addopen(&fa, 5, "/nonexistent/x", O_RDONLY, 0);
    } else if (!strcmp(mode, "chdir-missing")) {
        posix_spawn_file_actions_addchdir_np(&fa, "/nonexistent");
    } else if (!strcmp(mode, "not-executable")) {
        prog = "/etc/passwd";
    } else if (!strcmp(mode, "path")) {
        prog = "spawnprobe";
        use_path = 1;
    } else if (!strcmp(mode, "hostile-dup2") || !strcmp(mode, "hostile-open") ||
               !strcmp(mode, "hostile-close")) {
        /* every number the gate's descriptor could have: made EVIL, or closed */
        int e = open_at(evil, O_RDONLY, 50);
        for (int fd = 3; fd < 40; fd++) {
            if (mode[8] == 'd')
                posix_spawn_file_actions_adddup2(&fa, e, fd);
            else if (mode[8] == 'o')
                posix_spawn_file_actions_addopen(&fa, fd, evil, O_RDONLY, 0);
            else
                posix_spawn_file_actions_addclose(&fa, fd);
        }
        if (mode[8] == 'c')
            posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    } else {
        return 2;
    }

    char by_fd[64];
    if (getenv("SPAWNPROBE_BY_FD")) { /* what a naive gate would do: spawn its descriptor by name */
        snprintf(by_fd, sizeof by_fd, "/proc/self/fd/%d", open(prog, O_RDONLY | O_CLOEXEC));
        prog = by_fd;
    }
    pid_t pid = 0;
    int r = use_path ? posix_spawnp(&pid, prog, fap, attrp, child, environ)
                     : posix_spawn(&pid, prog, fap, attrp, child, environ);
    int status = -1;
    if (r == 0)
        waitpid(pid, &status, 0);
    printf("posix_spawn %s status %d\n", r ? strerrorname_np(r) : "0",
           r == 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
