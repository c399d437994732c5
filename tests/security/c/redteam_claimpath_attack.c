/* The attacker of test_redteam_claimpath.py, run inside a real `execgate run` sandbox (through
 * the interposer: its execs are gated, it claims in-process where execgate lets it).
 *
 *   attack fds TOOL SPEC…     open descriptors as SPEC says (KIND@NUMBER: opath, opath-cloexec,
 *                             epoll, eventfd, pidfd, sock-shut (a socket shut down both ways),
 *                             listen (a listening socket), file, cloexec (a close-on-exec
 *                             file), closed), print "opened N KIND", then exec TOOL fds
 *   attack clonevm TOOL       a raw clone(CLONE_VM) child (no CLONE_VFORK, no CLONE_THREAD)
 *                             execs TOOL who while its parent runs on in the same memory
 *   attack vfork TOOL         a vfork child execs TOOL who
 *   attack thread TOOL        a second thread execs TOOL who while the first one spins
 *   attack seccomp TOOL OUT   a process with two threads whose unshare() a cooperating process
 *                             answers 0 (seccomp user notification), then execs TOOL who; the
 *                             other thread meanwhile tries to create OUT/thread-escaped
 *   attack resolve N WS       N times, a child execs WS/sw/prog while a thread keeps
 *                             exchanging WS/sw (a folder holding a harmless prog) with WS/swl
 *                             (a symlink to WS/late, holding the forbidden prog); prints the
 *                             outcomes "resolve ran=A denied=B other=C"
 *
 * "claimer PID" lines name the process that will claim.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *tool;

static void say_claimer(pid_t pid)
{
    char line[64];
    int n = snprintf(line, sizeof line, "claimer %d\n", (int)pid);
    (void)!write(1, line, (size_t)n);
}

static void place(int fd, int at)
{
    if (fd < 0) {
        perror("open");
        exit(3);
    }
    if (fd != at) {
        if (dup2(fd, at) < 0) {
            perror("dup2");
            exit(3);
        }
        close(fd);
    }
}

static int do_fds(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        char kind[32];
        int at;
        if (sscanf(argv[i], "%31[^@]@%d", kind, &at) != 2)
            return 2;
        int fd = -1, pair[2];
        if (!strcmp(kind, "opath"))
            fd = open("/", O_PATH);
        else if (!strcmp(kind, "opath-cloexec"))
            fd = open("/", O_PATH | O_CLOEXEC);
        else if (!strcmp(kind, "epoll")) {
            fd = epoll_create1(0);
        } else if (!strcmp(kind, "eventfd"))
            fd = eventfd(0, 0);
        else if (!strcmp(kind, "pidfd"))
            fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
        else if (!strcmp(kind, "sock-shut")) {
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0)
                return 3;
            shutdown(pair[0], SHUT_RDWR);
            close(pair[1]);
            fd = pair[0];
        } else if (!strcmp(kind, "listen")) {
            fd = socket(AF_UNIX, SOCK_STREAM, 0);
            listen(fd, 1);
        } else if (!strcmp(kind, "file"))
            fd = open("/dev/null", O_RDONLY);
        else if (!strcmp(kind, "cloexec"))
            fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        else if (!strcmp(kind, "closed")) {
            place(open("/dev/null", O_RDONLY), at);
            close(at);
            printf("closed %d\n", at);
            continue;
        } else
            return 2;
        place(fd, at);
        if (!strcmp(kind, "cloexec") || !strcmp(kind, "opath-cloexec"))
            fcntl(at, F_SETFD, FD_CLOEXEC); /* dup2 cleared it */
        printf("opened %d %s\n", at, kind);
    }
    fflush(stdout);
    char *args[] = {(char *)"tool", (char *)"fds", NULL};
    execv(tool, args);
    printf("exec failed: %s\n", strerror(errno));
    return 1;
}

static char stack[1 << 16] __attribute__((aligned(16)));
static volatile int spin = 1;

static int clone_child(void *arg)
{
    (void)arg;
    say_claimer((pid_t)syscall(SYS_getpid));
    char *args[] = {(char *)"tool", (char *)"who", NULL};
    execv(tool, args);
    _exit(127);
}

static int do_clonevm(void)
{
    pid_t pid = clone(clone_child, stack + sizeof stack, CLONE_VM | SIGCHLD, NULL);
    if (pid < 0)
        return 3;
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    printf("child status %d\n", status);
    return 0;
}

static int do_vfork(void)
{
    pid_t pid = vfork();
    if (pid == 0) {
        say_claimer((pid_t)syscall(SYS_getpid));
        char *args[] = {(char *)"tool", (char *)"who", NULL};
        execv(tool, args);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    printf("child status %d\n", status);
    return 0;
}

static void *spinner(void *arg)
{
    const char *out = arg;
    char path[4096];
    int tries = 0;
    while (spin) {
        if (out && tries++ < 1000) {
            snprintf(path, sizeof path, "%s/thread-escaped", out);
            int fd = open(path, O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) {
                (void)!write(fd, "x", 1);
                close(fd);
            }
        }
        usleep(1000);
    }
    return NULL;
}

static void *execer(void *arg)
{
    (void)arg;
    say_claimer(getpid());
    char *args[] = {(char *)"tool", (char *)"who", NULL};
    execv(tool, args);
    _exit(127);
}

static int do_thread(void)
{
    pthread_t a, b;
    pthread_create(&a, NULL, spinner, NULL);
    pthread_create(&b, NULL, execer, NULL);
    pthread_join(b, NULL);
    return 1;
}

/* seccomp: the listener goes to a helper process, which answers every unshare() with 0. */
static int send_fd(int sock, int fd)
{
    char data = 'f';
    struct iovec iov = {&data, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
    char data;
    struct iovec iov = {&data, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    if (recvmsg(sock, &msg, 0) != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    int fd;
    if (!c || c->cmsg_type != SCM_RIGHTS)
        return -1;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static void supervise(int sock)
{
    int listener = recv_fd(sock);
    if (listener < 0)
        _exit(1);
    struct seccomp_notif req;
    struct seccomp_notif_resp resp;
    for (;;) {
        memset(&req, 0, sizeof req);
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) < 0) {
            if (errno == EINTR)
                continue;
            _exit(0);
        }
        memset(&resp, 0, sizeof resp);
        resp.id = req.id;
        resp.val = 0; /* "unshare succeeded" */
        resp.error = 0;
        ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
        (void)!write(2, "faked unshare\n", 14);
    }
}

static int do_seccomp(const char *out)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return 3;
    pid_t helper = fork();
    if (helper == 0) {
        close(sv[0]);
        supervise(sv[1]);
    }
    close(sv[1]);
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unshare, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    int listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                                SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (listener < 0) {
        printf("seccomp refused: %s\n", strerror(errno));
        fflush(stdout);
        kill(helper, SIGKILL);
        return 4;
    }
    send_fd(sv[0], listener);
    close(listener);
    close(sv[0]);
    long probe = syscall(SYS_unshare, CLONE_VM);
    printf("unshare in a threaded process says %ld\n", probe);
    pthread_t a;
    pthread_create(&a, NULL, spinner, (void *)out);
    usleep(20000);
    probe = syscall(SYS_unshare, CLONE_VM);
    printf("unshare with two threads says %ld\n", probe);
    fflush(stdout);
    say_claimer(getpid());
    char *args[] = {(char *)"tool", (char *)"who", NULL};
    execv(tool, args);
    printf("exec failed: %s\n", strerror(errno));
    return 1;
}

/* resolve_path: exchange a folder and a symlink to another folder, all the time. */
static const char *ws;
static volatile int racing = 1;

static void *exchanger(void *arg)
{
    (void)arg;
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/sw", ws);
    snprintf(b, sizeof b, "%s/swl", ws);
    while (racing)
        syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */);
    return NULL;
}

static int do_resolve(int n)
{
    char prog[4096], witness[4096];
    snprintf(prog, sizeof prog, "%s/sw/prog", ws);
    snprintf(witness, sizeof witness, "%s/forbidden-ran", ws);
    pthread_t t;
    pthread_create(&t, NULL, exchanger, NULL);
    int ran = 0, denied = 0, other = 0;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char *args[] = {(char *)"prog", (char *)"late", witness, (char *)"0", NULL};
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 2);
            execv(prog, args);
            _exit(errno == EACCES ? 126 : 125);
        }
        int status;
        waitpid(pid, &status, 0);
        if (access(witness, F_OK) == 0) {
            ran++;
            unlink(witness);
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 126)
            denied++;
        else
            other++;
    }
    racing = 0;
    pthread_join(t, NULL);
    printf("resolve ran=%d denied=%d other=%d\n", ran, denied, other);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3)
        return 2;
    tool = argv[2];
    if (!strcmp(argv[1], "fds"))
        return do_fds(argc - 3, argv + 3);
    if (!strcmp(argv[1], "clonevm"))
        return do_clonevm();
    if (!strcmp(argv[1], "vfork"))
        return do_vfork();
    if (!strcmp(argv[1], "thread"))
        return do_thread();
    if (!strcmp(argv[1], "seccomp") && argc == 4)
        return do_seccomp(argv[3]);
    if (!strcmp(argv[1], "resolve") && argc == 4) {
        ws = argv[3];
        return do_resolve(atoi(argv[2]));
    }
    return 2;
}
