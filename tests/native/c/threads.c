#define _GNU_SOURCE
/* Exec from many threads at once (posix_spawn and vfork+execv), while other threads keep
 * running: every child must run /bin/echo with exactly its own argv. Prints one line per
 * child; exits 0 when all succeeded. */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
#define THREADS 8
#define EACH 10
static const char *prog;
static int failures;

static void *worker(void *arg)
{
    long t = (long)arg;
    for (int i = 0; i < EACH; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "t%ld-%d", t, i);
        char *argv[] = {(char *)"echo", tag, NULL};
        pid_t pid;
        if (t % 2) {
            if (posix_spawn(&pid, prog, NULL, NULL, argv, environ) != 0) {
                __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
                continue;
            }
        } else {
            pid = vfork();
            if (pid == 0) {
                execv(prog, argv);
                _exit(127);
            }
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    prog = argc > 1 ? argv[1] : "/bin/echo";
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_t th[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    fprintf(stderr, "failures=%d\n", failures);
    return failures ? 1 : 0;
}
