#define _GNU_SOURCE
/* Exec a program from the kinds of process that claim an escalation differently:
 *   claimers fork PROG [ARGS...]         fork(), exec in the child: claimed in-process
 *   claimers vfork PROG [ARGS...]        vfork(), exec in the child: through the wrapper
 *   claimers thread PROG [ARGS...]       another thread runs, the main thread execs: wrapper
 *   claimers from-thread PROG [ARGS...]  a second thread execs, the main one waits: wrapper
 *   claimers handler PROG [ARGS...]      a caught SIGRTMIN handler, then exec: as after an exec,
 *                                        the handler must never run (prints "handler ran")
 * fork/vfork wait for the child and exit with its code (128+signal for a signal death); the
 * others become the program. A failed exec prints "errno=N" and exits 99.
 *   claimers no-unshare HOW PROG [ARGS...]  the same under a seccomp filter that refuses
 *                                        unshare() (EPERM), as some containers do */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char **args;

static int status_code(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 98;
}

static void *idle(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static void *exec_it(void *arg)
{
    (void)arg;
    execvp(args[0], args);
    printf("errno=%d\n", errno);
    _exit(99);
}

static void on_rtmin(int sig)
{
    (void)sig;
    static const char msg[] = "handler ran\n";
    (void)!write(1, msg, sizeof msg - 1);
}

static void refuse_unshare(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_unshare, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
        perror("seccomp");
        _exit(2);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "no-unshare")) {
        refuse_unshare();
        argv++;
        argc--;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: claimers fork|vfork|thread|from-thread|handler PROG [ARGS...]\n");
        return 2;
    }
    const char *how = argv[1];
    args = argv + 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(how, "fork") || !strcmp(how, "vfork")) {
        pid_t pid = !strcmp(how, "fork") ? fork() : vfork();
        if (pid == 0) {
            execvp(args[0], args);
            _exit(99);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
            if (errno != EINTR)
                return 97;
        return status_code(st);
    }
    pthread_t th;
    if (!strcmp(how, "thread")) {
        pthread_create(&th, NULL, idle, NULL);
    } else if (!strcmp(how, "from-thread")) {
        pthread_create(&th, NULL, exec_it, NULL);
        pthread_join(th, NULL);
        return 98;
    } else if (!strcmp(how, "handler")) {
        signal(SIGRTMIN, on_rtmin);
    } else {
        fprintf(stderr, "unknown: %s\n", how);
        return 2;
    }
    execvp(args[0], args);
    printf("errno=%d\n", errno);
    return 99;
}
