/* The decision log's hash chain written from C: see chain.h and decisionlog/chain.py, whose
 * every step this follows (tests/native/test_native_chain.py compares the bytes). */
#include "chain.h"
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define GENESIS "0000000000000000000000000000000000000000000000000000000000000000"
#define TAIL_CHUNK 65536
#define OPEN_FLAGS (O_CLOEXEC | O_NOCTTY | O_NONBLOCK) /* a FIFO must not hang the front */

/* -- strings -------------------------------------------------------------------------------- */

void eg_str_add(struct eg_str *s, const char *data, size_t len)
{
    if (s->failed)
        return;
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + len + 1)
            cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) {
            s->failed = 1;
            return;
        }
        s->p = p, s->cap = cap;
    }
    memcpy(s->p + s->len, data, len);
    s->len += len;
    s->p[s->len] = '\0';
}

static void add_cstr(struct eg_str *s, const char *text) { eg_str_add(s, text, strlen(text)); }

static void add_long(struct eg_str *s, long long v)
{
    char num[32];
    int n = snprintf(num, sizeof num, "%lld", v);
    eg_str_add(s, num, (size_t)n);
}

void eg_str_free(struct eg_str *s)
{
    free(s->p);
    s->p = NULL;
    s->len = s->cap = 0;
}

/* -- JSON ----------------------------------------------------------------------------------- */

/* One character of bytes as Python's strict UTF-8 decoder with surrogateescape takes it: its
 * code point, and how many bytes it used (an undecodable byte is U+DC80..U+DCFF, alone). */
static size_t next_char(const unsigned char *s, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    uint32_t v;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range (no overlong, no surrogate) */
    if (c >= 0xC2 && c <= 0xDF)
        need = 1, v = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2, v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3, v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        goto undecodable;
    for (int i = 1; i <= need; i++) { /* (a NUL ends the text: it is never a continuation) */
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF))
            goto undecodable;
        v = v << 6 | (b & 0x3F);
    }
    *cp = v;
    return (size_t)need + 1;
undecodable:
    *cp = 0xDC00 + c;
    return 1;
}

static void add_u(struct eg_str *o, uint32_t c)
{
    static const char hexd[] = "0123456789abcdef";
    char e[6] = {'\\', 'u', hexd[c >> 12 & 15], hexd[c >> 8 & 15], hexd[c >> 4 & 15], hexd[c & 15]};
    eg_str_add(o, e, 6);
}

/* json's ensure_ascii escaping of one code point (c_encode_basestring_ascii). */
static void add_escaped(struct eg_str *o, uint32_t c)
{
    switch (c) {
    case '"':
        return add_cstr(o, "\\\"");
    case '\\':
        return add_cstr(o, "\\\\");
    case '\n':
        return add_cstr(o, "\\n");
    case '\r':
        return add_cstr(o, "\\r");
    case '\t':
        return add_cstr(o, "\\t");
    case '\b':
        return add_cstr(o, "\\b");
    case '\f':
        return add_cstr(o, "\\f");
    }
    if (c >= ' ' && c <= '~') {
        char ch = (char)c;
        eg_str_add(o, &ch, 1);
    } else if (c >= 0x10000) {
        c -= 0x10000;
        add_u(o, 0xD800 | (c >> 10));
        add_u(o, 0xDC00 | (c & 0x3FF));
    } else
        add_u(o, c);
}

static long text_chars(const char *bytes)
{
    long n = 0;
    uint32_t cp;
    for (const unsigned char *p = (const unsigned char *)bytes; *p; n++)
        p += next_char(p, &cp);
    return n;
}

void eg_json_text(struct eg_str *out, const char *bytes, long limit, long *chars)
{
    long n = 0;
    uint32_t cp;
    eg_str_add(out, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)bytes; *p; n++) {
        p += next_char(p, &cp);
        if (limit < 0 || n < limit)
            add_escaped(out, cp);
    }
    eg_str_add(out, "\"", 1);
    if (chars)
        *chars = n;
}

/* -- the first record ----------------------------------------------------------------------- */

/* round(time, 6) as json writes that float (its repr): the 6 decimals without trailing
 * zeros, at least one. (Below 2^33 s doubles are closer together than 1e-6, so the shortest
 * repr of the double nearest a 6-decimal number is that number; repr has no exponent from
 * 1e-4 up to 1e16.) */
static void add_time(struct eg_str *o, long long us)
{
    char t[48];
    int n = snprintf(t, sizeof t, "%lld.%06lld", us / 1000000, us % 1000000);
    while (n > 0 && t[n - 1] == '0' && t[n - 2] != '.')
        n--;
    eg_str_add(o, t, (size_t)n);
}

void eg_first_record_body(struct eg_str *o, const struct eg_first_record *r)
{
    add_cstr(o, "{\"time\":");
    add_time(o, r->time_us);
    add_cstr(o, ",\"session\":");
    eg_json_text(o, r->session, -1, NULL);
    add_cstr(o, ",\"front\":\"run\",\"kind\":\"exec\",\"pid\":");
    add_long(o, r->pid);
    add_cstr(o, ",\"ppid\":");
    add_long(o, r->ppid);
    add_cstr(o, ",\"cwd\":");
    eg_json_text(o, r->cwd, -1, NULL);
    add_cstr(o, ",\"program\":");
    eg_json_text(o, r->program, -1, NULL);
    /* decisionlog/argv.py's bounded_argv: words cut at WORD_LIMIT characters, and none kept
     * once ARGV_LIMIT characters are; argv_cut counts what went (when anything did) */
    add_cstr(o, ",\"argv\":[");
    long total = 0, cut = 0;
    int kept = 0;
    for (char *const *a = r->argv; *a; a++) {
        if (total >= EG_ARGV_LIMIT) {
            cut += text_chars(*a);
            continue;
        }
        if (kept++)
            eg_str_add(o, ",", 1);
        long chars;
        eg_json_text(o, *a, EG_WORD_LIMIT, &chars);
        long short_ = chars < EG_WORD_LIMIT ? chars : EG_WORD_LIMIT;
        cut += chars - short_;
        total += short_;
    }
    eg_str_add(o, "]", 1);
    if (cut) {
        add_cstr(o, ",\"argv_cut\":");
        add_long(o, cut);
    }
    add_cstr(o, ",\"via\":\"session\",\"decision\":\"run\",\"sandbox\":");
    eg_json_text(o, r->sandbox, -1, NULL);
    add_cstr(o, ",\"source\":\"none\"");
}

/* -- the chained file ----------------------------------------------------------------------- */

/* files.open_private: a file this call creates is 0600 (an existing one keeps its mode). */
static int open_private(const char *path, int flags)
{
    int fd = open(path, flags | O_CREAT | O_EXCL | OPEN_FLAGS, 0600);
    if (fd >= 0) {
        if (fchmod(fd, 0600) < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        return fd;
    }
    if (errno != EEXIST)
        return -1;
    return open(path, flags | OPEN_FLAGS);
}

/* files.make_private_dir: the missing folders of path made 0700 (existing ones untouched). */
static int make_private_dir(const char *path)
{
    char buf[PATH_MAX];
    size_t ends[PATH_MAX / 2], len = strlen(path);
    int missing = 0;
    if (len == 0 || len >= sizeof buf)
        return errno = ENAMETOOLONG, -1;
    memcpy(buf, path, len + 1);
    for (;;) { /* up from path to the first folder that is there */
        struct stat st;
        buf[len] = '\0';
        if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
            break;
        ends[missing++] = len;
        while (len > 0 && buf[len - 1] != '/')
            len--;
        while (len > 1 && buf[len - 1] == '/')
            len--; /* (the root stays `/`) */
        if (len == 0)
            break;
    }
    while (missing-- > 0) {
        memcpy(buf, path, ends[missing]);
        buf[ends[missing]] = '\0';
        if (mkdir(buf, 0700) < 0) {
            if (errno == EEXIST)
                continue; /* made by someone else meanwhile: theirs */
            return -1;
        }
        if (chmod(buf, 0700) < 0)
            return -1;
    }
    return 0;
}

/* chain.rotated_path: decisions.jsonl -> decisions.N.jsonl (pathlib's stem and suffix). */
static int rotated_path(char *out, size_t cap, const char *path, int n)
{
    if (n == 0)
        return snprintf(out, cap, "%s", path) < (int)cap ? 0 : -1;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    const char *dot = strrchr(name, '.');
    size_t namelen = strlen(name);
    if (!dot || dot == name || (size_t)(dot - name) >= namelen - 1)
        dot = name + namelen; /* no suffix */
    int w = snprintf(out, cap, "%.*s.%d%s", (int)(dot - path), path, n, dot);
    return w >= 0 && w < (int)cap ? 0 : -1;
}

static int lock_path(char *out, size_t cap, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    int w = snprintf(out, cap, "%.*s.%s.lock", (int)(name - path), path, name);
    return w >= 0 && w < (int)cap ? 0 : -1;
}

static int read_at(int fd, char *buf, size_t n, off_t at)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, buf + got, n - got, at + (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k == 0 ? (errno = EIO, -1) : -1; /* (cut short under us) */
        got += (size_t)k;
    }
    return 0;
}

/* chain._last_line_hash: the hash of the last line of path, whose size is size (0: empty,
 * *found 0), and whether the file ends with a newline. 0 or -1. */
static int last_line_hash(const char *path, long long size, char hash[65], int *found,
                          int *complete)
{
    *found = 0, *complete = 1;
    if (size == 0)
        return 0;
    int fd = open(path, O_RDONLY | OPEN_FLAGS);
    if (fd < 0)
        return -1;
    struct stat st;
    char last;
    if (fstat(fd, &st) < 0 || (!S_ISREG(st.st_mode) && (errno = EINVAL)) ||
        read_at(fd, &last, 1, size - 1) < 0) {
        int e = errno;
        close(fd);
        return errno = e, -1;
    }
    *complete = last == '\n';
    long long end = size - (*complete ? 1 : 0), start = end;
    static char chunk[TAIL_CHUNK];
    while (start > 0) { /* back to the newline before the last line, or the file's start */
        long long from = start > TAIL_CHUNK ? start - TAIL_CHUNK : 0;
        if (read_at(fd, chunk, (size_t)(start - from), from) < 0) {
            close(fd);
            return -1;
        }
        char *nl = memrchr(chunk, '\n', (size_t)(start - from));
        if (nl) {
            start = from + (nl - chunk) + 1;
            break;
        }
        start = from;
    }
    struct eg_sha256 c;
    eg_sha256_init(&c);
    for (long long at = start; at < end;) {
        size_t n = end - at > TAIL_CHUNK ? TAIL_CHUNK : (size_t)(end - at);
        if (read_at(fd, chunk, n, at) < 0) {
            close(fd);
            return -1;
        }
        eg_sha256_update(&c, chunk, n);
        at += (long long)n;
    }
    close(fd);
    eg_sha256_hex(&c, hash);
    *found = 1;
    return 0;
}

/* chain._prev_of_rotated: the newest rotated file's last hash, else GENESIS. */
static void prev_of_rotated(const char *path, int keep, char prev[65])
{
    char older[PATH_MAX];
    for (int n = 1; n <= keep; n++) {
        struct stat st;
        int found, complete;
        if (rotated_path(older, sizeof older, path, n) == 0 && stat(older, &st) == 0 &&
            last_line_hash(older, (long long)st.st_size, prev, &found, &complete) == 0 && found)
            return;
    }
    memcpy(prev, GENESIS, 65);
}

/* ChainedFile._reopen: the log, O_APPEND, a regular file (-2: it is not). */
static int open_log(const char *path, ino_t *ino)
{
    int fd = open_private(path, O_WRONLY | O_APPEND);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -2;
    }
    *ino = st.st_ino;
    return fd;
}

static int unlink_if_there(const char *path) { return unlink(path) < 0 && errno != ENOENT ? -1 : 0; }

/* ChainedFile._rotate: decisions.jsonl -> .1 -> … -> .keep (the oldest dropped). */
static int rotate(const char *path, int keep)
{
    char from[PATH_MAX], to[PATH_MAX];
    if (rotated_path(to, sizeof to, path, keep) < 0 || unlink_if_there(to) < 0)
        return -1;
    for (int n = keep - 1; n >= 0; n--) {
        if (rotated_path(from, sizeof from, path, n) < 0 ||
            rotated_path(to, sizeof to, path, n + 1) < 0)
            return -1;
        if (rename(from, to) < 0 && errno != ENOENT)
            return -1;
    }
    return keep == 0 ? unlink_if_there(path) : 0;
}

static int write_all(int fd, const char *data, size_t n)
{
    while (n) {
        ssize_t k = write(fd, data, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        data += k, n -= (size_t)k;
    }
    return 0;
}

static int refuse(char *why, size_t cap, const char *path, const char *reason)
{
    if (path)
        snprintf(why, cap, "cannot write the decision log %s: %s", path, reason);
    else
        snprintf(why, cap, "cannot write the decision log: %s", reason);
    return -1;
}

int eg_chain_append(const char *path, long long max_bytes, int keep, const char *body,
                    size_t body_len, char *why, size_t why_cap)
{
    /* ChainedFile(): the folder, the lock file, the log (errors: LogPathError, with path) */
    char dir[PATH_MAX], lock[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash || (size_t)(slash - path) >= sizeof dir || lock_path(lock, sizeof lock, path) < 0)
        return refuse(why, why_cap, path, strerror(ENAMETOOLONG));
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    if (slash == path)
        strcpy(dir, "/");
    if (make_private_dir(dir) < 0)
        return refuse(why, why_cap, path, strerror(errno));
    int lockfd = open_private(lock, O_RDWR);
    if (lockfd < 0)
        return refuse(why, why_cap, path, strerror(errno));
    ino_t ino = 0;
    int fd = open_log(path, &ino);
    if (fd < 0) {
        int e = errno, r = fd;
        close(lockfd);
        return refuse(why, why_cap, path, r == -2 ? "not a regular file" : strerror(e));
    }

    /* append() (errors: OSError, without path) */
    int r = -1, e = 0;
    char *data = NULL;
    while (flock(lockfd, LOCK_EX) < 0)
        if (errno != EINTR) {
            e = errno;
            goto out;
        }
    struct stat st;
    if (stat(path, &st) < 0 ? errno == ENOENT : st.st_ino != ino) { /* rotated meanwhile */
        close(fd);
        if ((fd = open_log(path, &ino)) < 0) {
            e = fd == -2 ? EISDIR : errno;
            goto out;
        }
    }
    if (fstat(fd, &st) < 0) {
        e = errno;
        goto out;
    }
    long long size = (long long)st.st_size;
    char prev[65];
    int found, complete;
    if (last_line_hash(path, size, prev, &found, &complete) < 0) {
        e = errno;
        goto out;
    }
    if (!found)
        prev_of_rotated(path, keep, prev);
    const char *lead = complete ? "" : "\n"; /* a torn line stays one (broken) line */
    size_t line_len = body_len + sizeof ",\"prev\":\"\"}" - 1 + 64;
    size_t lead_len = strlen(lead), len = lead_len + line_len + 1;
    if (!(data = malloc(len + 1))) {
        e = ENOMEM;
        goto out;
    }
    snprintf(data, len + 1, "%s%.*s,\"prev\":\"%s\"}\n", lead, (int)body_len, body, prev);
    const char *start = data;
    if (size && size + (long long)len > max_bytes) {
        if (rotate(path, keep) < 0) {
            e = errno;
            goto out;
        }
        close(fd);
        if ((fd = open_log(path, &ino)) < 0) {
            e = fd == -2 ? EISDIR : errno;
            goto out;
        }
        start += lead_len, len -= lead_len;
    }
    if (write_all(fd, start, len) < 0) {
        e = errno;
        goto out;
    }
    r = 0;
out:
    free(data);
    if (fd >= 0)
        close(fd);
    close(lockfd); /* (the lock goes with it) */
    if (r < 0)
        refuse(why, why_cap, NULL, strerror(e));
    return r;
}
