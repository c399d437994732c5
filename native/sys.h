/* Raw system calls for the exec path of the interposer (and the programs sharing gate.c).
 *
 * Why not libc's wrappers: every program a gated process starts runs this path in a child that
 * was just fork()ed, where each libc text page touched is a page fault (fork does not copy the
 * page tables of file mappings) and each wrapper lives on a page of its own. These are inline:
 * no libc, no PLT, no errno. Each returns the kernel's result: >= 0, or -errno.
 *
 * Async-signal-safe and vfork-safe (they touch no memory but their arguments). x86-64 and
 * AArch64 issue the instruction inline; other architectures go through libc's syscall().
 */
#ifndef EXECGATE_SYS_H
#define EXECGATE_SYS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
static inline long eg_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
static inline long eg_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory", "cc");
    return x0;
}
#else
static inline long eg_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
    int saved = errno;
    long r = syscall(n, a, b, c, d, e, f);
    if (r < 0)
        r = -errno;
    errno = saved;
    return r;
}
#endif

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* Bytes of the kernel's signal set (_NSIG / 8 on x86-64 and AArch64). */
#define EG_SIGSET_BYTES 8

#define EG_SC(n, a, b, c, d, e, f)                                                            \
    eg_syscall6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

static inline int eg_sys_openat(int dirfd, const char *path, int flags)
{
    return (int)EG_SC(SYS_openat, dirfd, path, flags, 0, 0, 0);
}

/* openat2(2) with RESOLVE_NO_SYMLINKS (a symlink anywhere on the path: -ELOOP; -ENOSYS before
 * Linux 5.6): how a path that has no symlink is told from one that merely had none a moment ago. */
static inline int eg_sys_open_no_symlinks(const char *path, int flags)
{
    struct {
        unsigned long long flags, mode, resolve;
    } how = {(unsigned long long)flags, 0, 0x04 /* RESOLVE_NO_SYMLINKS */};
    return (int)EG_SC(SYS_openat2, AT_FDCWD, path, &how, sizeof how, 0, 0);
}

static inline int eg_sys_close(int fd) { return (int)EG_SC(SYS_close, fd, 0, 0, 0, 0, 0); }

/* fstatat(2): AT_EMPTY_PATH with "" for a descriptor's own stat. */
static inline int eg_sys_fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    return (int)EG_SC(SYS_newfstatat, dirfd, path, st, flags, 0, 0);
}

static inline int eg_sys_fstat(int fd, struct stat *st)
{
    return eg_sys_fstatat(fd, "", st, AT_EMPTY_PATH);
}

static inline ssize_t eg_sys_pread(int fd, void *buf, size_t n, off_t at)
{
    return EG_SC(SYS_pread64, fd, buf, n, at, 0, 0);
}

static inline ssize_t eg_sys_readlink(const char *path, char *buf, size_t n)
{
    return EG_SC(SYS_readlinkat, AT_FDCWD, path, buf, n, 0, 0);
}

static inline ssize_t eg_sys_fgetxattr(int fd, const char *name, void *buf, size_t n)
{
    return EG_SC(SYS_fgetxattr, fd, name, buf, n, 0, 0);
}

static inline ssize_t eg_sys_getxattr(const char *path, const char *name, void *buf, size_t n)
{
    return EG_SC(SYS_getxattr, path, name, buf, n, 0, 0);
}

/* The kernel's getcwd: the length including the NUL, or -errno (never a relative path). */
static inline long eg_sys_getcwd(char *buf, size_t n)
{
    return EG_SC(SYS_getcwd, buf, n, 0, 0, 0, 0);
}

static inline int eg_sys_fcntl(int fd, int cmd, long arg)
{
    return (int)EG_SC(SYS_fcntl, fd, cmd, arg, 0, 0, 0);
}

/* mmap(2): the address, or a value in [-4095, -1] (-errno). */
static inline long eg_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return EG_SC(SYS_mmap, addr, len, prot, flags, fd, off);
}

/* Fresh private read-write memory, or NULL. */
static inline void *eg_sys_map_anon(size_t len)
{
    long addr = eg_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return addr < 0 && addr > -4096 ? NULL : (void *)addr;
}

static inline int eg_sys_munmap(void *addr, size_t len)
{
    return (int)EG_SC(SYS_munmap, addr, len, 0, 0, 0, 0);
}

static inline ssize_t eg_sys_read(int fd, void *buf, size_t n)
{
    return EG_SC(SYS_read, fd, buf, n, 0, 0, 0);
}

static inline ssize_t eg_sys_write(int fd, const void *buf, size_t n)
{
    return EG_SC(SYS_write, fd, buf, n, 0, 0, 0);
}

static inline int eg_sys_socket(int domain, int type, int protocol)
{
    return (int)EG_SC(SYS_socket, domain, type, protocol, 0, 0, 0);
}

static inline int eg_sys_connect(int fd, const void *addr, unsigned len)
{
    return (int)EG_SC(SYS_connect, fd, addr, len, 0, 0, 0);
}

static inline ssize_t eg_sys_send(int fd, const void *buf, size_t n, int flags)
{
    return EG_SC(SYS_sendto, fd, buf, n, flags, 0, 0);
}

static inline ssize_t eg_sys_sendmsg(int fd, const void *msg, int flags)
{
    return EG_SC(SYS_sendmsg, fd, msg, flags, 0, 0, 0);
}

static inline ssize_t eg_sys_recvmsg(int fd, void *msg, int flags)
{
    return EG_SC(SYS_recvmsg, fd, msg, flags, 0, 0, 0);
}

/* ppoll without a timeout or signal mask: the process's mask stays as it is. */
static inline int eg_sys_ppoll(void *fds, unsigned long nfds)
{
    return (int)EG_SC(SYS_ppoll, fds, nfds, 0, 0, 0, 0);
}

/* ppoll with a timeout (NULL: none) and the signal mask to wait with (NULL: the process's). */
static inline int eg_sys_ppoll_masked(void *fds, unsigned long nfds, const struct timespec *timeout,
                                      const sigset_t *mask)
{
    return (int)EG_SC(SYS_ppoll, fds, nfds, timeout, mask, mask ? EG_SIGSET_BYTES : 0, 0);
}

static inline int eg_sys_sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    return (int)EG_SC(SYS_rt_sigprocmask, how, set, old, EG_SIGSET_BYTES, 0, 0);
}

static inline int eg_sys_close_range(unsigned first, unsigned last, unsigned flags)
{
    return (int)EG_SC(SYS_close_range, first, last, flags, 0, 0, 0);
}

__attribute__((noreturn)) static inline void eg_sys_exit(int status)
{
    for (;;)
        EG_SC(SYS_exit_group, status, 0, 0, 0, 0, 0);
}

/* The kernel's signal set: signals 1 to 64, the first EG_SIGSET_BYTES of a sigset_t (what
 * rt_sigprocmask and ppoll read and write; libc's sigset_t is larger). Signal numbers must
 * be in 1..64. */
static inline uint64_t eg_sigset_word(const sigset_t *s)
{
    uint64_t w;
    __builtin_memcpy(&w, s, sizeof w);
    return w;
}

static inline void eg_sigset_put(sigset_t *s, uint64_t w) { __builtin_memcpy(s, &w, sizeof w); }

static inline void eg_sigemptyset(sigset_t *s)
{
    __builtin_memset(s, 0, sizeof *s);
}

static inline void eg_sigaddset(sigset_t *s, int sig)
{
    eg_sigset_put(s, eg_sigset_word(s) | 1ULL << (sig - 1));
}

static inline void eg_sigdelset(sigset_t *s, int sig)
{
    eg_sigset_put(s, eg_sigset_word(s) & ~(1ULL << (sig - 1)));
}

static inline pid_t eg_sys_getpid(void) { return (pid_t)EG_SC(SYS_getpid, 0, 0, 0, 0, 0, 0); }

static inline pid_t eg_sys_getppid(void) { return (pid_t)EG_SC(SYS_getppid, 0, 0, 0, 0, 0, 0); }

static inline int eg_sys_prctl(int op, unsigned long a, unsigned long b)
{
    return (int)EG_SC(SYS_prctl, op, a, b, 0, 0, 0);
}

#endif
