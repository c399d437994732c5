/* The git repository an escalated program would use, judged at the claim (gitrepo.h). */
#include "gitrepo.h"
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* GIT_DIR when git must find no repository: a path below a device can never be one. */
#define NO_REPOSITORY "/dev/null/.git"

/* path + "/" + name into out; 0, or -1 when it does not fit. */
static int join(char *out, size_t cap, const char *path, const char *name)
{
    int n = snprintf(out, cap, "%s%s%s", path, strcmp(path, "/") ? "/" : "", name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The carve-outs that existed at start-up (gr_remember_carveouts). */
static struct carveout {
    dev_t dev;
    ino_t ino;
} g_carveouts[256];
static int g_ncarveouts;

static void remember(const char *path)
{
    struct stat st;
    for (int follow = 0; follow < 2; follow++)
        if ((follow ? stat(path, &st) : lstat(path, &st)) == 0 &&
            g_ncarveouts < (int)(sizeof g_carveouts / sizeof *g_carveouts))
            g_carveouts[g_ncarveouts++] = (struct carveout){st.st_dev, st.st_ino};
}

static int g_known; /* --known-carveouts was given: nothing else is remembered */

int gr_known_carveouts(const char *list)
{
    g_known = 1;
    for (const char *p = list; *p;) {
        char *end;
        errno = 0;
        unsigned long long dev = strtoull(p, &end, 10);
        if (errno || end == p || *end != ':')
            return -1;
        p = end + 1;
        unsigned long long ino = strtoull(p, &end, 10);
        if (errno || end == p || (*end && *end != ','))
            return -1;
        if (g_ncarveouts == (int)(sizeof g_carveouts / sizeof *g_carveouts))
            return -1;
        g_carveouts[g_ncarveouts++] = (struct carveout){(dev_t)dev, (ino_t)ino};
        p = *end ? end + 1 : end;
    }
    return 0;
}

void gr_remember_carveouts(const struct sb_config *c)
{
    char path[PATH_MAX];
    if (g_known)
        return;
    for (int i = 0; i < c->writable.n; i++)
        for (int j = 0; j < c->protect.n; j++)
            if (join(path, sizeof path, c->writable.v[i], c->protect.v[j]) == 0)
                remember(path);
    for (int i = 0; i < c->readonly.n; i++)
        remember(c->readonly.v[i]);
}

static int remembered(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return 0;
    for (int i = 0; i < g_ncarveouts; i++)
        if (g_carveouts[i].dev == st.st_dev && g_carveouts[i].ino == st.st_ino)
            return 1;
    return 0;
}

/* Open path (absolute) inside the claimer's root, as its processes would resolve it: absolute
 * symlinks and ".." stay inside that root. `folders_only`: no symlink at all on the way (a
 * folder of the working directory's path that became a link was swapped after the decision).
 * fd, or -errno. */
static int open_in(int root, const char *path, int no_symlinks)
{
    struct open_how how = {.flags = O_PATH | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
                                      (no_symlinks ? RESOLVE_NO_SYMLINKS : 0)};
    while (*path == '/')
        path++;
    long fd = syscall(SYS_openat2, root, *path ? path : ".", &how, sizeof how);
    return fd < 0 ? -errno : (int)fd;
}

/* On a mount the claimer's sandbox can write (everything there but its writable roots is a
 * read-only mount, and so is every carve-out). Unknown counts as writable. */
static int writable_fd(int fd)
{
    struct statvfs s;
    return fstatvfs(fd, &s) < 0 || !(s.f_flag & ST_RDONLY);
}


/* Read up to cap-1 bytes of the file at fd (an O_PATH descriptor) into buf. Length or -1. */
static ssize_t read_small(int fd, char *buf, size_t cap)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int r = open(proc, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* the file fd names, no FIFO wait */
    if (r < 0)
        return -1;
    ssize_t n = read(r, buf, cap - 1);
    close(r);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

/* A gitfile's target ("gitdir: PATH", relative to its folder) is on a writable mount, or
 * cannot be read or found (fail closed). */
static int gitfile_target_writable(int root, int file, const char *folder)
{
    char text[4096], target[2 * PATH_MAX];
    if (read_small(file, text, sizeof text) < 0 || strncmp(text, "gitdir:", 7))
        return 1;
    char *p = text + 7, *end = p + strcspn(p, "\r\n");
    *end = '\0';
    while (*p == ' ' || *p == '\t')
        p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    if (!*p)
        return 1;
    if (*p == '/' ? snprintf(target, sizeof target, "%s", p) >= (int)sizeof target
                  : join(target, sizeof target, folder, p) < 0)
        return 1;
    int fd = open_in(root, target, 0);
    if (fd < 0)
        return 1;
    int w = writable_fd(fd);
    close(fd);
    return w;
}

/* fd (an O_PATH directory) holds a file `name` of the kind wanted (S_IFREG, S_IFDIR). */
static int has(int dir, const char *name, mode_t kind)
{
    struct stat st;
    return fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && (st.st_mode & S_IFMT) == kind;
}

/* The `.git` directory (O_PATH) is a repository git certainly accepts, so that its discovery
 * stops there: stricter than git (a HEAD file naming a ref or an object, objects/ and refs/
 * in it), never looser. */
static int surely_a_repository(int dot_git)
{
    char head[256];
    int fd = openat(dot_git, "HEAD", O_PATH | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read_small(fd, head, sizeof head) : -1;
    close(fd);
    if (n <= 0)
        return 0;
    size_t hex = strspn(head, "0123456789abcdef");
    int ref = !strncmp(head, "ref: refs/", 10) ||
              ((hex == 40 || hex == 64) && (head[hex] == '\n' || head[hex] == '\0'));
    return ref && has(dot_git, "objects", S_IFDIR) && has(dot_git, "refs", S_IFDIR);
}

/* Every `.git` on git's way up from cwd (the first one found goes to *first, "" for none):
 * 1 when one of them, or what a gitfile points to, is the sandbox's to write, or a symlinked
 * `.git` lies in a folder it can write (it can point it elsewhere); *dot_git names it.
 * *ancestors_writable: a folder strictly above cwd can be written (a `.git` can appear there,
 * a folder on the way can be swapped). *cwd_writable, *cwd_repository (cwd's own `.git`
 * is one git surely stops at). -1: cannot be examined (fail closed). */
static int walk(int root, const char *cwd, char *dot_git, char *first, int *ancestors_writable,
                int *cwd_writable, int *cwd_repository, int standing)
{
    char folder[PATH_MAX], path[PATH_MAX];
    if (snprintf(folder, sizeof folder, "%s", cwd) >= (int)sizeof folder || folder[0] != '/')
        return -1;
    first[0] = '\0';
    for (int depth = 0;; depth++) {
        /* The folders of the working directory were canonical when the server decided. */
        int dir = open_in(root, folder, 1);
        if (dir < 0)
            return -1;
        int w = writable_fd(dir);
        if (depth == 0)
            *cwd_writable = w;
        else if (w)
            *ancestors_writable = 1;
        struct stat st;
        int found = fstatat(dir, ".git", &st, AT_SYMLINK_NOFOLLOW) == 0;
        if (!found && errno != ENOENT) {
            close(dir);
            return -1;
        }
        if (found) {
            if (join(path, sizeof path, folder, ".git") < 0) {
                close(dir);
                return -1;
            }
            if (!first[0])
                snprintf(first, PATH_MAX, "%s", path);
            int git = open_in(root, path, 0);
            /* read-only in a folder the claimer can write: a carve-out, which the sandbox may
             * have made itself before the spawn that made it read-only */
            int bad = git < 0 || (S_ISLNK(st.st_mode) && w) || writable_fd(git) ||
                      (w && !remembered(git));
            struct stat target;
            if (!bad && fstat(git, &target) == 0 && S_ISREG(target.st_mode))
                bad = gitfile_target_writable(root, git, folder);
            if (!bad && depth == 0)
                *cwd_repository = fstat(git, &target) == 0 && S_ISDIR(target.st_mode) &&
                                  surely_a_repository(git);
            if (git >= 0)
                close(git);
            if (bad) {
                snprintf(dot_git, PATH_MAX, "%s", path);
                for (char *p = dot_git; *p; p++) /* it goes into a message: no terminal controls */
                    if ((unsigned char)*p < 0x20 || *p == 0x7f)
                        *p = '?';
                close(dir);
                return 1;
            }
        }
        /* A standing claim (gitrepo.h): a folder git would take for a repository itself, as
         * the server's check looks (gate/gitrepo.py), is the sandbox's to write. */
        if (!found && standing && w &&
            fstatat(dir, "HEAD", &st, AT_SYMLINK_NOFOLLOW) == 0) {
            snprintf(dot_git, PATH_MAX, "%s", folder);
            for (char *p = dot_git; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == 0x7f)
                    *p = '?';
            close(dir);
            return 1;
        }
        close(dir);
        if (!strcmp(folder, "/"))
            return 0;
        char *slash = strrchr(folder, '/');
        if (slash == folder)
            slash[1] = '\0';
        else
            *slash = '\0';
    }
}

/* The process behind pidfd still runs (so /proc/PID was it); no pidfd: assumed. */
static int alive(int pidfd)
{
    return pidfd < 0 || syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0;
}

int gr_peer_pidfd(int sock)
{
    int pidfd = -1;
    socklen_t len = sizeof pidfd;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0)
        pidfd = -1;
    return pidfd;
}

/* The launcher's own mount namespace (it never leaves it: sandboxes are set up in children). */
static int own_mount_ns(struct stat *out)
{
    static struct stat mine;
    static int known;
    if (!known && stat("/proc/self/ns/mnt", &mine) == 0)
        known = 1;
    *out = mine;
    return known ? 0 : -1;
}

enum gr_outcome gr_examine_claim(int pidfd, pid_t peer, const char *cwd, struct gr_found *out,
                                 int standing)
{
    char path[64];
    struct stat mine, theirs;
    out->dot_git[0] = out->git_dir[0] = out->work_tree[0] = '\0';
    enum gr_outcome outcome = GR_WRITABLE;
    int root = -1;
    if (!standing) { /* a standing claim is examined in any mount namespace */
        snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)peer);
        if (own_mount_ns(&mine) < 0 || stat(path, &theirs) < 0)
            goto done;
        if (mine.st_dev == theirs.st_dev && mine.st_ino == theirs.st_ino) {
            if (alive(pidfd)) /* (not another process that got its pid meanwhile) */
                outcome = GR_AS_IS; /* not in a sandbox */
            goto done;
        }
    }
    snprintf(path, sizeof path, "/proc/%d/root", (int)peer);
    root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        goto done;
    char first[PATH_MAX];
    int ancestors_writable = 0, cwd_writable = 1, cwd_repository = 0;
    int r = walk(root, cwd, out->dot_git, first, &ancestors_writable, &cwd_writable,
                 &cwd_repository, standing);
    if (r != 0) {
        if (r < 0)
            out->dot_git[0] = '\0';
        goto done;
    }
    if (!alive(pidfd)) /* its root was the one examined only if it is still there */
        goto done;
    if (!ancestors_writable && (!cwd_writable || cwd_repository)) {
        outcome = GR_AS_IS; /* nothing on git's way can change any more */
        goto done;
    }
    outcome = GR_PIN;
    if (!first[0]) {
        snprintf(out->git_dir, sizeof out->git_dir, "GIT_DIR=%s", NO_REPOSITORY);
    } else {
        snprintf(out->git_dir, sizeof out->git_dir, "GIT_DIR=%s", first);
        size_t n = strlen(first) - strlen("/.git");
        snprintf(out->work_tree, sizeof out->work_tree, "GIT_WORK_TREE=%.*s", (int)(n ? n : 1),
                 n ? first : "/");
    }
done:
    if (root >= 0)
        close(root);
    return outcome;
}

static int named(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return !strncmp(entry, name, n) && entry[n] == '=';
}

char **gr_pin_env(char **envp, struct gr_found *found)
{
    static const char *const replaced[] = {"GIT_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES",
                                           "GIT_DISCOVERY_ACROSS_FILESYSTEM"};
    size_t n = 0;
    while (envp[n])
        n++;
    char **out = malloc((n + 3) * sizeof *out);
    if (!out)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int drop = 0;
        for (size_t k = 0; k < sizeof replaced / sizeof *replaced && !drop; k++)
            drop = named(envp[i], replaced[k]);
        if (!drop)
            out[m++] = envp[i];
    }
    out[m++] = found->git_dir;
    if (found->work_tree[0])
        out[m++] = found->work_tree;
    out[m] = NULL;
    return out;
}
