/* Killing a session's process tree (see tree.h). Moved here from launch.c unchanged but for
 * the caller's pid and the spared child. */
#include "tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

/* struct pidfd_info of <linux/pidfd.h>, its first version (older headers lack it). */
struct eg_pidfd_info {
    uint64_t mask, cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid, spare0;
};
_Static_assert(sizeof(struct eg_pidfd_info) == 64, "PIDFD_INFO_SIZE_VER0");
#define EG_PIDFD_GET_INFO _IOWR(0xFF, 11, struct eg_pidfd_info)
#define EG_PIDFD_INFO_PID 1ULL

int eg_pidfd_ppid(int pidfd, pid_t *ppid)
{
    struct eg_pidfd_info info;
    memset(&info, 0, sizeof info);
    info.mask = EG_PIDFD_INFO_PID;
    if (pidfd < 0 || ioctl(pidfd, EG_PIDFD_GET_INFO, &info) < 0 ||
        !(info.mask & EG_PIDFD_INFO_PID))
        return -1;
    *ppid = (pid_t)info.ppid;
    return 0;
}

/* /proc/PID/stat: parent pid and start time (clock ticks since boot). */
int eg_read_stat(pid_t pid, pid_t *ppid, unsigned long long *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may contain anything */
    if (!p)
        return -1;
    p++;
    /* fields after comm: 3 state, 4 ppid, …, 22 starttime */
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 4 && ppid)
            *ppid = (pid_t)strtol(tok, NULL, 10);
        if (field == 22) {
            if (start)
                *start = strtoull(tok, NULL, 10);
            return 0;
        }
    }
    return -1;
}

struct pidvec {
    pid_t *v;
    size_t n, cap;
};

static int pidvec_push(struct pidvec *pv, pid_t pid)
{
    if (pv->n == pv->cap) {
        size_t cap = pv->cap ? pv->cap * 2 : 64;
        pid_t *v = realloc(pv->v, cap * sizeof *v);
        if (!v)
            return -1;
        pv->v = v;
        pv->cap = cap;
    }
    pv->v[pv->n++] = pid;
    return 0;
}

/* Append the children of every thread of pid (/proc/PID/task/TID/children). */
static void read_children(pid_t pid, struct pidvec *out)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char file[300];
        snprintf(file, sizeof file, "/proc/%d/task/%s/children", (int)pid, e->d_name);
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        char buf[4096], num[16];
        size_t nl = 0;
        ssize_t k;
        while ((k = read(fd, buf, sizeof buf)) > 0) {
            for (ssize_t i = 0; i < k; i++) {
                if (buf[i] >= '0' && buf[i] <= '9') {
                    if (nl < sizeof num - 1)
                        num[nl++] = buf[i];
                } else if (nl) {
                    num[nl] = '\0';
                    (void)pidvec_push(out, (pid_t)atoi(num));
                    nl = 0;
                }
            }
        }
        if (nl) {
            num[nl] = '\0';
            (void)pidvec_push(out, (pid_t)atoi(num));
        }
        close(fd);
    }
    closedir(d);
}

/* Send sig to pid, a process we found as a child of parent. Through a pidfd opened before the
 * parent check, so a pid that was reaped and reused meanwhile is never signalled: the pidfd
 * names one process for good, and the check shows that process was parent's child. */
static int signal_child_of(pid_t pid, pid_t parent, int sig, int also_cont,
                           unsigned long long *start)
{
    pid_t ppid = -1;
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0 && errno != ENOSYS)
        return -1; /* gone already */
    if (eg_read_stat(pid, &ppid, start) < 0 || ppid != parent) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (fd >= 0) {
        syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
        if (also_cont)
            syscall(SYS_pidfd_send_signal, fd, SIGCONT, NULL, 0);
        close(fd);
    } else { /* kernel without pidfds (< 5.3): small reuse window */
        kill(pid, sig);
        if (also_cont)
            kill(pid, SIGCONT);
    }
    return 0;
}

/* Queue pid with its start time (starts[i] belongs to queue->v[i]); out of memory: not queued
 * (its children are then not walked this round; the next round finds them). */
static void queue_push(struct pidvec *queue, unsigned long long **starts, pid_t pid,
                       unsigned long long start)
{
    if (pidvec_push(queue, pid) < 0)
        return;
    unsigned long long *s = realloc(*starts, queue->n * sizeof *s);
    if (!s) {
        queue->n--;
        return;
    }
    *starts = s;
    s[queue->n - 1] = start;
}

size_t eg_signal_descendants(pid_t self, pid_t spare, int sig, int also_cont)
{
    struct pidvec queue = {0};
    unsigned long long *starts = NULL;
    size_t count = 0;

    struct pidvec kids = {0};
    read_children(self, &kids);
    for (size_t i = 0; i < kids.n; i++) {
        if (kids.v[i] == spare)
            continue;
        /* Our own children cannot be reused before we reap them: plain kill is exact. */
        if (kill(kids.v[i], sig) == 0) {
            count++;
            if (also_cont)
                kill(kids.v[i], SIGCONT);
        }
        unsigned long long st = 0;
        if (eg_read_stat(kids.v[i], NULL, &st) == 0)
            queue_push(&queue, &starts, kids.v[i], st);
    }
    free(kids.v);

    for (size_t qi = 0; qi < queue.n && queue.n < (1u << 22); qi++) {
        pid_t parent = queue.v[qi];
        struct pidvec ch = {0};
        read_children(parent, &ch);
        unsigned long long again = 0;
        /* The list is parent's only if parent is still the process we queued. */
        if (eg_read_stat(parent, NULL, &again) < 0 || again != starts[qi]) {
            free(ch.v);
            continue;
        }
        for (size_t i = 0; i < ch.n; i++) {
            unsigned long long st = 0;
            if (signal_child_of(ch.v[i], parent, sig, also_cont, &st) < 0)
                continue;
            count++;
            queue_push(&queue, &starts, ch.v[i], st);
        }
        free(ch.v);
    }
    free(queue.v);
    free(starts);
    return count;
}

