/* Landlock + mount namespace + capabilities + seccomp confinement (see sandbox.h, docs/sandbox.md).
 *
 * Direct syscalls only: the kernel headers this is built against may be older than the kernel it
 * runs on, so the Landlock ABI (structures, rights, scopes) is defined here and everything is
 * chosen at run time from the ABI the kernel reports.
 */
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* -- syscall numbers (unified across architectures since Linux 5.x) ------------------------ */
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_seccomp
#error "seccomp syscall number unknown"
#endif

/* -- Landlock ABI (include/uapi/linux/landlock.h, up to ABI 7) ------------------------------- */
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2 /* ABI 4 */

#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)    /* ABI 2 */
#define LL_FS_TRUNCATE (1ULL << 14) /* ABI 3 */
#define LL_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */

#define LL_NET_BIND_TCP (1ULL << 0)    /* ABI 4 */
#define LL_NET_CONNECT_TCP (1ULL << 1) /* ABI 4 */

#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define LL_SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

/* Rights a rule on a non-directory may carry. */
#define LL_FILE_RIGHTS \
    (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

#define R_READ (LL_FS_READ_FILE | LL_FS_READ_DIR)
#define R_WRITE                                                                                   \
    (LL_FS_WRITE_FILE | LL_FS_REMOVE_DIR | LL_FS_REMOVE_FILE | LL_FS_MAKE_DIR | LL_FS_MAKE_REG |  \
     LL_FS_MAKE_SOCK | LL_FS_MAKE_FIFO | LL_FS_MAKE_SYM | LL_FS_REFER | LL_FS_TRUNCATE)
#define R_DEVICE (LL_FS_READ_FILE | LL_FS_WRITE_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net; /* ABI 4 */
    uint64_t scoped;             /* ABI 6 */
};

struct ll_net_port_attr {
    uint64_t allowed_access;
    uint64_t port;
};

struct ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* -- seccomp architecture ------------------------------------------------------------------- */
#if defined(__x86_64__)
#define SB_AUDIT_ARCH AUDIT_ARCH_X86_64
#define SB_ARCH_NAME "x86_64"
#define SB_X32_BIT 0x40000000U
#elif defined(__aarch64__)
#define SB_AUDIT_ARCH AUDIT_ARCH_AARCH64
#define SB_ARCH_NAME "aarch64"
#elif defined(__riscv) && __riscv_xlen == 64
#define SB_AUDIT_ARCH AUDIT_ARCH_RISCV64
#define SB_ARCH_NAME "riscv64"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#else
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)
#endif

/* Directories programs may be executed from under strict-exec (plus --exec-dir). */
static const char *const SYSTEM_EXEC_DIRS[] = {
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", NULL,
};

/* Devices every confined profile can open for reading and writing. */
static const char *const DEVICES[] = {
    "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
    "/dev/tty",  "/dev/ptmx", "/dev/pts",  NULL,
};

/* -- messages -------------------------------------------------------------------------------- */

static int fail(char *msg, size_t cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Write "sandbox: <fmt>: <strerror(err)>" into msg; return -err. */
static int fail(char *msg, size_t cap, int err, const char *fmt, ...)
{
    int n = snprintf(msg, cap, "sandbox: ");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < cap)
        n += vsnprintf(msg + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
    if (err && n >= 0 && (size_t)n < cap)
        snprintf(msg + n, cap - (size_t)n, ": %s", strerror(err));
    return -(err ? err : EPERM);
}

/* -- options --------------------------------------------------------------------------------- */

static int list_add(struct sb_list *l, const char *s)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        const char **v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
    return 0;
}

int sb_parse_option(struct sb_config *c, int argc, char **argv, int *i, char *err, size_t cap)
{
    const char *opt = argv[*i];
    struct sb_list *list = NULL;
    int absolute = 1;

    if (!strcmp(opt, "--network")) {
        c->network = 1;
        return 1;
    }
    if (!strcmp(opt, "--strict-exec")) {
        c->strict_exec = 1;
        return 1;
    }
    if (!strcmp(opt, "--proxy-port") || !strcmp(opt, "--proxy-report-fd")) {
        char *end = NULL;
        long v = *i + 1 < argc ? strtol(argv[*i + 1], &end, 10) : -1;
        int port = opt[8] == 'p';
        if (!end || *end || v < (port ? 1 : 0) || v > (port ? 65535 : INT_MAX)) {
            snprintf(err, cap, "%s needs a %s", opt, port ? "port (1-65535)" : "descriptor");
            return -1;
        }
        ++*i;
        if (port)
            c->proxy_port = (int)v;
        else
            c->proxy_report = (int)v;
        return 1;
    }
    if (!strcmp(opt, "--shadows")) {
        if (*i + 1 >= argc || argv[*i + 1][0] != '/') {
            snprintf(err, cap, "--shadows needs an absolute path");
            return -1;
        }
        c->shadows = argv[++*i];
        return 1;
    }
    if (!strcmp(opt, "--sandbox"))
        list = NULL;
    else if (!strcmp(opt, "--writable"))
        list = &c->writable;
    else if (!strcmp(opt, "--readonly"))
        list = &c->readonly;
    else if (!strcmp(opt, "--exec-dir"))
        list = &c->exec_dirs;
    else if (!strcmp(opt, "--hide"))
        list = &c->hide;
    else if (!strcmp(opt, "--protect")) {
        list = &c->protect;
        absolute = 0;
    } else
        return 0;

    if (*i + 1 >= argc) {
        snprintf(err, cap, "%s needs a value", opt);
        return -1;
    }
    const char *value = argv[++*i];
    if (!list) {
        if (!strcmp(value, "off"))
            c->mode = SB_OFF;
        else if (!strcmp(value, "read-only"))
            c->mode = SB_READ_ONLY;
        else if (!strcmp(value, "workspace-write"))
            c->mode = SB_WORKSPACE_WRITE;
        else {
            snprintf(err, cap, "--sandbox: unknown mode '%s' (read-only, workspace-write, off)",
                     value);
            return -1;
        }
        return 1;
    }
    if (absolute && value[0] != '/') {
        snprintf(err, cap, "%s: '%s' is not an absolute path", opt, value);
        return -1;
    }
    if (!absolute && (!value[0] || strchr(value, '/') || !strcmp(value, ".") ||
                      !strcmp(value, ".."))) {
        snprintf(err, cap, "%s: '%s' is not a single file name", opt, value);
        return -1;
    }
    if (list_add(list, value) < 0) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    return 1;
}

/* -- helpers --------------------------------------------------------------------------------- */

int sb_landlock_abi(void)
{
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
    return abi < 0 ? -errno : (int)abi;
}

/* path equals root or lies below it (both canonical). */
static int is_under(const char *path, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return 1;
    return !strncmp(path, root, n) && (path[n] == '/' || path[n] == '\0');
}

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = strlen(text);
    ssize_t k = write(fd, text, n);
    int e = errno;
    close(fd);
    return k == (ssize_t)n ? 0 : -(k < 0 ? e : EIO);
}

/* -- mount namespace: read-only carve-outs --------------------------------------------------- */

struct eg_mount_attr {
    uint64_t attr_set;
    uint64_t attr_clr;
    uint64_t propagation;
    uint64_t userns_fd;
};
#define EG_MOUNT_ATTR_RDONLY 0x00000001ULL
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

int sb_map_own_ids(uid_t uid, gid_t gid, const char **what)
{
    char map[64];
    int r = write_file("/proc/self/setgroups", "deny");
    if (r < 0 && r != -ENOENT) {
        *what = "user namespace: /proc/self/setgroups";
        return r;
    }
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
    if ((r = write_file("/proc/self/uid_map", map)) < 0) {
        *what = "user namespace: /proc/self/uid_map";
        return r;
    }
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
    if ((r = write_file("/proc/self/gid_map", map)) < 0) {
        *what = "user namespace: /proc/self/gid_map";
        return r;
    }
    return 0;
}

/* Enter a private mount namespace: directly when we may (CAP_SYS_ADMIN), else inside a new
 * user namespace mapping our uid/gid to themselves. *how is "direct" or "userns". */
static int enter_mount_ns(const char **how, char *msg, size_t cap)
{
    if (unshare(CLONE_NEWNS) == 0) {
        *how = "direct";
    } else {
        if (errno != EPERM)
            return fail(msg, cap, errno, "cannot create a mount namespace (unshare)");
        uid_t uid = geteuid();
        gid_t gid = getegid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
            return fail(msg, cap, errno,
                        "cannot create a mount namespace: not privileged, and no user "
                        "namespace either (unshare CLONE_NEWUSER)");
        const char *what = NULL;
        int r = sb_map_own_ids(uid, gid, &what);
        if (r < 0)
            return fail(msg, cap, -r, what);
        *how = "userns";
    }
    /* Nothing we mount may propagate back to the host. */
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        return fail(msg, cap, errno, "cannot make the mount namespace private");
    return 0;
}

#ifndef AT_NO_AUTOMOUNT
#define AT_NO_AUTOMOUNT 0x800
#endif

static int set_readonly(const char *path, unsigned flags)
{
    struct eg_mount_attr attr = {.attr_set = EG_MOUNT_ATTR_RDONLY};
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, path, flags | AT_NO_AUTOMOUNT, &attr,
                        sizeof attr);
}

/* Bind-mount path onto itself, read-only, recursively (mount_setattr: Linux 5.12, always there
 * with Landlock ABI 3). */
static int bind_readonly(const char *path, char *msg, size_t cap)
{
    if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0)
        return fail(msg, cap, errno, "cannot bind-mount %s read-only", path);
    if (set_readonly(path, AT_RECURSIVE) < 0)
        return fail(msg, cap, errno, "cannot make %s read-only (mount_setattr)", path);
    return 0;
}

/* Mount an empty, read-only tmpfs over the directory path, so nothing below it (control
 * sockets, their discovery files) can be reached by name from this namespace. A path that does
 * not exist or is not a directory is skipped (nothing there to hide). */
static int hide_dir(const char *path, char *msg, size_t cap)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return 0;
    if (mount("execgate-hidden", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0555") < 0)
        return fail(msg, cap, errno, "cannot hide %s (mount tmpfs)", path);
    return 0;
}

/* Cover every program a rule names with its stand-in (docs/sandbox.md "The exec backstop").
 * The table is the server's: (stand-in, program) path pairs, each path NUL-terminated. A
 * program that does not exist (or is not a regular file) is skipped: nothing there to run.
 * Any other failure fails the spawn: a program left uncovered would run unasked. */
static int shadow_programs(const char *table, const char *uncovered, char *msg, size_t cap)
{
    int fd = open(table, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return fail(msg, cap, errno, "cannot read the stand-in table %s", table);
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) {
        close(fd);
        return fail(msg, cap, EINVAL, "the stand-in table %s is not a file", table);
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return fail(msg, cap, ENOMEM, "reading the stand-in table");
    }
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(fd, buf + got, len - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    int r = 0;
    if (got != len || (len && buf[len - 1] != '\0')) {
        r = fail(msg, cap, EINVAL, "the stand-in table %s is truncated", table);
        goto out;
    }
    for (size_t at = 0; at < len;) {
        const char *standin = buf + at;
        at += strlen(standin) + 1;
        if (at >= len) {
            r = fail(msg, cap, EINVAL, "the stand-in table %s is truncated", table);
            goto out;
        }
        const char *program = buf + at;
        at += strlen(program) + 1;
        struct stat pst;
        if (stat(program, &pst) < 0 || !S_ISREG(pst.st_mode))
            continue;
        if (uncovered && !strcmp(program, uncovered))
            continue;
        if (mount(standin, program, NULL, MS_BIND, NULL) < 0) {
            r = fail(msg, cap, errno, "cannot cover %s with its stand-in", program);
            goto out;
        }
        if (set_readonly(program, 0) < 0) {
            r = fail(msg, cap, errno, "cannot make the stand-in of %s read-only", program);
            goto out;
        }
    }
out:
    free(buf);
    return r;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
    char *out = s;
    for (char *in = s; *in; in++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
            in[3] >= '0' && in[3] <= '7') {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 3;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

static int is_under_any(const char *path, char *const *roots, int n)
{
    for (int i = 0; i < n; i++)
        if (is_under(path, roots[i]))
            return 1;
    return 0;
}

/* Everything read-only but the writable roots: each root is bind-mounted onto itself first
 * (so it, and the mounts below it, keep their own flags), then every mount that is not inside
 * a root is made read-only. That also stops what Landlock cannot: chmod, chown, utimes and
 * xattr changes outside the roots. */
static int readonly_tree(char *const *roots, int nroots, char *msg, size_t cap)
{
    for (int i = 0; i < nroots; i++) {
        int covered = 0; /* inside another root: already writable */
        for (int j = 0; j < nroots && !covered; j++)
            covered = j != i && is_under(roots[i], roots[j]) && strcmp(roots[i], roots[j]);
        if (covered)
            continue;
        if (!strcmp(roots[i], "/"))
            return 0; /* everything is writable */
        if (mount(roots[i], roots[i], NULL, MS_BIND | MS_REC, NULL) < 0)
            return fail(msg, cap, errno, "cannot bind-mount the writable root %s", roots[i]);
    }
    int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(msg, cap, errno, "/proc/self/mountinfo");
    size_t len = 0, size = 1 << 16;
    char *text = malloc(size);
    for (;;) {
        if (!text) {
            close(fd);
            return fail(msg, cap, ENOMEM, "reading /proc/self/mountinfo");
        }
        ssize_t k = read(fd, text + len, size - len - 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        len += (size_t)k;
        if (len + 1 >= size) {
            char *bigger = realloc(text, size * 2);
            if (!bigger)
                free(text);
            text = bigger;
            size *= 2;
        }
    }
    close(fd);
    text[len] = '\0';
    int r = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && !r; line = strtok_r(NULL, "\n", &save)) {
        /* id parent major:minor root MOUNTPOINT options … */
        char *field = line;
        for (int f = 0; f < 4 && field; f++) {
            field = strchr(field, ' ');
            if (field)
                field++;
        }
        if (!field)
            continue;
        char *end = strchr(field, ' ');
        if (end)
            *end = '\0';
        unescape(field);
        if (is_under_any(field, roots, nroots))
            continue;
        if (set_readonly(field, AT_SYMLINK_NOFOLLOW) < 0 && errno != ENOENT &&
            errno != ENOTDIR && errno != EACCES && errno != ELOOP)
            r = fail(msg, cap, errno, "cannot make the mount on %s read-only", field);
    }
    free(text);
    return r;
}

struct paths {
    char **v;
    int n;
};

static void paths_free(struct paths *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
    p->v = NULL;
    p->n = 0;
}

static int paths_add(struct paths *p, char *owned)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->v[i], owned)) {
            free(owned);
            return 0;
        }
    char **v = realloc(p->v, sizeof *v * (size_t)(p->n + 1));
    if (!v) {
        free(owned);
        return -ENOMEM;
    }
    p->v = v;
    p->v[p->n++] = owned;
    return 0;
}

static int by_length(const void *a, const void *b)
{
    size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);
    return la < lb ? -1 : la > lb;
}

/* Add the canonical form of path to carve when it exists inside a writable root (outside
 * them it is read-only anyway). 0, or -ENOMEM. */
static int carve_if_inside(const char *path, const struct paths *roots, struct paths *carve)
{
    char *target = realpath(path, NULL);
    if (!target)
        return 0;
    for (int k = 0; k < roots->n; k++)
        if (is_under(target, roots->v[k]))
            return paths_add(carve, target) < 0 ? -ENOMEM : 0;
    free(target);
    return 0;
}

/* The canonical writable roots that exist, and the existing paths inside them that must stay
 * read-only (<root>/<protected name>, --readonly paths). */
static int collect(const struct sb_config *c, struct paths *roots, struct paths *carve)
{
    if (c->mode != SB_WORKSPACE_WRITE)
        return 0;
    for (int i = 0; i < c->writable.n; i++) {
        char *r = realpath(c->writable.v[i], NULL);
        /* The server names roots by their canonical paths: one that no longer is (a symlink
         * was put on its way since) would make the link's target writable. Not writable. */
        if (r && strcmp(r, c->writable.v[i])) {
            free(r);
            continue;
        }
        if (r && paths_add(roots, r) < 0)
            return -ENOMEM;
    }
    for (int i = 0; i < roots->n; i++) {
        for (int j = 0; j < c->protect.n; j++) {
            char path[PATH_MAX];
            struct stat st;
            if (snprintf(path, sizeof path, "%s/%s", strcmp(roots->v[i], "/") ? roots->v[i] : "",
                         c->protect.v[j]) >= (int)sizeof path)
                continue;
            if (lstat(path, &st) < 0)
                continue;
            /* A symlinked .git: protect its target if that is writable (the link itself can
             * still be replaced; see docs/sandbox.md). */
            if (carve_if_inside(path, roots, carve) < 0)
                return -ENOMEM;
        }
    }
    for (int i = 0; i < c->readonly.n; i++)
        if (carve_if_inside(c->readonly.v[i], roots, carve) < 0)
            return -ENOMEM;
    /* Outer paths first, so an inner carve-out is mounted on top of an outer one. */
    if (carve->n > 1)
        qsort(carve->v, (size_t)carve->n, sizeof *carve->v, by_length);
    return 0;
}

/* Make every folder strictly inside a writable root on the way to path (path itself too when
 * with_self) a mount point of its own, bound onto itself with what is below it (so it stays
 * writable as before): a mount point cannot be renamed or removed. Otherwise a confined process
 * could move a folder holding a read-only carve-out (the mount goes along) or a writable root
 * inside another root away from its path and put a folder or a symlink of its own there, which
 * the server and the next sandbox would then take for the real one. pinned: the folders done. */
static int pin_folders(const char *path, int with_self, const struct paths *roots,
                       struct paths *pinned, char *msg, size_t cap)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof buf || path[0] != '/')
        return 0;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && (buf[i] != '\0' || !with_self))
            continue;
        char c = buf[i];
        buf[i] = '\0';
        int inside = 0;
        for (int k = 0; k < roots->n && !inside; k++)
            inside = is_under(buf, roots->v[k]) && strcmp(buf, roots->v[k]);
        int done = 0;
        for (int k = 0; k < pinned->n && !done; k++)
            done = !strcmp(pinned->v[k], buf);
        if (inside && !done) {
            if (mount(buf, buf, NULL, MS_BIND | MS_REC, NULL) < 0 && errno != ENOENT &&
                errno != ENOTDIR)
                return fail(msg, cap, errno, "cannot pin the folder %s (bind mount)", buf);
            char *copy = strdup(buf);
            if (!copy || paths_add(pinned, copy) < 0)
                return fail(msg, cap, ENOMEM, "pinning folders");
        }
        buf[i] = c;
    }
    return 0;
}

/* -- Landlock -------------------------------------------------------------------------------- */

static uint64_t handled_fs(int abi)
{
    uint64_t r = (LL_FS_MAKE_SYM << 1) - 1; /* ABI 1: EXECUTE .. MAKE_SYM */
    if (abi >= 2)
        r |= LL_FS_REFER;
    if (abi >= 3)
        r |= LL_FS_TRUNCATE;
    if (abi >= 5)
        r |= LL_FS_IOCTL_DEV;
    return r;
}

/* Allow `access` beneath path. Missing paths are skipped when optional. */
static int allow_path(int ruleset, const char *path, uint64_t access, uint64_t handled,
                      int optional, char *msg, size_t cap)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (optional && (errno == ENOENT || errno == ENOTDIR || errno == EACCES ||
                         errno == ELOOP || errno == ENAMETOOLONG))
            return 0;
        return fail(msg, cap, errno, "%s", path);
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode))
        access &= LL_FILE_RIGHTS;
    access &= handled;
    int r = 0;
    if (access) {
        struct ll_path_beneath_attr attr = {.allowed_access = access, .parent_fd = fd};
        if (syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &attr, 0) < 0)
            r = fail(msg, cap, errno, "landlock_add_rule %s", path);
    }
    close(fd);
    return r;
}

/* See the call in landlock(). Best effort: an fd that cannot be granted is simply not. */
static void allow_inherited(int ruleset, int fd, uint64_t handled)
{
    struct stat st;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fstat(fd, &st) < 0)
        return;
    int tty = S_ISCHR(st.st_mode) && isatty(fd);
    if (!S_ISREG(st.st_mode) && !tty)
        return; /* pipes and sockets are not path-checked anyway */
    uint64_t acc = tty ? LL_FS_IOCTL_DEV : 0;
    if ((fl & O_ACCMODE) != O_WRONLY)
        acc |= LL_FS_READ_FILE;
    if ((fl & O_ACCMODE) != O_RDONLY)
        acc |= LL_FS_WRITE_FILE | LL_FS_TRUNCATE;
    char link[32];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int pfd = open(link, O_PATH | O_CLOEXEC);
    if (pfd < 0)
        return;
    struct ll_path_beneath_attr attr = {.allowed_access = acc & handled, .parent_fd = pfd};
    if (attr.allowed_access)
        (void)syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &attr, 0);
    close(pfd);
}

static int landlock(const struct sb_config *c, int abi, const struct paths *roots, char *msg,
                    size_t cap)
{
    struct ll_ruleset_attr attr = {.handled_access_fs = handled_fs(abi)};
    size_t size = offsetof(struct ll_ruleset_attr, handled_access_net);
    if (abi >= 4) {
        size = offsetof(struct ll_ruleset_attr, scoped);
        if (!c->network)
            attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
    }
    if (abi >= 6) {
        size = sizeof attr;
        attr.scoped = LL_SCOPE_SIGNAL | (c->network ? 0 : LL_SCOPE_ABSTRACT_UNIX_SOCKET);
    }
    uint64_t h = attr.handled_access_fs;
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (rs < 0)
        return fail(msg, cap, errno, "landlock_create_ruleset");

    int r = allow_path(rs, "/", R_READ | (c->strict_exec ? 0 : LL_FS_EXECUTE), h, 0, msg, cap);
    if (!r && c->strict_exec) {
        for (int i = 0; !r && SYSTEM_EXEC_DIRS[i]; i++)
            r = allow_path(rs, SYSTEM_EXEC_DIRS[i], R_READ | LL_FS_EXECUTE, h, 1, msg, cap);
        for (int i = 0; !r && i < c->exec_dirs.n; i++)
            r = allow_path(rs, c->exec_dirs.v[i], R_READ | LL_FS_EXECUTE, h, 1, msg, cap);
    }
    for (int i = 0; !r && DEVICES[i]; i++)
        r = allow_path(rs, DEVICES[i], R_DEVICE, h, 1, msg, cap);
    /* What the spawn was given on 0-2 (a terminal, a regular file), reopenable by path with
     * the access it already has through that descriptor: /dev/stdout, /dev/tty, `>/dev/stderr`
     * work even when the file lies outside the writable roots. The rule names that very inode
     * (opened through the descriptor's /proc link, so even a deleted file works). */
    for (int fd = 0; !r && fd <= 2; fd++)
        allow_inherited(rs, fd, h);
    for (int i = 0; !r && i < roots->n; i++)
        r = allow_path(rs, roots->v[i], R_READ | R_WRITE, h, 1, msg, cap);
    if (!r && abi >= 4 && !c->network && c->proxy_port > 0) { /* the proxy: the one way out */
        struct ll_net_port_attr port = {.allowed_access = LL_NET_CONNECT_TCP,
                                        .port = (uint64_t)c->proxy_port};
        if (syscall(SYS_landlock_add_rule, rs, LL_RULE_NET_PORT, &port, 0) < 0)
            r = fail(msg, cap, errno, "landlock_add_rule (proxy port %d)", c->proxy_port);
    }
    if (!r && syscall(SYS_landlock_restrict_self, rs, 0) < 0)
        r = fail(msg, cap, errno, "landlock_restrict_self");
    close(rs);
    return r;
}

/* -- capabilities ---------------------------------------------------------------------------- */

static int drop_capabilities(char *msg, size_t cap)
{
    int bounding_failed = 0;
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); /* EINVAL before Linux 4.3 */
    for (int c = 0; c < 64; c++) {
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
            if (errno == EINVAL)
                break; /* past the last capability */
            bounding_failed = errno;
            break;
        }
    }
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data) < 0)
        return fail(msg, cap, errno, "cannot drop capabilities (capset)");
    /* Without CAP_SETPCAP the bounding set stays; harmless unless we are uid 0, whose execs
     * would get it back. */
    if (bounding_failed && geteuid() == 0)
        return fail(msg, cap, bounding_failed, "cannot empty the capability bounding set");
    return 0;
}

/* -- seccomp --------------------------------------------------------------------------------- */

#define STMT(code, k) ((struct sock_filter)BPF_STMT(code, k))
#define JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP(code, k, jt, jf))
#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((e)&SECCOMP_RET_DATA))

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif

/* network: 1 no restriction; 0 socket() for AF_UNIX only, or (inet) also AF_INET/AF_INET6
 * (proxy mode: the network namespace holds nothing but loopback). */
static int seccomp_filter(int network, int inet, int strict_exec, char *msg, size_t cap)
{
#ifndef SB_AUDIT_ARCH
    (void)network;
    (void)inet;
    (void)strict_exec;
    return fail(msg, cap, ENOSYS, "no seccomp filter for this CPU architecture");
#else
    struct sock_filter f[64];
    int n = 0;
    f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SB_AUDIT_ARCH, 1, 0);
    f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS); /* i386, arm32, … */
    f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#ifdef SB_X32_BIT
    f[n++] = JUMP(BPF_JMP | BPF_JGE | BPF_K, SB_X32_BIT, 0, 1);
    f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS); /* x32 */
#endif
    /* io_uring performs socket(), connect(), openat() … without passing through this filter. */
    static const int uring[] = {__NR_io_uring_setup, __NR_io_uring_enter,
                                __NR_io_uring_register};
    for (size_t i = 0; i < sizeof uring / sizeof uring[0]; i++) {
        f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)uring[i], 0, 1);
        f[n++] = STMT(BPF_RET | BPF_K, RET_ERRNO(ENOSYS));
    }
    /* ioctl(fd, TIOCSTI/TIOCLINUX): typing into the terminal, i.e. into the user's shell once
     * the session ends. The command is an unsigned int: compare the low word only. */
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, 5);
    f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, 2, 0);
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX, 1, 0);
    f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[n++] = STMT(BPF_RET | BPF_K, RET_ERRNO(EPERM));
    /* Another process's memory or registers: a child rewriting an exec the gate approved, or
     * the stand-in's request before it is sent. */
    static const int tracing[] = {__NR_ptrace, __NR_process_vm_writev, __NR_process_vm_readv};
    for (size_t i = 0; i < sizeof tracing / sizeof tracing[0]; i++) {
        f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)tracing[i], 0, 1);
        f[n++] = STMT(BPF_RET | BPF_K, RET_ERRNO(EPERM));
    }
    if (strict_exec) {
        /* vm.memfd_noexec=2 for this process tree: Landlock does not see a memfd (it has no
         * path), so an executable one would run bytes written from anywhere. Only memfds
         * sealed non-executable (MFD_NOEXEC_SEAL, not MFD_EXEC) may be created. */
        f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 4);
        f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1));
        f[n++] = STMT(BPF_ALU | BPF_AND | BPF_K, MFD_NOEXEC_SEAL | MFD_EXEC);
        f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, MFD_NOEXEC_SEAL, 1, 0);
        f[n++] = STMT(BPF_RET | BPF_K, RET_ERRNO(EPERM));
        f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    }
    if (!network) {
        /* socket()/socketpair() for AF_UNIX only (the domain is an int: low word); proxy
         * mode adds AF_INET and AF_INET6. */
        static const int sock[] = {__NR_socket, __NR_socketpair};
        for (size_t i = 0; i < sizeof sock / sizeof sock[0]; i++) {
            f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)sock[i], 0, inet ? 6 : 4);
            f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0));
            if (inet) {
                f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 2, 0);
                f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 1, 0);
            }
            f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 1);
            f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
            f[n++] = STMT(BPF_RET | BPF_K, RET_ERRNO(EPERM));
        }
    }
    f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);

    struct sock_fprog prog = {.len = (unsigned short)n, .filter = f};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0)
        return 0;
    if (errno == ENOSYS && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0)
        return 0;
    return fail(msg, cap, errno, "cannot install the seccomp filter");
#endif
}

/* -- apply ----------------------------------------------------------------------------------- */

int sb_apply(const struct sb_config *c, const char *cwd, char *msg, size_t cap)
{
    if (c->mode == SB_OFF) {
        if (chdir(cwd) < 0)
            return -errno;
        return 0;
    }
    int abi = sb_landlock_abi();
    if (abi < 0)
        return fail(msg, cap, -abi, "Landlock is not available in this kernel");
    if (abi < SB_MIN_LANDLOCK_ABI)
        return fail(msg, cap, ENOSYS,
                    "Landlock ABI %d is too old (need %d, Linux 6.2, to control truncation)", abi,
                    SB_MIN_LANDLOCK_ABI);

    struct paths roots = {0}, carve = {0}, pinned = {0};
    int r = collect(c, &roots, &carve);
    if (r < 0) {
        r = fail(msg, cap, -r, "collecting the writable roots");
        goto out;
    }
    /* A private mount namespace where all but the writable roots is read-only. Required for
     * carve-outs, and for uid 0 (whose chmod/chown/utimes Landlock would not stop anywhere);
     * otherwise best effort: without it an unprivileged user keeps control of the metadata of
     * their own files outside the roots (docs/sandbox.md). */
    const char *how = NULL;
    int need = carve.n > 0 || c->hide.n > 0 || c->shadows || geteuid() == 0;
    char nsmsg[256] = "";
    r = enter_mount_ns(&how, nsmsg, sizeof nsmsg);
    if (r < 0 && need) {
        snprintf(msg, cap, "%s", nsmsg);
        goto out;
    }
    if (r == 0) {
        if ((r = readonly_tree(roots.v, roots.n, msg, cap)) < 0)
            goto out;
        /* Before the carve-outs are mounted (a pin binds what is below it). */
        for (int i = 0; i < roots.n && r == 0; i++)
            r = pin_folders(roots.v[i], 1, &roots, &pinned, msg, cap);
        for (int i = 0; i < carve.n && r == 0; i++)
            r = pin_folders(carve.v[i], 0, &roots, &pinned, msg, cap);
        for (int i = 0; i < c->hide.n && r == 0; i++)
            r = pin_folders(c->hide.v[i], 0, &roots, &pinned, msg, cap);
        if (r < 0)
            goto out;
        for (int i = 0; i < carve.n; i++)
            if ((r = bind_readonly(carve.v[i], msg, cap)) < 0)
                goto out;
        /* After the read-only pass (each stand-in is made read-only itself), before hiding. */
        if (c->shadows && (r = shadow_programs(c->shadows, c->uncovered, msg, cap)) < 0)
            goto out;
        /* Last, so a hidden folder inside a carve-out is covered too. */
        for (int i = 0; i < c->hide.n; i++)
            if ((r = hide_dir(c->hide.v[i], msg, cap)) < 0)
                goto out;
    }
    /* After the mounts, so a cwd inside a carve-out resolves to the read-only mount. */
    if (chdir(cwd) < 0) {
        r = -errno;
        snprintf(msg, cap, "chdir %s: %s", cwd, strerror(errno));
        goto out;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        r = fail(msg, cap, errno, "PR_SET_NO_NEW_PRIVS");
        goto out;
    }
    if ((r = landlock(c, abi, &roots, msg, cap)) < 0)
        goto out;
    if ((r = drop_capabilities(msg, cap)) < 0)
        goto out;
    r = seccomp_filter(c->network, c->proxy_port > 0, c->strict_exec, msg, cap);
out:
    paths_free(&roots);
    paths_free(&carve);
    paths_free(&pinned);
    return r;
}

/* -- probe ----------------------------------------------------------------------------------- */

typedef int (*trial_fn)(const struct sb_config *c, char *msg, size_t cap);

/* Run fn in a throwaway child; 0 if it succeeded, else -1 with its message in msg. */
static int trial(trial_fn fn, const struct sb_config *c, char *msg, size_t cap)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        snprintf(msg, cap, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(msg, cap, "fork: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        char m[512] = "";
        int r = fn(c, m, sizeof m);
        if (r < 0) {
            if (!m[0])
                snprintf(m, sizeof m, "%s", strerror(-r));
            ssize_t k = write(p[1], m, strlen(m));
            (void)k;
            _exit(1);
        }
        ssize_t k = write(p[1], m, strlen(m)); /* an informative note on success */
        (void)k;
        _exit(0);
    }
    close(p[1]);
    size_t got = 0;
    for (;;) {
        ssize_t k = read(p[0], msg + got, cap - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
        if (got >= cap - 1)
            break;
    }
    msg[got] = '\0';
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    if (!got)
        snprintf(msg, cap, "the trial child %s %d", WIFSIGNALED(st) ? "was killed by signal" : "exited",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    return -1;
}

static int try_seccomp(const struct sb_config *c, char *msg, size_t cap)
{
    (void)c;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail(msg, cap, errno, "PR_SET_NO_NEW_PRIVS");
    int r = seccomp_filter(0, 0, 0, msg, cap);
    if (r < 0)
        return r;
    /* The filter must really work: an inet socket is refused, a Unix one is not. */
    if (socket(AF_INET, SOCK_STREAM, 0) >= 0 || errno != EPERM)
        return fail(msg, cap, 0, "the seccomp filter did not refuse an AF_INET socket");
    if (socket(AF_UNIX, SOCK_STREAM, 0) < 0)
        return fail(msg, cap, errno, "the seccomp filter refused an AF_UNIX socket");
    return 0;
}

static int try_userns(const struct sb_config *c, char *msg, size_t cap)
{
    (void)c;
    if (unshare(CLONE_NEWUSER) < 0)
        return fail(msg, cap, errno, "unshare(CLONE_NEWUSER)");
    return 0;
}

static int try_mountns(const struct sb_config *c, char *msg, size_t cap)
{
    (void)c;
    const char *how = "";
    int r = enter_mount_ns(&how, msg, cap);
    if (r < 0)
        return r;
    if ((r = readonly_tree(NULL, 0, msg, cap)) < 0)
        return r;
    if ((r = bind_readonly("/dev/null", msg, cap)) < 0)
        return r;
    snprintf(msg, cap, "%s", how);
    return 0;
}

static int try_apply(const struct sb_config *c, char *msg, size_t cap)
{
    return sb_apply(c, "/", msg, cap);
}

static void print_value(const char *key, const char *value)
{
    printf("%s=", key);
    for (const char *p = value; *p; p++)
        putchar(*p == '\n' ? ' ' : *p);
    putchar('\n');
}

int sb_probe(const struct sb_config *c)
{
    char msg[512];
    int abi = sb_landlock_abi();
    printf("landlock_abi=%d\n", abi > 0 ? abi : 0);
    if (abi < 0)
        print_value("landlock_error", strerror(-abi));
#ifdef SB_ARCH_NAME
    printf("seccomp_arch=%s\n", SB_ARCH_NAME);
#else
    printf("seccomp_arch=unsupported\n");
#endif
    int ok = trial(try_seccomp, c, msg, sizeof msg) == 0;
    printf("seccomp=%d\n", ok);
    if (!ok)
        print_value("seccomp_error", msg);
    ok = trial(try_userns, c, msg, sizeof msg) == 0;
    printf("user_namespaces=%d\n", ok);
    if (!ok)
        print_value("user_namespaces_error", msg);
    if (trial(try_mountns, c, msg, sizeof msg) == 0) {
        print_value("mount_namespace", msg);
    } else {
        printf("mount_namespace=none\n");
        print_value("mount_namespace_error", msg);
    }
    if (c->mode != SB_OFF) {
        if (trial(try_apply, c, msg, sizeof msg) == 0)
            printf("trial=ok\n");
        else
            print_value("trial_error", msg);
    }
    fflush(stdout);
    return 0;
}
