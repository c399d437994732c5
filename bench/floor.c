/* The least execgate's design can cost: bench/floor.py's models of a gated exec with nothing
 * decided and of an escalation with nothing checked, to measure execgate against them.
 *
 * Built twice from this file:
 *   -DFLOOR_PRELOAD -shared  a preloaded execve. Without EXECGATE_FLOOR_SOCK it only passes
 *                            each exec on (raw syscall): what loading any interposer into
 *                            every program costs. With it, it sends the program, its arguments
 *                            and descriptors 0-2 to the launcher there and exits with the
 *                            status the launcher answers, as execgate's interposer claims a
 *                            standing authorization (docs/protocol.md §4)
 *   (no define)              the launcher: accepts a claim, vforks and execs the program on
 *                            the claimer's descriptors, waits for it and answers its status
 *
 * What the escalation leaves out is what execgate's launcher checks per claim (the stand-in,
 * the judged file, the claimer's working directory and repository, the report to the server)
 * and what the interposer derives before it asks (the program's identity, every inherited
 * descriptor). What it keeps is the structure: the fork child waits as the claimer, the
 * program is the launcher's child, and the program loads the preload library too (descendants
 * stay gated). Not for use outside this benchmark: it runs whatever it is sent.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define SOCK_VAR "EXECGATE_FLOOR_SOCK"
#define MAX_MSG 65536

static int socket_address(const char *path, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a->sun_path)
        return -1;
    strcpy(a->sun_path, path);
    return 0;
}

#ifdef FLOOR_PRELOAD

/* The claim: PATH \0 ARGV0 \0 ARGV1 \0 … with descriptors 0-2 attached; the answer is the wait
 * status. Without a launcher (the escalated program's own execs), the real execve. */
int execve(const char *path, char *const argv[], char *const envp[])
{
    const char *sock = getenv(SOCK_VAR);
    struct sockaddr_un a;
    if (!sock || socket_address(sock, &a) < 0)
        return (int)syscall(SYS_execve, path, argv, envp);
    static char msg[MAX_MSG];
    size_t n = 0;
    for (int i = -1; i < 0 || argv[i]; i++) {
        const char *s = i < 0 ? path : argv[i];
        size_t len = strlen(s) + 1;
        if (n + len > sizeof msg)
            return errno = E2BIG, -1;
        memcpy(msg + n, s, len);
        n += len;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        _exit(126);
    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)];
    struct iovec iov = {msg, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                       .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    int status;
    if (sendmsg(fd, &m, 0) != (ssize_t)n || read(fd, &status, sizeof status) != sizeof status)
        _exit(126);
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        raise(WTERMSIG(status));
    }
    _exit(WEXITSTATUS(status));
}

#else

extern char **environ;

int main(int argc, char **argv)
{
    struct sockaddr_un a;
    if (argc != 2 || socket_address(argv[1], &a) < 0)
        return 2;
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(argv[1]);
    if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) < 0 ||
        listen(listener, 64) < 0)
        return 1;
    unsetenv(SOCK_VAR); /* the programs' own execs are not claims */
    static char msg[MAX_MSG + 1];
    for (;;) {
        int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            continue;
        int fds[3] = {-1, -1, -1};
        char control[CMSG_SPACE(sizeof fds)];
        struct iovec iov = {msg, MAX_MSG};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                           .msg_controllen = sizeof control};
        ssize_t n = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        if (n <= 0 || !c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof fds)) {
            close(conn);
            continue;
        }
        memcpy(fds, CMSG_DATA(c), sizeof fds);
        msg[n] = '\0';
        char *args[256];
        int k = 0;
        for (char *p = msg + strlen(msg) + 1; p < msg + n && k < 255; p += strlen(p) + 1)
            args[k++] = p;
        args[k] = NULL;
        pid_t pid = vfork();
        if (pid == 0) {
            for (int i = 0; i < 3; i++)
                dup2(fds[i], i); /* dup2 clears close-on-exec on the copy */
            execve(msg, args, environ);
            _exit(127);
        }
        for (int i = 0; i < 3; i++)
            close(fds[i]);
        int status = 127 << 8;
        while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        (void)!write(conn, &status, sizeof status);
        close(conn);
    }
}

#endif
