/* The escalated program of test_redteam_claimpath.py: it runs outside the sandbox (a rule
 * allows it by path, in a folder the sandbox cannot write) and reports what it was given.
 *
 *   tool fds               one line per open descriptor: "fd N cloexec=C TARGET"
 *   tool exit N            exit N
 *   tool sig N             die by signal N
 *   tool append FILE ID    append "ID PID" to FILE, then exit 0
 *   tool late FILE MS      sleep MS milliseconds, then create FILE (a survivor's witness)
 *   tool survive DIR MS    sleep MS milliseconds, then create DIR/survivor-PID
 *   tool who               for every other process of its process group: "who PID EXE THREADS"
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 2;
    int own = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        int fd = atoi(e->d_name);
        if (fd == own)
            continue;
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        target[n < 0 ? 0 : n] = '\0';
        int fl = fcntl(fd, F_GETFD);
        printf("fd %d cloexec=%d %s\n", fd, fl >= 0 && (fl & FD_CLOEXEC) ? 1 : 0, target);
    }
    closedir(d);
    return 0;
}

static int who(void)
{
    pid_t me = getpid(), group = getpgrp();
    DIR *d = opendir("/proc");
    if (!d)
        return 2;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == me || getpgid(pid) != group)
            continue;
        char path[64], exe[4096] = "?", line[256];
        snprintf(path, sizeof path, "/proc/%d/exe", pid);
        ssize_t n = readlink(path, exe, sizeof exe - 1);
        if (n >= 0)
            exe[n] = '\0';
        int threads = 0;
        snprintf(path, sizeof path, "/proc/%d/status", pid);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Threads:", 8))
                threads = atoi(line + 8);
        if (f)
            fclose(f);
        const char *base = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
        printf("who %d %s %d\n", pid, base, threads);
    }
    closedir(d);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "fds"))
        return fds();
    if (argc >= 2 && !strcmp(argv[1], "who"))
        return who();
    if (argc == 3 && !strcmp(argv[1], "exit"))
        return atoi(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "sig")) {
        signal(atoi(argv[2]), SIG_DFL);
        raise(atoi(argv[2]));
        return 99;
    }
    if (argc == 4 && !strcmp(argv[1], "append")) {
        FILE *f = fopen(argv[2], "a");
        if (!f)
            return 3;
        fprintf(f, "%s %d\n", argv[3], (int)getpid());
        fclose(f);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "survive")) {
        long ms = atol(argv[3]);
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&t, &t) < 0)
            ;
        char path[4096];
        snprintf(path, sizeof path, "%s/survivor-%d", argv[2], (int)getpid());
        int fd = open(path, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0)
            close(fd);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "late")) {
        long ms = atol(argv[3]);
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&t, &t) < 0)
            ;
        int fd = open(argv[2], O_WRONLY | O_CREAT, 0644);
        if (fd >= 0)
            close(fd);
        return 0;
    }
    fprintf(stderr, "tool: bad arguments\n");
    return 2;
}
