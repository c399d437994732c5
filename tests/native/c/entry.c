#define _GNU_SOURCE
/* Run a program through one exec entry point:  entry VIA PROGRAM [ARGS...]
 * exec*: the program replaces us; on failure prints "errno=N" and exits 99.
 * posix_spawn*, system, popen-r/-w: waits and exits with the child's code (or 128+signal);
 * a failure prints "errno=N" / "ret=N" and exits 99.
 * For execveat the program is opened relative to its directory; fexecve opens it O_RDONLY
 * (fexecve-path: O_PATH). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int fail(int e) { printf("errno=%d\n", e); fflush(stdout); return 99; }

static int status_code(int st)
{
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 98;
}

int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "usage\n"); return 2; }
    const char *via = argv[1], *prog = argv[2];
    char **args = argv + 2;
    int n = argc - 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(via, "execve")) { execve(prog, args, environ); return fail(errno); }
    if (!strcmp(via, "execv")) { execv(prog, args); return fail(errno); }
    if (!strcmp(via, "execvp")) { execvp(prog, args); return fail(errno); }
    if (!strcmp(via, "execvpe")) { execvpe(prog, args, environ); return fail(errno); }
    if (!strcmp(via, "execl")) {
        if (n == 1) execl(prog, args[0], (char *)NULL);
        else if (n == 2) execl(prog, args[0], args[1], (char *)NULL);
        else execl(prog, args[0], args[1], args[2], (char *)NULL);
        return fail(errno);
    }
    if (!strcmp(via, "execlp")) {
        if (n == 1) execlp(prog, args[0], (char *)NULL);
        else if (n == 2) execlp(prog, args[0], args[1], (char *)NULL);
        else execlp(prog, args[0], args[1], args[2], (char *)NULL);
        return fail(errno);
    }
    if (!strcmp(via, "execle")) {
        if (n == 1) execle(prog, args[0], (char *)NULL, environ);
        else if (n == 2) execle(prog, args[0], args[1], (char *)NULL, environ);
        else execle(prog, args[0], args[1], args[2], (char *)NULL, environ);
        return fail(errno);
    }
    if (!strcmp(via, "execveat")) {
        char *d = strdup(prog), *b = strdup(prog);
        int dir = open(dirname(d), O_PATH | O_DIRECTORY);
        execveat(dir, basename(b), args, environ, 0);
        return fail(errno);
    }
    if (!strcmp(via, "fexecve") || !strcmp(via, "fexecve-path")) {
        int fd = open(prog, !strcmp(via, "fexecve") ? O_RDONLY : O_PATH); /* not O_CLOEXEC: scripts read /dev/fd/N */
        if (fd < 0) return fail(errno);
        fexecve(fd, args, environ);
        return fail(errno);
    }
    if (!strcmp(via, "posix_spawn") || !strcmp(via, "posix_spawnp")) {
        pid_t pid;
        int r = !strcmp(via, "posix_spawn") ? posix_spawn(&pid, prog, NULL, NULL, args, environ)
                                            : posix_spawnp(&pid, prog, NULL, NULL, args, environ);
        if (r) { printf("ret=%d errno-unchanged=%d\n", r, errno == 0); return 99; }
        int st;
        waitpid(pid, &st, 0);
        return status_code(st);
    }
    if (!strcmp(via, "posix_spawn-closefrom")) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addclosefrom_np(&fa, 3);
        pid_t pid;
        int r = posix_spawn(&pid, prog, &fa, NULL, args, environ);
        if (r) { printf("ret=%d\n", r); return 99; }
        int st;
        waitpid(pid, &st, 0);
        return status_code(st);
    }
    if (!strcmp(via, "system")) {
        int st = system(prog);
        if (st == -1) return fail(errno);
        printf("status=%d\n", st);
        return status_code(st);
    }
    if (!strcmp(via, "popen-r")) {
        FILE *f = popen(prog, "r");
        if (!f) return fail(errno);
        char buf[4096];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, k, stdout);
        int st = pclose(f);
        printf("status=%d\n", st);
        return status_code(st);
    }
    if (!strcmp(via, "popen-w")) {
        FILE *f = popen(prog, "w");
        if (!f) return fail(errno);
        fputs("data through popen\n", f);
        int st = pclose(f);
        printf("status=%d\n", st);
        return status_code(st);
    }
    if (!strcmp(via, "popen-chain")) {
        /* a second popen's child must not inherit the first stream's descriptor */
        FILE *a = popen("cat >/dev/null", "w");
        if (!a) return fail(errno);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "if [ -e /proc/self/fd/%d ]; then echo leaked; else echo closed; fi",
                 fileno(a));
        FILE *b = popen(cmd, "r");
        if (!b) return fail(errno);
        char line[64] = "";
        if (!fgets(line, sizeof line, b)) strcpy(line, "nothing\n");
        printf("%s", line);
        printf("b=%d a=%d\n", pclose(b), pclose(a));
        FILE *f = fopen("/dev/null", "r");
        printf("foreign=%d\n", pclose(f) == -1 ? -1 : 0); /* not ours: the real pclose */
        return 0;
    }
    if (!strcmp(via, "system-sigint")) {
        /* system() ignores SIGINT/SIGQUIT in the caller while the command runs */
        int st = system("kill -INT $PPID; kill -QUIT $PPID; exit 3");
        printf("survived status=%d\n", st);
        return 0;
    }
    if (!strcmp(via, "popen-e")) {
        FILE *f = popen("exit 0", "re");
        if (!f) return fail(errno);
        int fl = fcntl(fileno(f), F_GETFD);
        printf("cloexec=%d\n", (fl & FD_CLOEXEC) != 0);
        FILE *g = popen("exit 0", "r");
        fl = fcntl(fileno(g), F_GETFD);
        printf("plain-cloexec=%d\n", (fl & FD_CLOEXEC) != 0);
        FILE *h = popen("exit 0", "x");
        printf("bad-mode=%d errno=%d\n", h == NULL, errno);
        pclose(f);
        pclose(g);
        return 0;
    }
    fprintf(stderr, "unknown via %s\n", via);
    return 2;
}
