/* The native front of `execgate run` (docs/protocol.md §8, docs/architecture.md "Start-up"),
 * eg_front() in front.h: the installed `execgate` command (entry.c) and `execgate-run PYTHON
 * [RUN ARGUMENTS...]` (run_main.c, which `python -m execgate run` execs) run it.
 *
 * It opens the session the slow path (the Python `execgate run`) would open, from the
 * start-up plan that slow path wrote for this front, the same user, working directory and options, once
 * every input the plan names is still what the slow path saw: the native front goes first, the
 * Python server catches up. Anything else goes to the slow path (the caller's Python command
 * line with `run ARGUMENTS…`, unchanged): options this front does not handle,
 * EXECGATE_FAST_START=0, a plan that is missing, stale, unreadable, not the user's own 0600
 * regular file, a log that cannot take the first record, and a first
 * program the snapshot says must ask (exactly the interposer's check, gate.c).
 *
 * The session: a folder as gate/session.py's make_session_dir makes it (named after this
 * process, so a killed front's folder is swept by the next server), the gate socket (listening,
 * so execs wait in its backlog until the server is up), the claim socket, the tokens, the
 * snapshot (file and sealed memfd), then
 *   S  the Python server in adopt mode (execgate/adopt.py): it inherits the listening socket, the
 *      memfd, the control channel and the plan; it loads config and policy as the slow path
 *      does and ends the session if what it computes differs from the plan;
 *   the first exec's decision record, which this front appends to the hash-chained log itself
 *      (chain.c) while S starts: a log that cannot take it leaves the command to the slow path;
 *   L  the session launcher with `--status-fd`, to which this front writes the first `spawn`
 *      (the command, flags main,last, stdio 0/1/2) before handing the control channel to S.
 * When L has exited (the command and everything it left are gone), the front stops S, removes
 * the folder and exits as the command did.
 *
 * Single-threaded; not a library: errors before anything started fall back to the slow path.
 */
#include "front.h"
#include "chain.h"
#include "common.h"
#include "gate.h"
#include "tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define PLAN_MAX ((size_t)64 << 20)
#define SNAP_FD_LOWEST 100 /* as gate/snapshot.py's SealedSnapshot: out of the way */
#define BACKLOG 4096
#define MAIN_SPAWN_ID 1 /* the launcher's first spawn; the server numbers its own from 2 */
#define MAX_LIST 4096
/* The plan's first line: its version, which is the front's and its server's (execgate/adopt.py)
 * (gate/runplan.py's MAGIC; part of the plan's name, so two versions never share a plan). */
#define PLAN_MAGIC "EGPLAN 2"

/* Python's bootstrap for S: sys.path from the plan, then the adopt module (execgate/adopt.py). */
static const char BOOT[] =
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "sys.path[:0] = sys.argv[2:2 + n]\n"
    "del sys.argv[1:2 + n]\n"
    "from execgate.adopt import main\n"
    "main()\n";

static const char *const GATE_VARIABLES[] = {
    "EXECGATE_SOCKET", "EXECGATE_TOKEN",    "EXECGATE_WRAPPER",
    "EXEC_WRAPPER",    "BASH_EXEC_WRAPPER", "EXECGATE_SNAPSHOT",
};

/* -- the slow path -------------------------------------------------------------------------- */

/* This front's own program (/proc/self/exe): a plan names the front it is for, so one
 * installation never follows the plan another one's slow path wrote ("" when unknown: then
 * no plan is followed, and the slow path is told nothing). */
static char g_self[PATH_MAX];
static char *const *g_slow; /* the slow path's command, before `run` */
static int g_nslow;
static char **g_run_args; /* the words after `execgate run` */
static int g_run_argc;

/* Hand the command line to the Python `execgate run` (nothing of a session exists yet). */
static void slow_path(void) __attribute__((noreturn));
static void slow_path(void)
{
    char **argv = calloc((size_t)g_nslow + (size_t)g_run_argc + 2, sizeof *argv);
    if (!argv)
        _exit(70);
    int n = 0;
    for (int i = 0; i < g_nslow; i++)
        argv[n++] = g_slow[i];
    argv[n++] = "run";
    for (int i = 0; i < g_run_argc; i++)
        argv[n++] = g_run_args[i];
    argv[n] = NULL;
    /* tells that `execgate` not to come back here (it removes the variable at once), and for
     * which front to write its plan (gate/runplan.py) */
    setenv("EXECGATE_FRONT_DECLINED", g_self[0] ? g_self : "1", 1);
    execv(argv[0], argv);
    fprintf(stderr, "execgate: error: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(70);
}

/* -- the plan ------------------------------------------------------------------------------- */

struct plan {
    char *python, *interposer, *wrapper, *launcher, *sessions;
    int for_this_front; /* its `front` line names g_self */
    char *syspath[MAX_LIST];
    int nsyspath;
    char *launch_opts[MAX_LIST];
    int nlaunch_opts;
    /* what each launch option is: the word itself, or a placeholder filled in per session */
    enum { LAUNCH_WORD, LAUNCH_SESSION, LAUNCH_CARVEOUTS } launch_kind[MAX_LIST];
    char *standins[MAX_LIST]; /* a sandboxed session's stand-ins cover these, in order */
    int nstandins;
    unsigned char *snap;
    size_t snap_len;
    /* the server's lines: the decision log (NULL: off) and the records' sandbox text */
    char *log, *sandbox;
    long long log_max_bytes, log_keep;
    int has_log_line;
    int ended;
};

static int unhex(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode a %XX-escaped field in place; NULL when malformed. */
static char *decode(char *s)
{
    if (!s)
        return NULL;
    char *o = s;
    for (char *i = s; *i; i++) {
        if (*i != '%') {
            *o++ = *i;
            continue;
        }
        int a = unhex(i[1]), b = a < 0 ? -1 : unhex(i[2]);
        if (b < 0)
            return NULL;
        *o++ = (char)(a << 4 | b);
        i += 2;
    }
    *o = '\0';
    return s;
}

static int parse_ull(const char *s, unsigned long long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return errno || *end ? -1 : 0;
}

static int parse_ll(const char *s, long long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return errno || *end ? -1 : 0;
}

static char *boot_id(void)
{
    static char id[64];
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    ssize_t n = read(fd, id, sizeof id - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    while (n > 0 && (id[n - 1] == '\n' || id[n - 1] == ' '))
        n--;
    id[n] = '\0';
    return id;
}

/* Does the file at path still have the identity the slow path saw? (lstat: a symlink is an
 * input of its own; its target is listed too.) */
static int same_file(const char *path, char **f)
{
    unsigned long long dev, ino;
    long long size, mtime, ctime;
    if (parse_ull(f[0], &dev) || parse_ull(f[1], &ino) || parse_ll(f[2], &size) ||
        parse_ll(f[3], &mtime) || parse_ll(f[4], &ctime))
        return 0;
    struct stat st;
    if (lstat(path, &st) < 0)
        return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino &&
           (long long)st.st_size == size &&
           (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec == mtime &&
           (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec == ctime;
}

/* Split a line into at most max space-separated fields; their count. */
static int split(char *line, char **f, int max)
{
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line, " ", &save); t && n < max;
         t = strtok_r(NULL, " ", &save))
        f[n++] = t;
    return n;
}

/* A sandboxed plan's lines (gate/runplan.py): `launch-session NAME` (the launcher option
 * <session folder>/NAME; `.`: the folder), `launch-carveouts` (the known carve-outs, found
 * at start), `standin PROGRAM` and `dir PATH DEV INO` (lstat: a folder of this identity).
 * 1 taken or holds, 0 malformed or stale, -1 not one of them. */
static int sandbox_line(struct plan *p, const char *kind, char **f, int n)
{
    int session = !strcmp(kind, "launch-session"), carve = !strcmp(kind, "launch-carveouts");
    if (session || carve) {
        char *value = session && n == 2 ? decode(f[1]) : NULL;
        if ((session && (!value || !*value || strchr(value, '/') || !strcmp(value, ".."))) ||
            (carve && n != 1) || p->nlaunch_opts >= MAX_LIST)
            return 0;
        p->launch_kind[p->nlaunch_opts] = session ? LAUNCH_SESSION : LAUNCH_CARVEOUTS;
        p->launch_opts[p->nlaunch_opts++] = value;
        return 1;
    }
    if (!strcmp(kind, "standin")) {
        char *value = n == 2 ? decode(f[1]) : NULL;
        if (!value || value[0] != '/' || p->nstandins >= MAX_LIST)
            return 0;
        p->standins[p->nstandins++] = value;
        return 1;
    }
    if (!strcmp(kind, "dir") && n == 4) { /* a folder whose identity matters, not its times */
        const char *path = decode(f[1]);
        unsigned long long dev, ino;
        struct stat st;
        return path && !parse_ull(f[2], &dev) && !parse_ull(f[3], &ino) &&
               lstat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
               (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    }
    return -1;
}

/* `server log PATH MAX_BYTES KEEP`, `server nolog`, `server sandbox TEXT`; 1 or 0. */
static int server_line(struct plan *p, char **f, int n)
{
    if (n == 1 && !strcmp(f[0], "nolog") && !p->has_log_line) {
        p->has_log_line = 1;
        return 1;
    }
    if (n == 4 && !strcmp(f[0], "log") && !p->has_log_line) {
        p->has_log_line = 1;
        p->log = decode(f[1]);
        return p->log && p->log[0] == '/' && !parse_ll(f[2], &p->log_max_bytes) &&
               !parse_ll(f[3], &p->log_keep) && p->log_keep >= 0 && p->log_keep < 1000000;
    }
    if (n == 2 && !strcmp(f[0], "sandbox") && !p->sandbox)
        return (p->sandbox = decode(f[1])) != NULL;
    return 0;
}

/* Check one plan line against what is true now; 1 holds, 0 stale or malformed. */
static int check_line(struct plan *p, char *line, const char *cwd, char **opts, int nopts,
                      int *opt_seen)
{
    char *f[8];
    int n = split(line, f, 8);
    if (n == 0)
        return 0;
    const char *kind = f[0];
    if (!strcmp(kind, "server")) /* the first record's: where the log is, its sandbox text */
        return server_line(p, f + 1, n - 1);
    if (!strcmp(kind, "file") && n == 7) {
        const char *path = decode(f[1]);
        return path && same_file(path, f + 2);
    }
    if (!strcmp(kind, "absent") && n == 2) {
        const char *path = decode(f[1]);
        struct stat st;
        return path && lstat(path, &st) < 0 && (errno == ENOENT || errno == ENOTDIR);
    }
    if (!strcmp(kind, "env") && n == 3) {
        const char *name = decode(f[1]), *value = decode(f[2]), *now = name ? getenv(name) : NULL;
        return value && now && !strcmp(now, value);
    }
    if (!strcmp(kind, "noenv") && n == 2) {
        const char *name = decode(f[1]);
        return name && !getenv(name);
    }
    if (!strcmp(kind, "opt") && n == 2) {
        const char *word = decode(f[1]);
        return word && *opt_seen < nopts && !strcmp(opts[(*opt_seen)++], word);
    }
    if (!strcmp(kind, "boot") && n == 2) {
        const char *id = boot_id();
        return id && !strcmp(id, f[1]);
    }
    if (!strcmp(kind, "uid") && n == 3) {
        long long uid, gid;
        return !parse_ll(f[1], &uid) && !parse_ll(f[2], &gid) && uid == (long long)getuid() &&
               uid == (long long)geteuid() && gid == (long long)getgid() &&
               gid == (long long)getegid();
    }
    if (!strcmp(kind, "cwd") && n == 2) {
        const char *path = decode(f[1]);
        return path && !strcmp(path, cwd);
    }
    if (!strcmp(kind, "front") && n == 2) {
        const char *path = decode(f[1]);
        return path && g_self[0] && !strcmp(path, g_self) && (p->for_this_front = 1);
    }
    int sandboxed = sandbox_line(p, kind, f, n);
    if (sandboxed >= 0)
        return sandboxed;
    char *value = n == 2 ? decode(f[1]) : NULL;
    if (!value && n == 2)
        return 0;
    if (!strcmp(kind, "python") && value)
        p->python = value;
    else if (!strcmp(kind, "interposer") && value)
        p->interposer = value;
    else if (!strcmp(kind, "wrapper") && value)
        p->wrapper = value;
    else if (!strcmp(kind, "launcher") && value)
        p->launcher = value;
    else if (!strcmp(kind, "sessions") && value)
        p->sessions = value;
    else if (!strcmp(kind, "argv0"))
        ; /* the server's (execgate/adopt.py) */
    else if (!strcmp(kind, "syspath") && value && p->nsyspath < MAX_LIST)
        p->syspath[p->nsyspath++] = value;
    else if (!strcmp(kind, "launch") && value && p->nlaunch_opts < MAX_LIST) {
        p->launch_kind[p->nlaunch_opts] = LAUNCH_WORD;
        p->launch_opts[p->nlaunch_opts++] = value;
    } else if (!strcmp(kind, "snapshot") && n == 2) {
        size_t len = strlen(f[1]);
        if (len % 2)
            return 0;
        p->snap = (unsigned char *)f[1];
        for (size_t i = 0; i < len / 2; i++) {
            int a = unhex(f[1][2 * i]), b = unhex(f[1][2 * i + 1]);
            if (a < 0 || b < 0)
                return 0;
            p->snap[i] = (unsigned char)(a << 4 | b);
        }
        p->snap_len = len / 2;
    } else if (!strcmp(kind, "end") && n == 1)
        p->ended = 1;
    else
        return 0; /* a line this front does not know: not its plan to follow */
    return 1;
}

/* The plan's file name: FNV-1a 64 of "MAGIC\0UID\0FRONT\0CWD\0OPTION\0…" in hex
 * (gate/runplan.py's plan_key; an index only: the plan's own lines are what is checked). */
static void plan_name(char out[17], const char *cwd, char **opts, int nopts)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    char uid[24];
    size_t ulen = eg_fmt_long(uid, (long long)getuid());
    const char *parts[MAX_LIST + 4];
    size_t lens[MAX_LIST + 4];
    int np = 0;
    parts[np] = PLAN_MAGIC, lens[np++] = sizeof PLAN_MAGIC - 1;
    parts[np] = uid, lens[np++] = ulen;
    parts[np] = g_self, lens[np++] = strlen(g_self);
    parts[np] = cwd, lens[np++] = strlen(cwd);
    for (int i = 0; i < nopts && np < MAX_LIST + 4; i++)
        parts[np] = opts[i], lens[np++] = strlen(opts[i]);
    for (int k = 0; k < np; k++) {
        for (size_t i = 0; i < lens[k]; i++) {
            h ^= (unsigned char)parts[k][i];
            h *= 0x100000001b3ULL;
        }
        h *= 0x100000001b3ULL; /* the NUL after each part */
    }
    static const char hexd[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++)
        out[i] = hexd[(h >> (60 - 4 * i)) & 0xf];
    out[16] = '\0';
}

/* Read and check the plan; its fd (kept for S) or -1 (then: the slow path). */
static char g_plan_path[PATH_MAX];

static int load_plan(struct plan *p, const char *cwd, char **opts, int nopts)
{
    const char *home = getenv("EXECGATE_HOME"), *user = getenv("HOME");
    char *path = g_plan_path, name[17];
    plan_name(name, cwd, opts, nopts);
    size_t cap = sizeof g_plan_path;
    int len = home && *home ? snprintf(path, cap, "%s/cache/run-plans/%s", home, name)
              : user && *user ? snprintf(path, cap, "%s/.execgate/cache/run-plans/%s", user, name)
                              : -1;
    if (len < 0 || (size_t)len >= sizeof g_plan_path)
        return -1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    /* the user's own, written by the slow path (files.write_atomically, 0600) */
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 07777) != 0600 || st.st_nlink != 1 || st.st_size <= 0 ||
        (size_t)st.st_size > PLAN_MAX) {
        close(fd);
        return -1;
    }
    char *text = malloc((size_t)st.st_size + 1);
    if (!text || eg_read_all(fd, text, (size_t)st.st_size) < 0) {
        close(fd);
        return -1;
    }
    text[st.st_size] = '\0';
    if (strlen(text) != (size_t)st.st_size || strncmp(text, PLAN_MAGIC "\n", 9) != 0) {
        close(fd);
        return -1;
    }
    int opt_seen = 0;
    char *save = NULL;
    for (char *line = strtok_r(text + 9, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (p->ended || !check_line(p, line, cwd, opts, nopts, &opt_seen)) {
            close(fd);
            return -1;
        }
    }
    if (!p->ended || opt_seen != nopts || !p->for_this_front || !p->python || !p->interposer ||
        !p->wrapper ||
        !p->launcher || !p->sessions || !p->snap || p->nsyspath == 0 || !p->has_log_line ||
        !p->sandbox) {
        close(fd);
        return -1;
    }
    return fd;
}

/* -- the first program ---------------------------------------------------------------------- */

/* os.path.normpath of an absolute path, in place (two leading slashes stay two, as POSIX
 * lets them mean something else and Python keeps them). */
static void normpath(char *path)
{
    char *out = path, *in = path;
    size_t len = 0;
    if (path[0] == '/' && path[1] == '/' && path[2] != '/') {
        out = path + 1; /* the first slash stays; the rest is normalised after it */
        in = path + 1;
    }
    while (*in) {
        while (*in == '/')
            in++;
        char *end = strchrnul(in, '/');
        size_t n = (size_t)(end - in);
        if (n == 0)
            break;
        if (n == 1 && in[0] == '.') {
        } else if (n == 2 && in[0] == '.' && in[1] == '.') {
            while (len > 0 && out[len - 1] != '/')
                len--;
            if (len > 0)
                len--;
        } else {
            out[len++] = '/';
            memmove(out + len, in, n);
            len += n;
        }
        in = end;
    }
    if (len == 0)
        out[len++] = '/';
    out[len] = '\0';
}

/* The program `execgate run` would start for name (gate/session.py's resolve_command): a name
 * with a slash is relative to cwd; else the first executable regular file on PATH. 0 or -1. */
static int resolve_command(const char *name, const char *cwd, char *out, size_t cap)
{
    if (strchr(name, '/')) {
        int n = name[0] == '/' ? snprintf(out, cap, "%s", name)
                               : snprintf(out, cap, "%s/%s", cwd, name);
        if (n < 0 || n >= (int)cap)
            return -1;
        normpath(out);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin";
    for (const char *dir = path;; dir++) {
        const char *end = strchrnul(dir, ':');
        int dlen = (int)(end - dir);
        const char *d = dlen ? dir : ".";
        if (!dlen)
            dlen = 1;
        if (snprintf(out, cap, "%s%s%.*s/%s", d[0] == '/' ? "" : cwd, d[0] == '/' ? "" : "/",
                     dlen, d, name) < (int)cap) {
            struct stat st;
            if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0) {
                normpath(out);
                return 0;
            }
        }
        if (!*end)
            return -1;
        dir = end;
    }
}

/* -- the session ---------------------------------------------------------------------------- */

static char g_dir[PATH_MAX]; /* the session folder, once made */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_session_dir(void)
{
    if (g_dir[0])
        nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A listening, close-on-exec Unix socket at dir/name, mode 0600; fd or -1. */
static int listen_at(const char *name, int backlog)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", g_dir, name) >=
        sizeof a.sun_path)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || chmod(a.sun_path, 0600) < 0 ||
        listen(fd, backlog) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int write_file(const char *name, const void *data, size_t len, mode_t mode)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    int r = eg_write_all(fd, data, len) < 0 || fchmod(fd, mode) < 0 ? -1 : 0;
    close(fd);
    return r;
}

/* "PID STARTTIME" of this process, as gate/session.py's _owner_of writes it. */
static int write_owner(void)
{
    unsigned long long start = 0;
    if (eg_read_stat(getpid(), NULL, &start) < 0)
        return -1;
    char line[64];
    int n = snprintf(line, sizeof line, "%d %llu\n", (int)getpid(), start);
    return write_file("owner", line, (size_t)n, 0600);
}

/* A fresh folder under the plan's session base (checked: our own 0700 folder). */
static int make_session_dir(const char *base)
{
    struct stat st;
    if (lstat(base, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 07777) != 0700)
        return -1;
    if ((size_t)snprintf(g_dir, sizeof g_dir, "%s/execgate-%d-XXXXXX", base, (int)getuid()) >=
        sizeof g_dir - 16) {
        g_dir[0] = '\0';
        return -1;
    }
    if (!mkdtemp(g_dir)) {
        g_dir[0] = '\0';
        return -1;
    }
    return write_owner();
}

/* Remove the session folders under base whose owner ("PID STARTTIME") is gone, as
 * gate/session.py's remove_stale_session_dirs does: a front or server killed with SIGKILL
 * leaves its folder to the next session. A folder naming no owner, or a live one, stays. */
static void sweep_stale_session_dirs(const char *base)
{
    char prefix[48];
    int plen = snprintf(prefix, sizeof prefix, "execgate-%d-", (int)getuid());
    DIR *d = opendir(base);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        char path[PATH_MAX + 64], owner[PATH_MAX + 80], line[64];
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        if (!strcmp(path, g_dir))
            continue;
        struct stat st;
        if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid())
            continue;
        snprintf(owner, sizeof owner, "%s/owner", path);
        int fd = open(owner, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, line, sizeof line - 1);
        close(fd);
        if (n <= 0)
            continue;
        line[n] = '\0';
        long long pid;
        unsigned long long start, now = 0;
        if (sscanf(line, "%lld %llu", &pid, &start) != 2 || pid <= 0)
            continue;
        if (eg_read_stat((pid_t)pid, NULL, &now) == 0 && now == start)
            continue; /* its owner is alive */
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

static int random_hex(char *out, size_t bytes)
{
    unsigned char raw[32];
    if (bytes > sizeof raw || getrandom(raw, bytes, 0) != (ssize_t)bytes)
        return -1;
    static const char hexd[] = "0123456789abcdef";
    for (size_t i = 0; i < bytes; i++) {
        out[2 * i] = hexd[raw[i] >> 4];
        out[2 * i + 1] = hexd[raw[i] & 15];
    }
    out[2 * bytes] = '\0';
    return 0;
}

/* The snapshot in a sealed memfd at the lowest descriptor >= SNAP_FD_LOWEST (protocol §6). */
static int sealed_snapshot(const struct plan *p)
{
    int fd = memfd_create("execgate-policy.snap", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (eg_write_all(fd, p->snap, p->snap_len) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0) {
        close(fd);
        return -1;
    }
    int high = fcntl(fd, F_DUPFD_CLOEXEC, SNAP_FD_LOWEST);
    close(fd);
    return high;
}

/* -- a sandboxed session ------------------------------------------------------------------- */

/* Whether the plan's launcher confines its `sandbox` spawns (`--sandbox MODE`, not off). */
static int plan_confines(const struct plan *p)
{
    for (int i = 0; i + 1 < p->nlaunch_opts; i++)
        if (p->launch_kind[i] == LAUNCH_WORD && !strcmp(p->launch_opts[i], "--sandbox"))
            return p->launch_kind[i + 1] != LAUNCH_WORD || strcmp(p->launch_opts[i + 1], "off");
    return 0;
}

/* The stand-ins of the plan's programs, as gate/standins.py makes them: standins/N, mode
 * 0555, `#!WRAPPER --shadow`, and their table standins.table (pairs of NUL-ended paths,
 * stand-in then program), 0444. The server checks each is ours and covers what it computes. */
static int make_standins(const struct plan *p)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/standins", g_dir);
    if (mkdir(path, 0700) < 0)
        return -1;
    size_t cap = 1, wlen = strlen(p->wrapper);
    for (int i = 0; i < p->nstandins; i++)
        cap += strlen(g_dir) + 32 + strlen(p->standins[i]);
    char *table = malloc(cap), *line = malloc(wlen + 16);
    int r = table && line ? 0 : -1;
    int llen = line ? snprintf(line, wlen + 16, "#!%s --shadow\n", p->wrapper) : 0;
    size_t len = 0;
    for (int i = 0; i < p->nstandins && r == 0; i++) {
        int n = snprintf(table + len, cap - len, "%s/standins/%d", g_dir, i);
        int fd = open(table + len, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0555);
        r = fd < 0 ? -1 : eg_write_all(fd, line, (size_t)llen) < 0 ? -1 : 0;
        if (fd >= 0)
            close(fd);
        len += (size_t)n + 1; /* its NUL, then the program's path and NUL */
        size_t plen = strlen(p->standins[i]) + 1;
        memcpy(table + len, p->standins[i], plen);
        len += plen;
    }
    if (r == 0)
        r = write_file("standins.table", table, len, 0444);
    free(table);
    free(line);
    return r;
}

/* The protected names (`--protect NAME`) that exist now in each writable root (`--writable
 * DIR`) by device and inode — the entry, then what it resolves to; each once, in that order —
 * as `--known-carveouts` wants them (sandbox/spec.py's existing_carveouts): looked at before
 * anything of the session runs. NULL when out of memory. */
static char *known_carveouts(const struct plan *p)
{
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    dev_t seen_dev[MAX_LIST];
    ino_t seen_ino[MAX_LIST];
    int nseen = 0;
    if (!out)
        return NULL;
    out[0] = '\0';
    for (int r = 0; r + 1 < p->nlaunch_opts; r++) {
        if (p->launch_kind[r] != LAUNCH_WORD || strcmp(p->launch_opts[r], "--writable"))
            continue;
        for (int k = 0; k + 1 < p->nlaunch_opts; k++) {
            if (p->launch_kind[k] != LAUNCH_WORD || strcmp(p->launch_opts[k], "--protect"))
                continue;
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", p->launch_opts[r + 1],
                         p->launch_opts[k + 1]) >= (int)sizeof path)
                continue;
            for (int follow = 0; follow < 2; follow++) {
                struct stat st;
                if ((follow ? stat(path, &st) : lstat(path, &st)) < 0)
                    continue;
                int known = 0;
                for (int i = 0; i < nseen && !known; i++)
                    known = seen_dev[i] == st.st_dev && seen_ino[i] == st.st_ino;
                if (known || nseen >= MAX_LIST)
                    continue;
                seen_dev[nseen] = st.st_dev, seen_ino[nseen++] = st.st_ino;
                if (len + 48 > cap) {
                    char *more = realloc(out, cap *= 2);
                    if (!more) {
                        free(out);
                        return NULL;
                    }
                    out = more;
                }
                len += (size_t)snprintf(out + len, cap - len, "%s%llu:%llu", len ? "," : "",
                                        (unsigned long long)st.st_dev,
                                        (unsigned long long)st.st_ino);
            }
        }
    }
    return out;
}

static char *joined(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

static int is_gate_variable(const char *entry)
{
    for (size_t i = 0; i < sizeof GATE_VARIABLES / sizeof *GATE_VARIABLES; i++) {
        size_t n = strlen(GATE_VARIABLES[i]);
        if (!strncmp(entry, GATE_VARIABLES[i], n) && entry[n] == '=')
            return 1;
    }
    return 0;
}

/* The command's environment, as gate/session.py's environment(): ours without the gate
 * variables (LD_PRELOAD in its place, the interposer first, once), then the gate's. */
static char **command_env(const char *const gate[6], const char *interposer)
{
    size_t n = 0;
    for (char **e = environ; *e; e++)
        n++;
    char **env = calloc(n + 8, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    char **preload = NULL;
    for (char **e = environ; *e; e++) {
        if (is_gate_variable(*e) || !strchr(*e, '='))
            continue;
        if (!strncmp(*e, "LD_PRELOAD=", 11)) {
            if (preload)
                continue;
            preload = &env[k];
        }
        env[k++] = *e;
    }
    for (int i = 0; i < 6; i++)
        if (gate[i]) /* (a sandboxed session's clients read the snapshot file) */
            env[k++] = (char *)gate[i];
    /* LD_PRELOAD: ours, then the user's others (spaces and colons separate them) */
    const char *old = preload ? *preload + 11 : "";
    size_t cap = 11 + strlen(interposer) + strlen(old) + 2;
    char *value = malloc(cap + 1);
    if (!value)
        return NULL;
    size_t len = (size_t)snprintf(value, cap, "LD_PRELOAD=%s", interposer);
    for (const char *t = old; *t;) {
        size_t tl = strcspn(t, ": ");
        if (tl && !(tl == strlen(interposer) && !strncmp(t, interposer, tl))) {
            value[len++] = ':';
            memcpy(value + len, t, tl);
            len += tl;
        }
        t += tl;
        if (*t)
            t++;
    }
    value[len] = '\0';
    if (preload)
        *preload = value;
    else
        env[k++] = value;
    env[k] = NULL;
    return env;
}

/* The first `spawn` (protocol §7): the command with flags main,last,execfd on our stdio,
 * executing progfd (the file the snapshot check judged; program only names it). */
static int send_first_spawn(int control, const char *program, int progfd, const char *cwd,
                            char **argv, char **env, int sandboxed)
{
    size_t need = 256 + strlen(program) + strlen(cwd);
    int argc = 0, envc = 0;
    for (char **a = argv; *a; a++, argc++)
        need += strlen(*a) + 1;
    for (char **e = env; *e; e++, envc++)
        need += strlen(*e) + 1;
    char *mem = malloc(need);
    if (!mem)
        return -1;
    struct eg_buf b;
    eg_buf_init(&b, mem, need);
    eg_put(&b, EG_TAG);
    eg_put(&b, "spawn");
    eg_put_long(&b, MAIN_SPAWN_ID);
    eg_put(&b, sandboxed ? "main,last,execfd,sandbox" : "main,last,execfd");
    eg_put_long(&b, -1);
    eg_put(&b, cwd);
    eg_put(&b, program);
    eg_put_long(&b, 3);
    for (int fd = 0; fd < 3; fd++)
        eg_put_long(&b, fd);
    eg_put_long(&b, argc);
    for (int i = 0; i < argc; i++)
        eg_put(&b, argv[i]);
    eg_put_long(&b, envc);
    for (int i = 0; i < envc; i++)
        eg_put(&b, env[i]);
    int fds[4] = {0, 1, 2, progfd};
    int r = eg_send_frame(control, &b, fds, 4);
    free(mem);
    return r;
}

/* In a child: keep exactly the descriptors in keep (clearing close-on-exec), default
 * signals, empty mask; die with the front. */
static void child_setup(const int *keep, int nkeep, int deathsig)
{
    prctl(PR_SET_PDEATHSIG, deathsig);
    for (int i = 0; i < nkeep; i++)
        fcntl(keep[i], F_SETFD, 0);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static void fd_arg(char *out, int fd) { out[eg_fmt_long(out, fd)] = '\0'; }

/* -- the first record ----------------------------------------------------------------------- */

/* Whether Python decodes this process's bytes (argv, the working directory) as UTF-8, as the
 * C record writer does: its filesystem encoding under a UTF-8 locale and (UTF-8 mode) under
 * the C/POSIX one. */
static int python_decodes_utf8(void)
{
    const char *names[] = {"LC_ALL", "LC_CTYPE", "LANG"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v)
            continue;
        return !strcmp(v, "C") || !strcmp(v, "POSIX") || strcasestr(v, "utf-8") ||
               strcasestr(v, "utf8");
    }
    return 1;
}

static int has_high_bytes(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80)
            return 1;
    return 0;
}

/* The first exec's decision record, appended to the plan's log before the command may run
 * (no program runs without its record; the server starts in parallel and does not write it).
 * 0, or -1 after saying nothing: the slow path, which says what is wrong with the log. */
static int write_first_record(const struct plan *p, pid_t server, const char *session,
                              const char *cwd, const char *program, char **cmd)
{
    if (!p->log)
        return 0; /* [log] enabled = false */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct eg_first_record r = {
        .time_us = (long long)now.tv_sec * 1000000 + (now.tv_nsec + 500) / 1000,
        .session = session,
        .cwd = cwd,
        .program = program,
        .sandbox = p->sandbox,
        .pid = server,
        .ppid = getpid(),
        .argv = cmd,
    };
    struct eg_str body = {0};
    eg_first_record_body(&body, &r);
    char why[PATH_MAX + 128];
    int ok = !body.failed &&
             eg_chain_append(p->log, p->log_max_bytes, (int)p->log_keep, body.p, body.len, why,
                             sizeof why) == 0;
    eg_str_free(&body);
    return ok ? 0 : -1;
}

/* -- main ----------------------------------------------------------------------------------- */

/* Die of sig as the command did, or exit with its code (as `execgate run` does). */
static void exit_like(int status) __attribute__((noreturn));
static void exit_like(int status)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        _exit(128 + sig);
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

void eg_front(char *const *slow, int nslow, int nrun, char **run)
{
    g_slow = slow;
    g_nslow = nslow;
    g_run_args = run;
    g_run_argc = nrun;
    ssize_t exe = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    g_self[exe > 0 && (size_t)exe < sizeof g_self - 1 ? exe : 0] = '\0';
    const char *fast = getenv("EXECGATE_FAST_START");
    if (fast && !strcmp(fast, "0"))
        slow_path();
    /* `execgate run [OPTION...] -- CMD...` or `execgate run CMD...`: the option words are
     * taken as they are (the plan names the ones its slow path could cover, word for word);
     * options without `--` after them go to the slow path (argparse decides where they end). */
    char **opts = g_run_args, **cmd = g_run_args;
    int nopts = 0, ncmd = g_run_argc;
    if (ncmd > 0 && cmd[0][0] == '-') {
        while (nopts < g_run_argc && strcmp(g_run_args[nopts], "--"))
            nopts++;
        if (nopts == g_run_argc)
            slow_path();
        cmd = g_run_args + nopts + 1;
        ncmd = g_run_argc - nopts - 1;
    }
    if (ncmd <= 0 || nopts > MAX_LIST)
        slow_path();

    static char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        slow_path();
    static struct plan plan;
    int plan_fd = load_plan(&plan, cwd, opts, nopts);
    if (plan_fd < 0)
        slow_path();
    static char program[PATH_MAX], real[PATH_MAX];
    if (resolve_command(cmd[0], cwd, program, sizeof program) < 0)
        slow_path(); /* "command not found" is the slow path's to say */
    int progfd = -1; /* what runs is this descriptor, the file judged (spawn flag execfd) */
    if (eg_snapshot_verdict(plan.snap, plan.snap_len, cwd, program, plan.wrapper, real,
                            sizeof real, &progfd) != 0 ||
        progfd < 0)
        slow_path(); /* it must ask (or cannot run): the server decides */
    const char *recorded = real[0] ? real : program;
    if (!python_decodes_utf8()) { /* the record's texts must decode as the server's would */
        int high = has_high_bytes(cwd) || has_high_bytes(recorded);
        for (int i = 0; i < ncmd && !high; i++)
            high = has_high_bytes(cmd[i]);
        if (high)
            slow_path();
    }

    /* The command's Ctrl-C and Ctrl-\ are its own; SIGTERM/SIGHUP end the session. */
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        slow_path();

    int confined = plan_confines(&plan);
    char *carveouts = NULL; /* a sandboxed session's, found before anything of it runs */
    char token[33], escalated[33], session_id[17];
    int gate = -1, claim = -1, snap_fd = -1, ctl[2] = {-1, -1}, status[2] = {-1, -1},
        done[2] = {-1, -1};
    if (make_session_dir(plan.sessions) < 0 || random_hex(token, 16) < 0 ||
        random_hex(escalated, 16) < 0 || random_hex(session_id, 8) < 0 ||
        (gate = listen_at("gate.sock", BACKLOG)) < 0 ||
        (claim = listen_at("claim.sock", SOMAXCONN)) < 0 ||
        write_file("policy.snap", plan.snap, plan.snap_len, 0444) < 0 ||
        (confined ? make_standins(&plan) < 0 || !(carveouts = known_carveouts(&plan))
                  : (snap_fd = sealed_snapshot(&plan)) < 0) ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0 ||
        pipe2(status, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) {
        remove_session_dir();
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        slow_path(); /* nothing has started: the slow path says what is wrong, if anything */
    }

    /* S first: its pid names the sealed snapshot (EXECGATE_SNAPSHOT=/proc/S/fd/N). */
    pid_t self = getpid();
    pid_t server = fork();
    if (server == 0) {
        int keep[] = {gate, snap_fd, ctl[0], plan_fd, done[1]};
        child_setup(keep, 5, SIGTERM);
        if (getppid() != self)
            _exit(1);
        char fds[5][24];
        for (int i = 0; i < 5; i++)
            fd_arg(fds[i], keep[i]);
        char nsys[24];
        fd_arg(nsys, plan.nsyspath);
        size_t n = 0, cap = (size_t)plan.nsyspath + (size_t)ncmd + 24;
        char **args = calloc(cap, sizeof *args);
        if (!args)
            _exit(1);
        args[n++] = plan.python;
        args[n++] = "-I";
        args[n++] = "-S";
        args[n++] = "-c";
        args[n++] = (char *)BOOT;
        args[n++] = nsys;
        for (int i = 0; i < plan.nsyspath; i++)
            args[n++] = plan.syspath[i];
        /* execgate/adopt.py's command line */
        args[n++] = fds[3];
        args[n++] = fds[0];
        args[n++] = fds[1];
        args[n++] = fds[2];
        args[n++] = fds[4];
        args[n++] = g_dir;
        args[n++] = token;
        args[n++] = escalated;
        args[n++] = session_id;
        args[n++] = program;
        args[n++] = real;
        args[n++] = cwd;
        args[n++] = "--";
        for (int i = 0; i < ncmd; i++)
            args[n++] = cmd[i];
        args[n] = NULL;
        execv(plan.python, args);
        _exit(127);
    }
    /* Nothing runs before its decision is recorded (the command could kill S at once): the
     * record is ours to write, now. A log that cannot take it leaves the command to the slow
     * path, which says why (nothing has started). */
    if (server < 0 || write_first_record(&plan, server, session_id, cwd, recorded, cmd) < 0) {
        if (server > 0) {
            kill(server, SIGKILL);
            while (waitpid(server, NULL, __WALL) < 0 && errno == EINTR)
                ;
        }
        remove_session_dir();
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGQUIT, SIG_DFL);
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
        slow_path();
    }

    /* L: the session launcher, on the plan's sandbox options, with our status pipe. */
    pid_t launcher = fork();
    if (launcher == 0) {
        int keep[] = {ctl[1], claim, status[1]};
        child_setup(keep, 3, SIGTERM);
        if (getppid() != self)
            _exit(1);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || chdir("/") < 0)
            _exit(1);
        char fds[3][24];
        for (int i = 0; i < 3; i++)
            fd_arg(fds[i], keep[i]);
        char **args = calloc((size_t)plan.nlaunch_opts + 10, sizeof *args);
        if (!args)
            _exit(1);
        size_t n = 0;
        args[n++] = plan.launcher;
        args[n++] = "--control";
        args[n++] = fds[0];
        args[n++] = "--claim-fd";
        args[n++] = fds[1];
        args[n++] = "--status-fd";
        args[n++] = fds[2];
        for (int i = 0; i < plan.nlaunch_opts; i++)
            args[n++] = plan.launch_kind[i] == LAUNCH_CARVEOUTS ? carveouts
                        : plan.launch_kind[i] == LAUNCH_SESSION
                            ? (!strcmp(plan.launch_opts[i], ".")
                                   ? g_dir
                                   : joined(g_dir, joined("/", plan.launch_opts[i])))
                            : plan.launch_opts[i];
        args[n] = NULL;
        execv(plan.launcher, args);
        _exit(127);
    }
    close(ctl[1]);
    close(claim);
    close(status[1]);
    close(done[1]);
    close(gate); /* S's alone: if S dies, every exec is denied ("the server is gone") */
    close(plan_fd);

    int main_status = -1, ending = 0;
    if (launcher > 0) {
        char snap_env[64];
        snprintf(snap_env, sizeof snap_env, "EXECGATE_SNAPSHOT=/proc/%d/fd/%d", (int)server,
                 snap_fd);
        char sock_path[PATH_MAX + 16];
        snprintf(sock_path, sizeof sock_path, "%s/gate.sock", g_dir);
        const char *gate_env[6] = {
            joined("EXECGATE_SOCKET=", sock_path), joined("EXECGATE_TOKEN=", token),
            joined("EXECGATE_WRAPPER=", plan.wrapper), joined("EXEC_WRAPPER=", plan.wrapper),
            joined("BASH_EXEC_WRAPPER=", plan.wrapper), confined ? NULL : snap_env,
        };
        char **env = command_env(gate_env, plan.interposer);
        if (!env || send_first_spawn(ctl[0], program, progfd, cwd, cmd, env, confined) < 0) {
            fprintf(stderr, "execgate: error: cannot start the session's command\n");
            kill(launcher, SIGTERM);
        }
    }
    close(ctl[0]); /* S's now */
    if (snap_fd >= 0)
        close(snap_fd);
    close(progfd);
    sweep_stale_session_dirs(plan.sessions); /* while the command runs */

    /* Wait for L: the command and everything it left. */
    int launcher_status = -1, server_status = -1;
    while (launcher > 0 && launcher_status < 0) {
        struct pollfd pfd = {.fd = sigfd, .events = POLLIN};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
            break;
        struct signalfd_siginfo si;
        while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
            if ((si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP) && !ending) {
                ending = 1; /* as `execgate run`: the session ends, we die of SIGTERM */
                kill(launcher, SIGTERM);
            }
        }
        for (;;) {
            int st;
            pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
            if (pid <= 0)
                break;
            if (pid == launcher)
                launcher_status = st;
            else if (pid == server)
                server_status = st;
        }
    }

    /* The main program's wait status, as L reported it. */
    char line[32];
    ssize_t got = 0;
    for (;;) {
        ssize_t k = read(status[0], line + got, sizeof line - 1 - (size_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += k;
    }
    line[got] = '\0';
    long long reported;
    char *nl = strchr(line, '\n');
    if (nl) {
        *nl = '\0';
        if (parse_ll(line, &reported) == 0)
            main_status = (int)reported;
    }
    /* A launcher that did not exit 0 may have left processes: they came to us (subreaper).
     * Kill them all, sparing S (its status says whether it ended the session). */
    if (launcher_status != 0) {
        for (int round = 0; round < 64 && eg_signal_descendants(self, server, SIGKILL, 0); round++) {
            int st;
            pid_t pid;
            while ((pid = waitpid(-1, &st, __WALL | WNOHANG)) > 0)
                if (pid == server)
                    server_status = st;
            usleep(1000);
        }
    }
    /* then stop S (the first record was written before anything ran). S says its status on
     * the done pipe once its session is closed and its records written: the teardown of its
     * event loop and of an interpreter (milliseconds to tens of them on a loaded machine) is
     * not waited for; S, still ending, goes to our reaper. EOF without a status (S died or was
     * still starting): wait for it. */
    if (server_status < 0) {
        kill(server, SIGTERM);
        unsigned char said;
        ssize_t got;
        while ((got = read(done[0], &said, 1)) < 0 && errno == EINTR)
            ;
        if (got == 1)
            server_status = W_EXITCODE(said, 0);
        else
            while (waitpid(server, &server_status, __WALL) < 0 && errno == EINTR)
                ;
    }
    /* and whatever else is still ours */
    while (waitpid(-1, NULL, __WALL | WNOHANG) > 0)
        ;
    remove_session_dir();
    if (WIFEXITED(server_status) && WEXITSTATUS(server_status) == 3)
        _exit(1); /* S found the plan stale and ended the session (it said so) */

    if (ending)
        exit_like(SIGTERM);
    if (main_status < 0) {
        fprintf(stderr, "execgate: error: the session launcher exited before the command "
                        "ended\n");
        _exit(1);
    }
    exit_like(main_status);
}
