/* Routes around the interposer to a program a rule names (tests/security/test_kernel_backstop.py).
 *
 *   backstop ROUTE PROGRAM [ARGS]...
 *
 * Every route first removes LD_PRELOAD from its environment (so nothing it starts is
 * interposed either) and then tries to run PROGRAM with argv [PROGRAM, ARGS...]:
 *   syscall   the execve syscall itself
 *   execveat  execveat(open(PROGRAM, O_PATH), "", AT_EMPTY_PATH)
 *   dlsym     dlsym(dlopen("libc.so.6"), "execv"): libc's own symbol, not the global scope
 *   ldso      the dynamic loader: execve(ld.so, [ld.so, PROGRAM, ARGS...])
 *   ldcopy    a copy of the dynamic loader made here (./ld-copy), as the loader
 *   wordexp   glibc's wordexp("$(PROGRAM ARGS)"), which runs /bin/sh itself
 *   system    glibc's __libc_system("PROGRAM ARGS")
 *   memfd     PROGRAM's bytes (as read here) into a memfd, executed with execveat(fd, "")
 *   procfd    the same memfd executed as /proc/self/fd/N
 *   copy      PROGRAM's bytes into ./copy (made executable), executed
 *   ptrace    a traced child execs /bin/true; at the syscall the tracer points it at PROGRAM
 * It prints "route ROUTE: <what happened>" and exits 0 if the route itself worked up to the
 * exec (whatever the exec did), else 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wordexp.h>

extern char **environ;

static const char *route;

static int report(const char *what, int err)
{
    printf("route %s: %s%s%s\n", route, what, err ? ": " : "", err ? strerror(err) : "");
    fflush(stdout);
    return 1;
}

static int copy_into(int out, const char *path)
{
    int in = open(path, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    char buf[65536];
    ssize_t k;
    while ((k = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)k) != k)
            return -EIO;
    close(in);
    return 0;
}

static char *joined(char **argv)
{
    static char cmd[8192];
    size_t n = 0;
    for (int i = 0; argv[i]; i++)
        n += (size_t)snprintf(cmd + n, sizeof cmd - n, "%s%s", i ? " " : "", argv[i]);
    return cmd;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: backstop ROUTE PROGRAM [ARGS]...\n");
        return 2;
    }
    route = argv[1];
    const char *program = argv[2];
    char **args = argv + 2;
    unsetenv("LD_PRELOAD");
    setvbuf(stdout, NULL, _IONBF, 0);

    if (!strcmp(route, "syscall")) {
        syscall(SYS_execve, program, args, environ);
        return report("execve failed", errno);
    }
    if (!strcmp(route, "execveat")) {
        int fd = open(program, O_PATH);
        if (fd < 0)
            return report("open failed", errno);
        syscall(SYS_execveat, fd, "", args, environ, AT_EMPTY_PATH);
        return report("execveat failed", errno);
    }
    if (!strcmp(route, "dlsym")) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_LOCAL);
        int (*real_execv)(const char *, char *const *) = libc ? dlsym(libc, "execv") : NULL;
        if (!real_execv)
            return report("no execv in libc.so.6", 0);
        real_execv(program, args);
        return report("execv failed", errno);
    }
    if (!strcmp(route, "ldso") || !strcmp(route, "ldcopy")) {
        const char *loader = "/lib64/ld-linux-x86-64.so.2";
        if (access(loader, X_OK) < 0)
            loader = "/lib/ld-linux-aarch64.so.1";
        if (!strcmp(route, "ldcopy")) {
            int out = open("ld-copy", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
            if (out < 0 || copy_into(out, loader) < 0)
                return report("cannot copy the loader", errno);
            close(out);
            loader = "./ld-copy";
        }
        char *v[64] = {(char *)loader};
        for (int i = 0; args[i] && i < 62; i++)
            v[i + 1] = args[i];
        syscall(SYS_execve, loader, v, environ);
        return report("execve of the loader failed", errno);
    }
    if (!strcmp(route, "wordexp")) {
        char words[8300];
        snprintf(words, sizeof words, "$(%s)", joined(args));
        wordexp_t we;
        int r = wordexp(words, &we, WRDE_SHOWERR);
        if (r != 0)
            return report("wordexp failed", 0);
        for (size_t i = 0; i < we.we_wordc; i++)
            printf("%s%s", i ? " " : "", we.we_wordv[i]);
        printf("\n");
        return report("wordexp ran the command substitution", 0) - 1;
    }
    if (!strcmp(route, "system")) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_LOCAL);
        int (*libc_system)(const char *) = libc ? dlsym(libc, "__libc_system") : NULL;
        if (!libc_system)
            return report("no __libc_system in libc.so.6", 0);
        int st = libc_system(joined(args));
        printf("route system: status %d\n", st);
        return 0;
    }
    if (!strcmp(route, "memfd") || !strcmp(route, "procfd")) {
        int fd = (int)syscall(SYS_memfd_create, "copy", 0);
        if (fd < 0)
            return report("memfd_create failed", errno);
        if (copy_into(fd, program) < 0)
            return report("cannot copy the program", errno);
        if (!strcmp(route, "memfd")) {
            syscall(SYS_execveat, fd, "", args, environ, AT_EMPTY_PATH);
        } else {
            char path[64];
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            syscall(SYS_execve, path, args, environ);
        }
        return report("exec of the memfd failed", errno);
    }
    if (!strcmp(route, "copy")) {
        int out = open("copy", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
        if (out < 0 || copy_into(out, program) < 0)
            return report("cannot copy the program", errno);
        close(out);
        syscall(SYS_execve, "./copy", args, environ);
        return report("execve of the copy failed", errno);
    }
#if defined(__x86_64__)
    if (!strcmp(route, "ptrace")) {
        pid_t child = fork();
        if (child == 0) {
            if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) < 0) {
                report("PTRACE_TRACEME failed", errno);
                _exit(1);
            }
            raise(SIGSTOP);
            char *t[] = {"/bin/true", NULL};
            syscall(SYS_execve, "/bin/true", t, environ);
            _exit(127);
        }
        int st;
        waitpid(child, &st, 0);
        if (!WIFSTOPPED(st)) {
            waitpid(child, &st, 0);
            return 1;
        }
        /* Run to the execve syscall's entry, then point its path and argv at PROGRAM (the
         * child's memory is a copy of ours: the same addresses hold the same strings). */
        for (;;) {
            if (ptrace(PTRACE_SYSCALL, child, NULL, NULL) < 0)
                return report("PTRACE_SYSCALL failed", errno);
            waitpid(child, &st, 0);
            if (!WIFSTOPPED(st))
                return report("the child ended", 0);
            struct user_regs_struct regs;
            ptrace(PTRACE_GETREGS, child, NULL, &regs);
            if (regs.orig_rax == SYS_execve) {
                regs.rdi = (unsigned long)program;
                regs.rsi = (unsigned long)args;
                ptrace(PTRACE_SETREGS, child, NULL, &regs);
                ptrace(PTRACE_DETACH, child, NULL, NULL);
                waitpid(child, &st, 0);
                printf("route ptrace: rewritten exec ended with %d\n", st);
                return 0;
            }
        }
    }
#endif
    fprintf(stderr, "backstop: unknown route %s\n", route);
    return 2;
}
