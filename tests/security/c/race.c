/* Check-then-exec races against the gate (issue 8, item 5), run inside a gated session.
 *
 *   race exchange-exec DIR SECONDS   DIR/s (a script) and DIR/t (a symlink to the forbidden
 *                                    program) are swapped with renameat2(RENAME_EXCHANGE) by
 *                                    a thread while the main thread execs DIR/s over and over
 *   race rewrite-exec DIR SECONDS    DIR/s's #! line is rewritten in place (same inode)
 *                                    between /bin/sh and DIR/t's target (DIR/alt holds the
 *                                    forbidden line) while DIR/s is exec'd over and over
 *   race exchange-spawn DIR SECONDS  as exchange-exec, with posix_spawn and a closefrom file
 *                                    action (the descriptor a spawn would exec is closed)
 *   race dup2-spawn DIR SECONDS      as exchange-spawn, the file actions making every number
 *                                    the gate's descriptor could have a copy of the forbidden
 *                                    program (opened before the race)
 *
 * Prints "attempts=N" and exits 0. The forbidden program proves itself by creating a file. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static atomic_int stop;
static int dirfd_;
static char lines[2][128];
static size_t linelen;

static void *exchanger(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        renameat2(dirfd_, "s", dirfd_, "t", RENAME_EXCHANGE);
    return NULL;
}

static void *rewriter(void *arg)
{
    (void)arg;
    /* open and close each time: a file open for writing cannot be exec'd (ETXTBSY) */
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        int fd = openat(dirfd_, "s", O_WRONLY);
        pwrite(fd, lines[i & 1], linelen, 0);
        close(fd);
        usleep(50);
    }
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    const char *mode = argv[1];
    if (chdir(argv[2]) < 0)
        return 2;
    dirfd_ = open(".", O_RDONLY | O_DIRECTORY);
    double end = now() + atof(argv[3]);
    pthread_t racer;
    int forbidden = openat(dirfd_, "t", O_RDONLY); /* DIR/t is the forbidden program still */
    if (!strcmp(mode, "rewrite-exec")) {
        FILE *f = fopen("alt", "r");
        if (!f || !fgets(lines[1], sizeof lines[1], f))
            return 2;
        fclose(f);
        linelen = strlen(lines[1]);
        memset(lines[0], ' ', linelen);
        memcpy(lines[0], "#!/bin/sh", 9);
        lines[0][linelen - 1] = '\n';
        pthread_create(&racer, NULL, rewriter, NULL);
    } else {
        pthread_create(&racer, NULL, exchanger, NULL);
    }
    int dup2_spawn = !strcmp(mode, "dup2-spawn");
    int spawn = dup2_spawn || !strcmp(mode, "exchange-spawn");
    if (dup2_spawn && forbidden < 0)
        return 2;
    long attempts = 0;
    char *args[] = {"s", NULL};
    while (now() < end && attempts < 5000) {
        attempts++;
        pid_t pid;
        if (spawn) {
            posix_spawn_file_actions_t fa;
            posix_spawn_file_actions_init(&fa);
            if (dup2_spawn) {
                for (int fd = 3; fd < 40; fd++)
                    if (fd != forbidden)
                        posix_spawn_file_actions_adddup2(&fa, forbidden, fd);
            } else {
                posix_spawn_file_actions_addclosefrom_np(&fa, 3);
            }
            int r = posix_spawn(&pid, "./s", &fa, NULL, args, environ);
            posix_spawn_file_actions_destroy(&fa);
            if (r)
                continue;
        } else {
            pid = fork();
            if (pid == 0) {
                int null = open("/dev/null", O_WRONLY);
                dup2(null, 2);
                execv("./s", args);
                _exit(127);
            }
        }
        int st;
        waitpid(pid, &st, 0);
    }
    atomic_store(&stop, 1);
    pthread_join(racer, NULL);
    printf("attempts=%ld\n", attempts);
    return 0;
}
