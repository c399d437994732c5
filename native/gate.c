/* The client side of the exec gate: resolve, snapshot fast path, ask, plan (see gate.h). */
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common.h"
#include "sys.h"

struct eg_session eg_sess;

/* ---------------------------------------------------------------- small helpers */

const char *eg_basename(const char *path)
{
    const char *b = path;
    for (const char *p = path; *p; p++)
        if (*p == '/' && p[1])
            b = p + 1;
    return b;
}

static int eq(const char *a, const char *b) { return strcmp(a, b) == 0; }

const char *eg_strerror(int err)
{
    switch (err) {
    case 0: return "Success";
    case EPERM: return "Operation not permitted";
    case ENOENT: return "No such file or directory";
    case EINTR: return "Interrupted system call";
    case EIO: return "Input/output error";
    case ENXIO: return "No such device or address";
    case E2BIG: return "Argument list too long";
    case ENOEXEC: return "Exec format error";
    case EBADF: return "Bad file descriptor";
    case EAGAIN: return "Resource temporarily unavailable";
    case ENOMEM: return "Cannot allocate memory";
    case EACCES: return "Permission denied";
    case EFAULT: return "Bad address";
    case ENOTDIR: return "Not a directory";
    case EISDIR: return "Is a directory";
    case EINVAL: return "Invalid argument";
    case ENFILE: return "Too many open files in system";
    case EMFILE: return "Too many open files";
    case ETXTBSY: return "Text file busy";
    case EPIPE: return "Broken pipe";
    case ENAMETOOLONG: return "File name too long";
    case ELOOP: return "Too many levels of symbolic links";
    case ENODATA: return "No data available";
    case EPROTO: return "Protocol error";
    case EMSGSIZE: return "Message too long";
    case ENOTSOCK: return "Socket operation on non-socket";
    case ECONNRESET: return "Connection reset by peer";
    case ECONNREFUSED: return "Connection refused";
    case ETIMEDOUT: return "Connection timed out";
    case ESTALE: return "Stale file handle";
    case ENODEV: return "No such device";
    case ENOSYS: return "Function not implemented";
    default: return "Unknown error";
    }
}

/* A bounded string builder on caller memory. */
struct sb {
    char *p;
    size_t len, cap;
};

static void sb_put(struct sb *s, const char *t, size_t n)
{
    if (s->cap == 0)
        return;
    if (n > s->cap - 1 - s->len)
        n = s->cap - 1 - s->len;
    memcpy(s->p + s->len, t, n);
    s->len += n;
    s->p[s->len] = '\0';
}

static void sb_str(struct sb *s, const char *t) { sb_put(s, t, strlen(t)); }

static int sb_full(const struct sb *s) { return s->len + 1 >= s->cap; }

const char *eg_getenv(char *const *envp, const char *name)
{
    if (!envp)
        return NULL;
    size_t n = strlen(name);
    for (; *envp; envp++)
        if ((*envp)[0] == name[0] && strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

/* ---------------------------------------------------------------- raw exec */

int eg_sys_execve(const char *path, char *const *argv, char *const *envp)
{
    long r = EG_SC(SYS_execve, path, argv, envp, 0, 0, 0);
    return r < 0 ? (int)r : 0;
}

int eg_sys_execveat(int dirfd, const char *path, char *const *argv, char *const *envp, int flags)
{
    long r = EG_SC(SYS_execveat, dirfd, path, argv, envp, flags, 0);
    return r < 0 ? (int)r : 0;
}

int eg_exec_plan(const struct eg_plan *plan)
{
    int r;
    switch (plan->how) {
    case EG_HOW_FD:
        r = eg_sys_execveat(plan->fd, "", plan->argv, plan->envp, AT_EMPTY_PATH);
        break;
    case EG_HOW_CLAIM: {
        char *claim[] = {(char *)"execgate-claim", (char *)plan->ticket, NULL};
        r = eg_sys_execve(plan->path, claim, plan->envp);
        break;
    }
    default:
        r = -EINVAL;
    }
    return -r;
}

/* ---------------------------------------------------------------- denial lines */

/* The C twin of src/execgate/visible.py: what a human reads shows every character. Control
 * characters (C0, DEL, C1), bidirectional marks/overrides/isolates, zero-width and other format
 * characters, line/paragraph separators and bytes that are not UTF-8 are written escaped the
 * way bash's $'...' reads them; a cut says how much is not shown. */

/* Length of the well-formed UTF-8 sequence at s (at most n bytes) and its code point in *cp;
 * 0 when s does not start one. */
static size_t utf8_next(const unsigned char *s, size_t n, unsigned *cp)
{
    size_t len;
    unsigned c = s[0], min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, c &= 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, c &= 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, c &= 0x07, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

/* Unicode Cc, Cf, Zl and Zp (the categories visible.py escapes). */
static int cp_hidden(unsigned c)
{
    static const unsigned ranges[][2] = {
        {0x00, 0x1F},       {0x7F, 0x9F},       {0xAD, 0xAD},       {0x600, 0x605},
        {0x61C, 0x61C},     {0x6DD, 0x6DD},     {0x70F, 0x70F},     {0x890, 0x891},
        {0x8E2, 0x8E2},     {0x180E, 0x180E},   {0x200B, 0x200F},   {0x2028, 0x202E},
        {0x2060, 0x2064},   {0x2066, 0x206F},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},
        {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
        {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (c >= ranges[i][0] && c <= ranges[i][1])
            return 1;
    return 0;
}

/* The escape of one hidden code point (raw: a byte that is not UTF-8) into out (>= 11 bytes). */
static size_t escape_cp(char *out, unsigned c, int raw)
{
    static const char hex[] = "0123456789abcdef";
    static const char named[] = "\a\b\t\n\v\f\r\033";
    static const char letter[] = "abtnvfre";
    const char *k = c && c < 0x80 ? memchr(named, (int)c, sizeof named - 1) : NULL;
    if (k) {
        out[0] = '\\', out[1] = letter[k - named];
        return 2;
    }
    int digits = raw || c < 0x80 ? 2 : c <= 0xFFFF ? 4 : 8;
    out[0] = '\\';
    out[1] = digits == 2 ? 'x' : digits == 4 ? 'u' : 'U';
    for (int i = 0; i < digits; i++)
        out[2 + i] = hex[(c >> (4 * (digits - 1 - i))) & 0xF];
    return (size_t)digits + 2;
}

/* How a word is written: as is, in '...', or in $'...' (escapes needed). */
enum { WORD_BARE, WORD_SINGLE, WORD_ANSI };

static int bare_ok(unsigned c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && c < 0x80 && strchr("+-./:@]_", (int)c));
}

static int word_style(const unsigned char *w, size_t n)
{
    int style = n ? WORD_BARE : WORD_SINGLE;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t len = utf8_next(w + i, n - i, &cp);
        if (!len || cp_hidden(cp))
            return WORD_ANSI;
        if (cp == '\'')
            style = WORD_ANSI;
        else if (style == WORD_BARE && !bare_ok(cp))
            style = WORD_SINGLE;
        i += len;
    }
    return style;
}

/* Append text (free text if !quote, else the words of argv) to s, escaped; stop at max bytes of
 * output with "… (N more bytes)". */
static void render_visible(struct sb *s, char *const *words, int quote, size_t max)
{
    size_t start = s->len;
    for (char *const *a = words; *a; a++) {
        const unsigned char *w = (const unsigned char *)*a;
        size_t n = strlen(*a), i = 0;
        int style = quote ? word_style(w, n) : WORD_BARE;
        char piece[16];
        size_t plen;
        if (a != words && quote)
            sb_put(s, " ", 1);
        if (style != WORD_BARE)
            sb_str(s, style == WORD_ANSI ? "$'" : "'");
        while (i < n) {
            unsigned cp;
            size_t len = utf8_next(w + i, n - i, &cp);
            if (!len) {
                plen = escape_cp(piece, w[i], 1), len = 1;
            } else if (cp_hidden(cp)) {
                plen = escape_cp(piece, cp, 0);
            } else if (style == WORD_ANSI && (cp == '\\' || cp == '\'')) {
                piece[0] = '\\', piece[1] = (char)cp, plen = 2;
            } else {
                memcpy(piece, w + i, len), plen = len;
            }
            if (s->len - start + plen > max) {
                size_t hidden = n - i;
                for (char *const *b = a + 1; *b; b++)
                    hidden += 1 + strlen(*b);
                char num[24];
                sb_str(s, "\xe2\x80\xa6 (");
                sb_put(s, num, eg_fmt_long(num, (long long)hidden));
                sb_str(s, hidden == 1 ? " more byte)" : " more bytes)");
                return;
            }
            sb_put(s, piece, plen);
            i += len;
        }
        if (style != WORD_BARE)
            sb_put(s, "'", 1);
    }
}

static void render_cmd(struct sb *s, char *const *argv, const char *path)
{
    enum { CMD_MAX = 240 };
    char *const fallback[] = {(char *)(path && *path ? path : "(unknown program)"), NULL};
    if (argv && argv[0])
        render_visible(s, argv, 1, CMD_MAX);
    else /* a description or a path, not a command */
        render_visible(s, fallback, 0, CMD_MAX);
}

void eg_deny_line(char *const *argv, const char *path, const char *reason, const char *detail)
{
    eg_deny_line_fd(2, argv, path, reason, detail);
}

void eg_deny_line_fd(int fd, char *const *argv, const char *path, const char *reason,
                     const char *detail)
{
    char buf[1024];
    struct sb s = {buf, 0, sizeof buf - 1};
    buf[0] = '\0';
    sb_str(&s, "execgate: denied: ");
    render_cmd(&s, argv, path);
    sb_str(&s, ": ");
    char *const texts[] = {(char *)reason, (char *)(detail ? detail : ""), NULL};
    render_visible(&s, texts, 0, 600);
    buf[s.len++] = '\n';
    eg_write_all(fd, buf, s.len);
}

static void write_message(const char *msg, size_t n)
{
    char nl = '\n';
    if (n > 0 && msg[n - 1] == '\n')
        n--;
    char buf[1024];
    if (n < sizeof buf) {
        memcpy(buf, msg, n);
        buf[n] = '\n';
        eg_write_all(2, buf, n + 1);
    } else {
        eg_write_all(2, msg, n);
        eg_write_all(2, &nl, 1);
    }
}

/* ---------------------------------------------------------------- session */

/* Copy "name=value" (name NULL: just value) into the arena; "" when it does not fit (never a
 * truncated value, which might happen to be valid). */
static const char *arena_put(const char *name, const char *value, size_t vlen)
{
    size_t nlen = name ? strlen(name) + 1 : 0;
    size_t room = sizeof eg_sess.arena - eg_sess.arena_used;
    if (nlen + vlen + 1 > room) {
        if (!name)
            return "";
        vlen = 0;
        if (nlen + 1 > room)
            return "";
    }
    char *d = eg_sess.arena + eg_sess.arena_used;
    if (name) {
        memcpy(d, name, nlen - 1);
        d[nlen - 1] = '=';
    }
    memcpy(d + nlen, value, vlen);
    d[nlen + vlen] = '\0';
    eg_sess.arena_used += nlen + vlen + 1;
    return d;
}

/* The gate's variables, and the loader's that could keep the interposer from loading (an
 * LD_AUDIT library's la_objsearch can skip it; GLIBC_TUNABLES reconfigures the loader): a
 * caller's values are replaced by the ones captured at load. LD_LIBRARY_PATH cannot remove an
 * absolute preload, and the other LD_* variables of ld.so(8) do not load objects. */
static const char *const gate_names[] = {
    "EXECGATE_SOCKET", "EXECGATE_TOKEN", "EXECGATE_WRAPPER", "EXEC_WRAPPER",
    "BASH_EXEC_WRAPPER", "EXECGATE_SNAPSHOT", "LD_PRELOAD", "LD_AUDIT", "GLIBC_TUNABLES",
    "EXECGATE_HOLD", /* only the launcher holds a spawn (hold.h): never passed on */
};
static const char *const loader_names[] = {"LD_AUDIT", "GLIBC_TUNABLES"};
#define N_GATE_NAMES (sizeof gate_names / sizeof gate_names[0])
/* A proxied session's variables (PROXY_VARIABLE_NAMES in src/execgate/netproxy/variables.py):
 * re-added like the gate's, so a program that drops or changes them for its children does not
 * lose its way to the proxy (it could only lose its network: nothing else leads out). */
static const char *const proxy_names[] = {
    "EXECGATE_PROXY", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
    "npm_config_proxy", "npm_config_https_proxy", "NPM_CONFIG_PROXY", "NPM_CONFIG_HTTPS_PROXY",
    "YARN_HTTP_PROXY", "YARN_HTTPS_PROXY", "PIP_PROXY", "ALL_PROXY", "all_proxy", "NO_PROXY",
    "no_proxy",
};
#define N_PROXY_NAMES (sizeof proxy_names / sizeof proxy_names[0])
_Static_assert(8 + N_PROXY_NAMES <= sizeof eg_sess.env / sizeof eg_sess.env[0],
               "room for the re-added entries");

/* Whether e is "NAME=..." for one of names. Every exec runs this for every entry of its
 * environment against every name: the first byte rules out nearly all of them. */
static int names_entry(const char *e, const char *const *names, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (e[0] != names[i][0])
            continue;
        size_t n = strlen(names[i]);
        if (strncmp(e, names[i], n) == 0 && e[n] == '=')
            return 1;
    }
    return 0;
}

static int is_gate_entry(const char *e)
{
    return names_entry(e, gate_names, N_GATE_NAMES) ||
           (eg_sess.proxied && names_entry(e, proxy_names, N_PROXY_NAMES));
}

static int is_lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* "/proc/PID/fd/N": the server's sealed snapshot descriptor (protocol §6); nothing else. */
static int is_proc_fd_path(const char *s)
{
    static const char a[] = "/proc/", b[] = "/fd/";
    if (!s || strlen(s) > 40 || strncmp(s, a, sizeof a - 1) != 0)
        return 0;
    s += sizeof a - 1;
    if (*s < '1' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9')
        s++;
    if (strncmp(s, b, sizeof b - 1) != 0)
        return 0;
    s += sizeof b - 1;
    if (*s < '0' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9')
        s++;
    return *s == '\0';
}

void eg_session_load(char *const *envp, const char *preload_self)
{
    struct eg_session *S = &eg_sess;
    const char *sock = eg_getenv(envp, "EXECGATE_SOCKET");
    const char *token = eg_getenv(envp, "EXECGATE_TOKEN");
    const char *wrapper = eg_getenv(envp, "EXECGATE_WRAPPER");
    S->arena_used = 0;
    S->ok = 0;
    S->reason = "";
    S->snap = S->wrapper = S->preload = "";
    S->sock[0] = S->token[0] = S->claim[0] = '\0';

    if (!sock || !*sock)
        S->reason = "EXECGATE_SOCKET is not set";
    else if (sock[0] != '/' || strlen(sock) >= EG_SUN_PATH)
        S->reason = "EXECGATE_SOCKET is not an absolute socket path";
    else if (!token || !*token)
        S->reason = "EXECGATE_TOKEN is not set";
    else if (strlen(token) != EG_TOKEN_LEN || !is_lower_hex(token, EG_TOKEN_LEN))
        S->reason = "EXECGATE_TOKEN is malformed";
    else
        S->ok = 1;

    if (S->ok) {
        size_t n = strlen(sock);
        memcpy(S->sock, sock, n + 1);
        memcpy(S->token, token, EG_TOKEN_LEN + 1);
        size_t dir = (size_t)(strrchr(S->sock, '/') - S->sock);
        char snap[EG_SUN_PATH + sizeof "/policy.snap"];
        memcpy(snap, S->sock, dir);
        memcpy(snap + dir, "/policy.snap", sizeof "/policy.snap");
        const char *sealed = eg_getenv(envp, "EXECGATE_SNAPSHOT");
        S->snap = is_proc_fd_path(sealed) ? arena_put(NULL, sealed, strlen(sealed))
                                          : arena_put(NULL, snap, strlen(snap));
        static const char claim[] = "/claim.sock";
        if (dir + sizeof claim <= sizeof S->claim) {
            memcpy(S->claim, S->sock, dir);
            memcpy(S->claim + dir, claim, sizeof claim);
        }
    }
    if (wrapper && wrapper[0] == '/' && strlen(wrapper) < EG_PATH)
        S->wrapper = arena_put(NULL, wrapper, strlen(wrapper));

    static const char me[] = "libexecgate.so";
    const size_t mlen = sizeof me - 1;
    if (preload_self && *preload_self && strlen(preload_self) < EG_PATH) {
        S->preload = arena_put(NULL, preload_self, strlen(preload_self));
    } else {
        /* the first absolute LD_PRELOAD entry that names us */
        const char *lp = eg_getenv(envp, "LD_PRELOAD");
        while (lp && *lp) {
            while (*lp == ' ' || *lp == ':')
                lp++;
            const char *e = lp;
            while (*e && *e != ' ' && *e != ':')
                e++;
            size_t n = (size_t)(e - lp);
            if (n > mlen && n < EG_PATH && lp[0] == '/' && memcmp(e - mlen, me, mlen) == 0 &&
                e[-(long)mlen - 1] == '/') {
                S->preload = arena_put(NULL, lp, n);
                break;
            }
            lp = e;
        }
    }

    /* The entries re-added to every exec: the captured values, whatever they were, so a child
     * can neither drop nor replace them (a missing one stays missing). */
    S->nenv = 0;
    if (sock)
        S->env[S->nenv++] = arena_put("EXECGATE_SOCKET", sock, strlen(sock));
    if (token)
        S->env[S->nenv++] = arena_put("EXECGATE_TOKEN", token, strlen(token));
    const char *sealed = eg_getenv(envp, "EXECGATE_SNAPSHOT");
    if (sealed)
        S->env[S->nenv++] = arena_put("EXECGATE_SNAPSHOT", sealed, strlen(sealed));
    if (S->wrapper[0]) {
        size_t n = strlen(S->wrapper);
        S->env[S->nenv++] = arena_put("EXECGATE_WRAPPER", S->wrapper, n);
        S->env[S->nenv++] = arena_put("EXEC_WRAPPER", S->wrapper, n);
        S->env[S->nenv++] = arena_put("BASH_EXEC_WRAPPER", S->wrapper, n);
    }
    /* This process loaded with these values, and so with the interposer. */
    for (size_t i = 0; i < sizeof loader_names / sizeof loader_names[0]; i++) {
        const char *v = eg_getenv(envp, loader_names[i]);
        if (v)
            S->env[S->nenv++] = arena_put(loader_names[i], v, strlen(v));
    }
    S->proxied = S->ok && eg_getenv(envp, "EXECGATE_PROXY") != NULL;
    for (size_t i = 0; S->proxied && i < N_PROXY_NAMES; i++) {
        const char *v = eg_getenv(envp, proxy_names[i]);
        if (v && strlen(v) < 256)
            S->env[S->nenv++] = arena_put(proxy_names[i], v, strlen(v));
    }
}

/* ---------------------------------------------------------------- environment re-injection */

static int preload_token_is_ours(const char *t, size_t n)
{
    static const char me[] = "libexecgate.so";
    size_t m = sizeof me - 1;
    if (eg_sess.preload[0] && strlen(eg_sess.preload) == n &&
        memcmp(t, eg_sess.preload, n) == 0)
        return 1;
    return n >= m && memcmp(t + n - m, me, m) == 0 && (n == m || t[n - m - 1] == '/');
}

/* How many entries envp has, and the value of its (last) LD_PRELOAD. */
static size_t env_scan(char *const *envp, const char **preload)
{
    size_t count = 0;
    *preload = NULL;
    if (envp)
        for (char *const *e = envp; *e; e++) {
            count++;
            if ((*e)[0] == 'L' && strncmp(*e, "LD_PRELOAD=", 11) == 0)
                *preload = *e + 11;
        }
    return count;
}

size_t eg_env_size(char *const *envp)
{
    const char *lp;
    size_t count = env_scan(envp, &lp);
    size_t size = (count + N_GATE_NAMES + N_PROXY_NAMES + 2) * sizeof(char *);
    size += sizeof "LD_PRELOAD=" + strlen(eg_sess.preload) + 1 + (lp ? strlen(lp) : 0) + 16;
    return size;
}

char **eg_env_build(char *const *envp, void *mem, size_t cap)
{
    const char *lp;
    size_t count = env_scan(envp, &lp);
    size_t ptrs = (count + N_GATE_NAMES + N_PROXY_NAMES + 2) * sizeof(char *);
    if (cap < ptrs + 16)
        return NULL;
    char **out = mem;
    char *str = (char *)mem + ptrs;
    size_t n = 0;
    if (envp)
        for (char *const *e = envp; *e && n < count; e++)
            if (!is_gate_entry(*e))
                out[n++] = *e;
    for (int i = 0; i < eg_sess.nenv; i++)
        out[n++] = (char *)eg_sess.env[i];

    /* LD_PRELOAD: ours first, then the caller's other entries */
    struct sb s = {str, 0, cap - ptrs};
    if (eg_sess.preload[0]) {
        sb_str(&s, "LD_PRELOAD=");
        sb_str(&s, eg_sess.preload);
        if (lp) {
            const char *p = lp;
            while (*p) {
                while (*p == ' ' || *p == ':')
                    p++;
                const char *e = p;
                while (*e && *e != ' ' && *e != ':')
                    e++;
                if (e > p && !preload_token_is_ours(p, (size_t)(e - p))) {
                    sb_put(&s, " ", 1);
                    sb_put(&s, p, (size_t)(e - p));
                }
                p = e;
            }
        }
        if (sb_full(&s))
            return NULL;
        out[n++] = str;
    } else if (lp) {
        out[n++] = (char *)lp - 11; /* unknown own path: keep the caller's value */
    }
    out[n] = NULL;
    return out;
}

/* ---------------------------------------------------------------- the program */

enum kind { K_ELF, K_SCRIPT, K_OTHER, K_OPAQUE };

struct prog {
    int fd;       /* our descriptor (close-on-exec), or the caller's for fexecve */
    int own_fd;   /* fd is ours to close */
    enum kind kind;
    unsigned long long dev, ino;
    mode_t mode;        /* st_mode of the checked file (set-id bits) */
    nlink_t nlink;      /* its link count */
    unsigned long long size; /* st_size: a copy of a rule-named file has its size (§6) */
    char *abs;          /* PATH */
    char *real;         /* REALPATH, "" if unknown */
    int ninterp;
    int ifd[EG_MAX_INTERP];
    /* The layout keeps what every exec writes (the fields above and the start of names: two
     * short paths) together and what only scripts use last: each stack page first written in
     * a just-forked child is a page fault. */
    char names[2 * EG_PATH]; /* real, then abs right after it */
    /* A #! script (only read when kind is K_SCRIPT): level k's line names iname[k] (argument
     * iarg[k]), opened as ifd[k]; the last one is what the kernel would finally run, and what
     * we execute. Level 0 is parsed by classify(), the rest by open_chain() (only once the
     * script must be asked about). script_name: what binfmt_script would give the interpreter
     * as the script's name. */
    char iname[EG_MAX_INTERP][256];
    char iarg[EG_MAX_INTERP][256];
    char script_name[EG_PATH + 32];
};

static void fd_link(char *out, int fd)
{
    char *p = out;
    memcpy(p, "/proc/self/fd/", 14);
    p += 14;
    p += eg_fmt_long(p, fd);
    *p = '\0';
}

static int read_link(int fd, char *out, size_t cap)
{
    char link[40];
    fd_link(link, fd);
    ssize_t n = eg_sys_readlink(link, out, cap - 1);
    if (n < 0 || (size_t)n >= cap - 1) {
        out[0] = '\0';
        return -1;
    }
    out[n] = '\0';
    return 0;
}

static int spacetab(char c) { return c == ' ' || c == '\t'; }

/* binfmt_script's parser (fs/binfmt_script.c): buf is the first 256 bytes, zero padded.
 * name and arg get 256 bytes each ("" when there is no argument). */
static int parse_shebang(char *buf, size_t size, char *name, char *arg)
{
    if (buf[0] != '#' || buf[1] != '!')
        return -1;
    char *buf_end = buf + size - 1;
    char *i_end = memchr(buf, '\n', size);
    if (!i_end) {
        char *q = buf + 2;
        while (q < buf_end && spacetab(*q))
            q++;
        if (q >= buf_end)
            return -1; /* all spaces */
        char *t = q;
        while (t < buf_end && !(spacetab(*t) || *t == '\0'))
            t++;
        if (t >= buf_end)
            return -1; /* interpreter path truncated */
        i_end = buf_end;
    }
    while (i_end > buf + 2 && spacetab(i_end[-1]))
        i_end--;
    char *i_name = buf + 2;
    while (i_name < i_end && spacetab(*i_name))
        i_name++;
    if (i_name >= i_end)
        return -1;
    char *i_sep = i_name;
    while (i_sep < i_end && !(spacetab(*i_sep) || *i_sep == '\0'))
        i_sep++;
    char *i_arg = NULL;
    if (i_sep < i_end && *i_sep != '\0') {
        i_arg = i_sep;
        while (i_arg < i_end && spacetab(*i_arg))
            i_arg++;
        if (i_arg >= i_end)
            i_arg = NULL;
    }
    *i_end = '\0';
    if (i_sep < i_end)
        *i_sep = '\0';
    size_t n = strlen(i_name);
    memcpy(name, i_name, n + 1);
    arg[0] = '\0';
    if (i_arg) {
        n = strlen(i_arg);
        memcpy(arg, i_arg, n + 1);
    }
    return 0;
}

/* The first 256 bytes of readfd, zero padded: their length, or -1. */
static ssize_t read_head(int readfd, char buf[256])
{
    memset(buf, 0, 256);
    ssize_t n;
    do {
        n = eg_sys_pread(readfd, buf, 256, 0);
    } while (n == -EINTR);
    return n;
}

static void classify(struct prog *p, int readfd)
{
    char buf[256];
    ssize_t n = read_head(readfd, buf);
    if (n < 0) {
        p->kind = K_OPAQUE;
        return;
    }
    if (n >= 4 && memcmp(buf, "\177ELF", 4) == 0)
        p->kind = K_ELF;
    else if (n >= 2 && parse_shebang(buf, sizeof buf, p->iname[0], p->iarg[0]) == 0)
        p->kind = K_SCRIPT;
    else
        p->kind = K_OTHER;
}

/* Open a script's interpreters the way the kernel would find them (relative names against the
 * working directory), each once: ifd[k] for iname[k], reading the next #! line from that very
 * descriptor. 0 or the errno the exec would fail with (ELOOP past EG_MAX_INTERP levels). The
 * server judges these descriptors and we execute the last: nothing re-reads a #! line or
 * re-resolves a path after the check. */
static int open_chain(struct prog *p)
{
    p->ninterp = 0;
    for (int k = 0; k < EG_MAX_INTERP; k++) {
        int fd = eg_sys_openat(AT_FDCWD, p->iname[k], O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        int readable = fd >= 0;
        if (fd == -EACCES)
            fd = eg_sys_openat(AT_FDCWD, p->iname[k], O_PATH | O_CLOEXEC);
        if (fd < 0)
            return -fd;
        p->ifd[p->ninterp++] = fd;
        struct stat st;
        int r = eg_sys_fstat(fd, &st);
        if (r < 0)
            return -r;
        if (!S_ISREG(st.st_mode) || !(st.st_mode & 0111))
            return EACCES;
        char buf[256];
        if (!readable || read_head(fd, buf) < 2)
            return 0; /* executed by descriptor: the kernel refuses an unreadable script */
        if (k + 1 == EG_MAX_INTERP) {
            if (buf[0] == '#' && buf[1] == '!')
                return ELOOP;
            return 0;
        }
        if (parse_shebang(buf, sizeof buf, p->iname[k + 1], p->iarg[k + 1]) != 0)
            return 0;
    }
    return ELOOP;
}

/* Join dir + "/" + rel into out; 0 or -ENAMETOOLONG. */
static int join(char *out, const char *dir, const char *rel)
{
    size_t a = strlen(dir), b = strlen(rel);
    if (a + 1 + b + 1 > EG_PATH)
        return -ENAMETOOLONG;
    memcpy(out, dir, a);
    size_t i = a;
    if (a == 0 || dir[a - 1] != '/')
        out[i++] = '/';
    memcpy(out + i, rel, b + 1);
    return 0;
}

/* Join the folder open as dirfd + "/" + rel into out; 0 or -1. noinline: its buffer stays out of
 * the hot path's frame (see struct prog). */
__attribute__((noinline)) static int join_at(char *out, int dirfd, const char *rel)
{
    char dir[EG_PATH];
    return read_link(dirfd, dir, sizeof dir) < 0 || join(out, dir, rel) < 0 ? -1 : 0;
}

/* The canonical path of abs (an absolute path that opened the file of dev, ino) into out
 * (EG_PATH), resolved without /proc: a readlink of each component (EINVAL unless it is a
 * symlink, whose target is then resolved in its place), then an open that follows no symlink
 * and must find that very file. 0, or -1 (a loop, a missing or unreadable component, over
 * 1 KiB, another file at the end): the caller reads /proc/self/fd/N, whose lookups cost a
 * process just forked ~10 µs; these cost a few µs on dentries that stay cached. noinline: its
 * buffers stay out of the hot frame. */
__attribute__((noinline)) static int resolve_path(const char *abs, unsigned long long dev,
                                                  unsigned long long ino, char *out)
{
    enum { ROOM = 1024 };
    char rest[ROOM], link[ROOM];
    size_t len = strlen(abs), at = 0, olen = 0; /* out is "" for "/" until the end */
    if (abs[0] != '/' || len >= ROOM)
        return -1;
    memcpy(rest, abs, len + 1);
    for (int links = 0;;) {
        while (rest[at] == '/')
            at++;
        if (!rest[at])
            break;
        size_t from = at;
        while (rest[at] && rest[at] != '/')
            at++;
        size_t n = at - from;
        if (n == 1 && rest[from] == '.')
            continue;
        if (n == 2 && rest[from] == '.' && rest[from + 1] == '.') {
            while (olen > 0 && out[olen - 1] != '/')
                olen--;
            if (olen > 0)
                olen--;
            out[olen] = '\0';
            continue;
        }
        size_t parent = olen;
        if (olen + 1 + n >= ROOM)
            return -1;
        out[olen] = '/';
        memcpy(out + olen + 1, rest + from, n);
        olen += 1 + n;
        out[olen] = '\0';
        ssize_t k = eg_sys_readlink(out, link, sizeof link);
        if (k == -EINVAL) /* not a symlink */
            continue;
        if (k <= 0 || k >= ROOM || ++links > 40)
            return -1;
        size_t tail = strlen(rest + at); /* rest becomes the target, then what was left */
        if ((size_t)k + tail >= ROOM)
            return -1;
        memmove(rest + k, rest + at, tail + 1);
        memcpy(rest, link, (size_t)k);
        at = 0;
        olen = link[0] == '/' ? 0 : parent;
        out[olen] = '\0';
    }
    if (olen == 0) {
        out[0] = '/';
        out[1] = '\0';
    }
    /* A readlink saw each component at one moment and the open took its own path at another:
     * a component swapped with a symlink in between (renameat2 RENAME_EXCHANGE) would leave a
     * path that only looked canonical. So out is opened once more, following no symlink at
     * all, and must still reach that very file. */
    int fd = eg_sys_open_no_symlinks(out, O_PATH | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    struct stat st;
    int same = eg_sys_fstat(fd, &st) == 0 && (unsigned long long)st.st_dev == dev &&
               (unsigned long long)st.st_ino == ino;
    eg_sys_close(fd);
    return same ? 0 : -1;
}

/* Open the program as the kernel would find it. 0 or an errno the kernel would give. */
static int prog_open(struct prog *p, const char *cwd, int dirfd, const char *path, int fd_in,
                     int atflags)
{
    struct stat st;
    p->fd = -1;
    p->own_fd = 0;
    p->kind = K_OPAQUE;
    p->dev = p->ino = 0;
    p->mode = 0;
    p->nlink = 0;
    p->size = 0;
    p->real = p->abs = p->names; /* abs is moved next to real once real is known */
    p->real[0] = '\0';
    p->ninterp = 0;

    if (!path || (!*path && (atflags & AT_EMPTY_PATH))) {
        /* fexecve / execveat(fd, "", AT_EMPTY_PATH) */
        int fd = path ? dirfd : fd_in;
        if (fd < 0 || eg_sys_fstat(fd, &st) < 0)
            return EBADF;
        if (!S_ISREG(st.st_mode) || !(st.st_mode & 0111))
            return EACCES;
        p->fd = fd;
        read_link(fd, p->real, EG_PATH);
        p->abs = p->real;
        char link[40];
        fd_link(link, fd);
        int r = eg_sys_openat(AT_FDCWD, link, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (r >= 0) {
            struct stat st2;
            if (eg_sys_fstat(r, &st2) == 0 && st2.st_dev == st.st_dev && st2.st_ino == st.st_ino)
                classify(p, r);
            else
                p->kind = K_OPAQUE;
            eg_sys_close(r);
        } else {
            p->kind = K_OPAQUE;
        }
        p->mode = st.st_mode;
        p->nlink = st.st_nlink;
        p->size = (unsigned long long)st.st_size;
        p->dev = (unsigned long long)st.st_dev;
        p->ino = (unsigned long long)st.st_ino;
        return 0;
    }

    if (!*path)
        return ENOENT;
    size_t plen = strnlen(path, PATH_MAX);
    if (plen >= PATH_MAX)
        return ENAMETOOLONG;
    /* Open it once, for reading the header and for executing it. O_NONBLOCK: a FIFO must not
     * block us (it is refused below, as the kernel would). A file we may not read (mode --x)
     * is opened O_PATH: the kernel can still execute that descriptor. */
    int nofollow = (atflags & AT_SYMLINK_NOFOLLOW) ? O_NOFOLLOW : 0;
    int fd = eg_sys_openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | nofollow);
    int readable = fd >= 0;
    if (fd < 0) {
        int e = -fd;
        if (e != EACCES && e != ENXIO && e != EOPNOTSUPP && e != ELOOP && e != EPERM)
            return e;
        fd = eg_sys_openat(dirfd, path, O_PATH | O_CLOEXEC | nofollow);
        if (fd < 0)
            return -fd;
    }
    int r = eg_sys_fstat(fd, &st);
    if (r < 0) {
        eg_sys_close(fd);
        return -r;
    }
    if (S_ISLNK(st.st_mode)) { /* O_PATH|O_NOFOLLOW opened the link itself */
        eg_sys_close(fd);
        return ELOOP;
    }
    if (!S_ISREG(st.st_mode) || !(st.st_mode & 0111)) {
        eg_sys_close(fd);
        return EACCES;
    }
    p->mode = st.st_mode;
    p->nlink = st.st_nlink;
    p->size = (unsigned long long)st.st_size;
    p->dev = (unsigned long long)st.st_dev;
    p->ino = (unsigned long long)st.st_ino;
    p->fd = fd;
    if (readable)
        classify(p, fd);
    else
        p->kind = K_OPAQUE;
    p->own_fd = 1;

    char *abs = p->names + EG_PATH; /* for now: moved right after real below */
    if (path[0] == '/') {
        memcpy(abs, path, plen + 1);
    } else if (dirfd == AT_FDCWD) {
        if (!cwd[0] || join(abs, cwd, path) < 0)
            memcpy(abs, path, plen + 1);
    } else if (join_at(abs, dirfd, path) < 0) {
        memcpy(abs, path, plen + 1);
    }
    if (abs[0] != '/' || resolve_path(abs, p->dev, p->ino, p->real) < 0)
        read_link(p->fd, p->real, EG_PATH);
    size_t rlen = strlen(p->real);
    p->abs = p->real + rlen + 1;
    memmove(p->abs, abs, strlen(abs) + 1);
    return 0;
}

static void prog_close(struct prog *p)
{
    if (p->own_fd && p->fd >= 0)
        eg_sys_close(p->fd);
    p->fd = -1;
    p->own_fd = 0;
    for (int k = 0; k < p->ninterp; k++)
        eg_sys_close(p->ifd[k]);
    p->ninterp = 0;
}

/* ---------------------------------------------------------------- snapshot (§6) */

#define SNAP_HEADER 64
#define SNAP_ASK_ALWAYS 1u
#define SNAP_SLOTS 32

struct snap_map {
    const unsigned char *base;
    size_t size;
    unsigned long long dev, ino;
    long long mtime_sec, mtime_nsec, st_size;
    int valid;          /* well-formed */
    unsigned flags;
    uint32_t names, files, sizes, ask_dirs;
    uint64_t names_off, files_off, sizes_off, ask_dirs_off;
};

static struct snap_map snap_slots[SNAP_SLOTS];
static int snap_cur = -1;  /* index of the newest published slot (atomic) */
static int snap_used = 0;  /* slots handed out so far (atomic) */

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void snap_validate(struct snap_map *m)
{
    const unsigned char *b = m->base;
    m->valid = 0;
    if (m->size < SNAP_HEADER || memcmp(b, "EGSNAP1\0", 8) != 0)
        return;
    m->flags = le32(b + 8);
    m->names = le32(b + 12);
    m->files = le32(b + 16);
    m->sizes = le32(b + 20);
    m->names_off = le64(b + 24);
    m->files_off = le64(b + 32);
    m->sizes_off = le64(b + 40);
    m->ask_dirs = le32(b + 48);
    m->ask_dirs_off = le64(b + 56);
    if (m->flags & ~SNAP_ASK_ALWAYS)
        return; /* a flag we do not know: do not guess */
    if (le32(b + 52))
        return;
    uint64_t size = m->size;
    if (m->names_off > size || (uint64_t)m->names * 8 > size - m->names_off)
        return;
    if (m->files_off > size || (uint64_t)m->files * 16 > size - m->files_off)
        return;
    if (m->sizes_off > size || (uint64_t)m->sizes * 8 > size - m->sizes_off)
        return;
    /* sorted, or a binary search could miss a name and run what should have asked */
    for (uint32_t i = 1; i < m->names; i++)
        if (le64(b + m->names_off + 8 * (i - 1)) > le64(b + m->names_off + 8 * i))
            return;
    for (uint32_t i = 1; i < m->files; i++) {
        const unsigned char *x = b + m->files_off + 16 * (i - 1), *y = x + 16;
        uint64_t xd = le64(x), yd = le64(y), xi = le64(x + 8), yi = le64(y + 8);
        if (xd > yd || (xd == yd && xi > yi))
            return;
    }
    for (uint32_t i = 1; i < m->sizes; i++)
        if (le64(b + m->sizes_off + 8 * (i - 1)) > le64(b + m->sizes_off + 8 * i))
            return;
    /* the ask folders: each a u32 length and that many bytes of an absolute path without a
     * trailing slash ("/" alone), no NUL */
    uint64_t at = m->ask_dirs_off;
    if (m->ask_dirs && at > size)
        return;
    for (uint32_t i = 0; i < m->ask_dirs; i++) {
        if (size - at < 4)
            return;
        uint32_t n = le32(b + at);
        at += 4;
        if (n == 0 || n > size - at || b[at] != '/' || memchr(b + at, '\0', n) ||
            (n > 1 && b[at + n - 1] == '/'))
            return;
        at += n;
    }
    m->valid = 1;
}

/* Whether the canonical path real is one of the snapshot's ask folders or lies below one. */
static int snap_in_ask_dir(const struct snap_map *m, const char *real)
{
    uint64_t at = m->ask_dirs_off;
    for (uint32_t i = 0; i < m->ask_dirs; i++) {
        uint32_t n = le32(m->base + at);
        const char *f = (const char *)m->base + at + 4;
        at += 4 + (uint64_t)n;
        if (n == 1 || (strncmp(real, f, n) == 0 && (real[n] == '\0' || real[n] == '/')))
            return 1;
    }
    return 0;
}

/* Whether the ascending array of count little-endian u64 at base holds value. */
static int sorted_u64_has(const unsigned char *base, uint32_t count, uint64_t value)
{
    uint32_t lo = 0, hi = count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint64_t v = le64(base + 8 * (uint64_t)mid);
        if (v == value)
            return 1;
        if (v < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static int snap_has_name(const struct snap_map *m, const char *s, size_t n)
{
    return sorted_u64_has(m->base + m->names_off, m->names, fnv1a(s, n));
}

static int snap_has_file(const struct snap_map *m, uint64_t dev, uint64_t ino)
{
    const unsigned char *base = m->base + m->files_off;
    uint32_t lo = 0, hi = m->files;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint64_t d = le64(base + 16 * (uint64_t)mid), i = le64(base + 16 * (uint64_t)mid + 8);
        if (d == dev && i == ino)
            return 1;
        if (d < dev || (d == dev && i < ino))
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static int snap_has_size(const struct snap_map *m, uint64_t size)
{
    return sorted_u64_has(m->base + m->sizes_off, m->sizes, size);
}

static int snap_name_str(const struct snap_map *m, const char *s)
{
    return *s && snap_has_name(m, s, strlen(s));
}

/* Does the program need a round trip? 1 = ask, 0 = run without asking. */
static int snap_match(const struct snap_map *m, const struct prog *p)
{
    if (!m->valid || (m->flags & SNAP_ASK_ALWAYS))
        return 1;
    if (snap_has_file(m, p->dev, p->ino))
        return 1;
    if (snap_name_str(m, p->abs) || snap_name_str(m, eg_basename(p->abs)))
        return 1;
    if (snap_name_str(m, p->real) || snap_name_str(m, eg_basename(p->real)))
        return 1;
    /* In a folder the sandbox can write, seen from outside it (an escalated program's
     * snapshot), or in no folder at all (a memfd, a deleted file: who wrote it?): the server
     * decides whether it runs outside or inside the sandbox. */
    if (m->ask_dirs && (p->nlink == 0 || snap_in_ask_dir(m, p->real)))
        return 1;
    /* Of a rule-named file's size: maybe a copy of it (renamed, in a memfd, of ld.so), which
     * only the server can tell, by content. Sizes rarely collide otherwise. */
    if (snap_has_size(m, p->size))
        return 1;
    /* A script runs its interpreter, which may be a symlink, a hard link or itself a script
     * (the kernel follows up to four): only the server can resolve all that, so scripts
     * always ask. Starting an interpreter costs far more than the round trip. */
    if (p->kind == K_SCRIPT)
        return 1;
    return 0;
}

static int same_snap(const struct snap_map *m, const struct stat *st)
{
    return m->dev == (unsigned long long)st->st_dev && m->ino == (unsigned long long)st->st_ino &&
           m->st_size == (long long)st->st_size && m->mtime_sec == (long long)st->st_mtim.tv_sec &&
           m->mtime_nsec == (long long)st->st_mtim.tv_nsec;
}

/* Would the kernel run the program in secure mode (set-uid, set-gid, file capabilities)? Then
 * the loader drops LD_PRELOAD and nothing it starts is gated: only the server may let it run
 * (docs/policy.md, "Set-id programs"). The mode bits come from prog_open's fstat; the
 * capabilities cost one fgetxattr (ENODATA for nearly every file). Unknown means yes. */
static int leaves_the_gate(const struct prog *p)
{
    if ((p->mode & S_ISUID) || (p->mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
        return 1;
    ssize_t n = eg_sys_fgetxattr(p->fd, "security.capability", NULL, 0);
    if (n == -EBADF) { /* an O_PATH descriptor (execute-only file) */
        char link[40];
        fd_link(link, p->fd);
        n = eg_sys_getxattr(link, "security.capability", NULL, 0);
    }
    return n >= 0 || (n != -ENODATA && n != -ENOTSUP);
}

static int snap_says_ask(const struct prog *p);

/* 1 = ask the server, 0 = the snapshot says nobody cares about this program and it stays gated.
 * A file with other hard links always asks: one of its names may be a rule's, and the
 * snapshot's identities can lag behind a file replaced at that name; the server's cannot
 * (gate/livepolicy.py). Hard-linked programs are few (perl, bzip2, gzip). */
static int snap_needs_ask(const struct prog *p)
{
    return p->nlink > 1 || snap_says_ask(p) || leaves_the_gate(p);
}

/* The session's snapshot as it is now: its published mapping, or a fresh one in *scratch
 * (mapped, validated, and published when a slot is free; the caller unmaps scratch->base when
 * the result is scratch); NULL: it cannot be read (ask). */
static const struct snap_map *snap_current(struct snap_map *scratch)
{
    if (!eg_sess.snap[0])
        return NULL;
    int cur = __atomic_load_n(&snap_cur, __ATOMIC_ACQUIRE);
    if (cur >= 0) {
        struct stat st;
        if (eg_sys_fstatat(AT_FDCWD, eg_sess.snap, &st, 0) < 0)
            return NULL;
        if (same_snap(&snap_slots[cur], &st))
            return &snap_slots[cur];
    }

    /* a new snapshot: map it (mappings are never unmapped once published: other threads, or
     * the parent of a vfork child, may be reading them) */
    int fd = eg_sys_openat(AT_FDCWD, eg_sess.snap, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat fst;
    if (eg_sys_fstat(fd, &fst) < 0 || !S_ISREG(fst.st_mode) || fst.st_size < SNAP_HEADER ||
        fst.st_size > (1LL << 30)) {
        eg_sys_close(fd);
        return NULL;
    }
    long addr = eg_sys_mmap(NULL, (size_t)fst.st_size, PROT_READ, MAP_SHARED, fd, 0);
    eg_sys_close(fd);
    if (addr < 0 && addr > -4096)
        return NULL;
    *scratch = (struct snap_map){
        .base = (const unsigned char *)addr,
        .size = (size_t)fst.st_size,
        .dev = (unsigned long long)fst.st_dev,
        .ino = (unsigned long long)fst.st_ino,
        .mtime_sec = (long long)fst.st_mtim.tv_sec,
        .mtime_nsec = (long long)fst.st_mtim.tv_nsec,
        .st_size = (long long)fst.st_size,
    };
    snap_validate(scratch);
    int idx = __atomic_fetch_add(&snap_used, 1, __ATOMIC_ACQ_REL);
    if (idx >= SNAP_SLOTS)
        return scratch; /* out of slots: no caching from now on */
    snap_slots[idx] = *scratch;
    __atomic_store_n(&snap_cur, idx, __ATOMIC_RELEASE);
    return &snap_slots[idx];
}

static int snap_says_ask(const struct prog *p)
{
    if (!p->real[0])
        return 1; /* without REALPATH (no /proc) the snapshot cannot be checked fully */
    struct snap_map scratch;
    const struct snap_map *m = snap_current(&scratch);
    if (!m)
        return 1;
    int ask = snap_match(m, p);
    if (m == &scratch)
        eg_sys_munmap((void *)scratch.base, scratch.size);
    return ask;
}

void eg_snapshot_before_fork(void)
{
    /* no slot left: a newer snapshot mapped here could not be handed down (each child maps
     * its own, as snap_says_ask does), and a published one needs nothing */
    if (__atomic_load_n(&snap_used, __ATOMIC_ACQUIRE) >= SNAP_SLOTS)
        return;
    struct snap_map scratch;
    const struct snap_map *m = snap_current(&scratch);
    if (m == &scratch)
        eg_sys_munmap((void *)scratch.base, scratch.size);
}

/* ---------------------------------------------------------------- asking the server */

enum verdict { V_RUN, V_DENY, V_ESCALATE, V_ERROR };

struct answer {
    enum verdict v;
    const char *text;   /* deny: message; escalate: ticket; error: reason */
    size_t text_len;
    char reason[EG_SUN_PATH + 128];
};

#define ANSWER_CAP 4096

static void set_error(struct answer *a, const char *what, const char *detail, int err)
{
    struct sb s = {a->reason, 0, sizeof a->reason};
    a->reason[0] = '\0';
    sb_str(&s, what);
    if (detail || err) {
        sb_str(&s, " (");
        if (detail) {
            sb_str(&s, detail);
            if (err)
                sb_str(&s, ": ");
        }
        if (err)
            sb_str(&s, eg_strerror(err));
        sb_str(&s, ")");
    }
    a->v = V_ERROR;
    a->text = a->reason;
    a->text_len = s.len;
}

static size_t request_size(const struct eg_call *c, const struct prog *p, const char *cwd,
                           char *const *argv, size_t *argc_out)
{
    size_t n = EG_HEADER + 4 + 5 + EG_TOKEN_LEN + 1 + strlen(c->via) + 1 + 2 * 24 + strlen(cwd) +
               1 + strlen(p->abs) + 1 + 24 + 24;
    for (int k = 0; k < p->ninterp; k++)
        n += strlen(p->iname[k]) + 1 + strlen(p->iarg[k]) + 1;
    size_t argc = 0;
    if (argv)
        for (; argv[argc]; argc++)
            n += strlen(argv[argc]) + 1;
    *argc_out = argc;
    return n + 64;
}

/* Build the request in buf, ask, parse. On V_RUN, *argv_copy holds the argv the server saw
 * (pointing into buf). */
static void ask(const struct eg_call *c, const struct prog *p, const char *cwd, char *const *argv,
                size_t argc, char *buf, size_t cap, char **argv_copy, char *ans, struct answer *a,
                void **ans_map, size_t *ans_maplen)
{
    struct eg_buf b;
    eg_buf_init(&b, buf, cap);
    eg_put(&b, EG_TAG);
    eg_put(&b, "exec");
    eg_put(&b, eg_sess.token);
    eg_put(&b, c->via);
    eg_put_long(&b, eg_sys_getpid());
    eg_put_long(&b, eg_sys_getppid());
    eg_put(&b, cwd);
    eg_put(&b, p->abs);
    eg_put_long(&b, p->ninterp);
    for (int k = 0; k < p->ninterp; k++) {
        eg_put(&b, p->iname[k]);
        eg_put(&b, p->iarg[k]);
    }
    eg_put_ulong(&b, argc);
    for (size_t i = 0; i < argc; i++) {
        size_t at = b.len;
        const char *s = argv[i];
        if (!s) { /* another thread shortened argv under us */
            b.overflow = 1;
            break;
        }
        eg_put(&b, s);
        argv_copy[i] = b.data + at;
    }
    argv_copy[argc] = NULL;
    if (b.overflow) {
        set_error(a, "argument list changed while it was being read", NULL, 0);
        return;
    }

    int sock = eg_connect(eg_sess.sock);
    if (sock < 0) {
        set_error(a, "execgate server unreachable", eg_sess.sock, -sock);
        return;
    }
    /* What will run travels as descriptors (§3): the server judges these files, not names. */
    int fds[1 + EG_MAX_INTERP];
    fds[0] = p->fd;
    for (int k = 0; k < p->ninterp; k++)
        fds[1 + k] = p->ifd[k];
    int r = eg_send_frame(sock, &b, fds, 1 + p->ninterp);
    if (r < 0) {
        set_error(a, "cannot send the request to the execgate server", NULL, -r);
        eg_sys_close(sock);
        return;
    }
    char *payload;
    r = eg_await_readable(sock);
    ssize_t len =
        r < 0 ? r : eg_recv_frame_mm(sock, ans, ANSWER_CAP, &payload, ans_map, ans_maplen);
    eg_sys_close(sock);
    if (len == -ENODATA) {
        set_error(a, "the execgate server closed the connection without answering", NULL, 0);
        return;
    }
    if (len == -ECONNRESET) {
        set_error(a, "the execgate server closed the connection in the middle of its answer",
                  NULL, 0);
        return;
    }
    if (len == -EMSGSIZE || len == -EPROTO) {
        set_error(a, "malformed answer from the execgate server",
                  len == -EMSGSIZE ? "too large" : "empty", 0);
        return;
    }
    if (len < 0) {
        set_error(a, "no answer from the execgate server", NULL, (int)-len);
        return;
    }
    struct eg_fields f;
    eg_fields_init(&f, payload, (size_t)len);
    size_t n0, n1, n2 = 0;
    const char *tag = eg_next(&f, &n0);
    const char *kind = eg_next(&f, &n1);
    if (!tag || !kind || !eq(tag, EG_TAG) || payload[len - 1] != '\0') {
        set_error(a, "malformed answer from the execgate server", NULL, 0);
        return;
    }
    if (eq(kind, "run") && eg_fields_done(&f)) {
        a->v = V_RUN;
        return;
    }
    const char *arg = eg_next(&f, &n2);
    if (arg && eg_fields_done(&f)) {
        if (eq(kind, "deny")) {
            a->v = V_DENY;
            a->text = arg;
            a->text_len = n2;
            return;
        }
        if (eq(kind, "escalate") && n2 > 0 && n2 < 256) {
            a->v = V_ESCALATE;
            a->text = arg;
            a->text_len = n2;
            return;
        }
    }
    set_error(a, "malformed answer from the execgate server", NULL, 0);
}

/* ---------------------------------------------------------------- one attempt */

struct work {
    int have_cwd;       /* cwd is filled in (only when an exec needs it) */
    char *const *envp;  /* re-injected environment */
    char cwd[EG_PATH];  /* last: not touched unless needed (see struct prog's names) */
};

static const char *get_cwd(struct work *w)
{
    if (!w->have_cwd) {
        /* the kernel's answer; glibc's getcwd also refuses one that is not absolute
         * ("(unreachable)/..." for a folder outside this process's root) */
        if (eg_sys_getcwd(w->cwd, sizeof w->cwd) <= 0 || w->cwd[0] != '/')
            w->cwd[0] = '\0';
        w->have_cwd = 1;
    }
    return w->cwd;
}

#define STACK_MAX (64 * 1024)

/* noinline: its buffer stays out of attempt's frame (see struct prog) */
__attribute__((noinline)) static void deny_no_wrapper(char *const *argv, const char *path, int err)
{
    char detail[EG_PATH + 64];
    struct sb s = {detail, 0, sizeof detail};
    detail[0] = '\0';
    sb_str(&s, " (");
    sb_str(&s, eg_sess.wrapper);
    sb_str(&s, ": ");
    sb_str(&s, eg_strerror(err));
    sb_str(&s, ")");
    eg_deny_line(argv, path, "cannot start the execgate wrapper", detail);
}

/* The file the server denied last in this process (pid 0: none). */
static struct {
    pid_t pid;
    unsigned long long dev, ino;
} last_denied;

/* The session's wrapper, a gate of its own (by canonical path). */
static int is_the_wrapper(const struct prog *p)
{
    return eg_sess.wrapper[0] && p->real[0] && eq(p->real, eg_sess.wrapper);
}

static int attempt(struct eg_call *c, struct work *w, int dirfd, const char *path, int atflags,
                   char *const *argv, eg_run_fn run, void *ctx)
{
    struct prog p;
    const char *cwd = "";
    if (path && path[0] != '/' && dirfd == AT_FDCWD)
        cwd = get_cwd(w);
    int err = prog_open(&p, cwd, dirfd, path, c->fd, atflags);
    if (err)
        return err;

    struct eg_plan plan = {.fd = p.fd, .path = path, .argv = argv, .envp = w->envp};
    /* Everything runs from the very descriptor that was checked (close-on-exec, so the kernel
     * refuses to start a #! line it finds there: scripts run as their judged interpreter's
     * descriptor, below); other formats (binfmt_misc) too, so nothing swapped in can run. */
    plan.how = EG_HOW_FD;
    if (!path || !*path) /* fexecve: only the descriptor exists */
        plan.path = NULL;

    if (c->resolve_only) {
        if (!eg_sess.wrapper[0]) {
            prog_close(&p);
            eg_deny_line(argv, p.abs, "this call needs EXECGATE_WRAPPER, which is not set",
                         NULL);
            c->denied = 1;
            return EACCES;
        }
        /* decided here when the snapshot can (exactly the check below): the caller then
         * spawns this very descriptor; the wrapper is a gate of its own */
        if (!c->spawn_fd || is_the_wrapper(&p) || snap_needs_ask(&p)) {
            plan.how = EG_HOW_GATE;
            plan.path = p.abs;
        }
        err = run(ctx, &plan);
        prog_close(&p);
        return err;
    }

    /* The wrapper is a gate itself: exec it with the gate environment, it asks on its own. */
    if (is_the_wrapper(&p)) {
        err = run(ctx, &plan);
        prog_close(&p);
        return err;
    }

    /* A caller that searches PATH itself (dash, Python's os.execvp) tries the next directory
     * after a denial, which often holds the same file (/usr/bin/rm and /bin/rm): refuse that
     * very next attempt on the same file without asking (and prompting) again. */
    if (__atomic_load_n(&last_denied.pid, __ATOMIC_RELAXED) != 0) {
        pid_t pid = eg_sys_getpid();
        int same = last_denied.pid == pid && last_denied.dev == p.dev && last_denied.ino == p.ino;
        __atomic_store_n(&last_denied.pid, 0, __ATOMIC_RELAXED);
        if (same) {
            prog_close(&p);
            c->denied = 1;
            return EACCES;
        }
    }

    /* A repeated escalation out of the sandbox may be authorized already: claimed without
     * the server (§4). Inside a sandbox every program a rule names is covered by a stand-in
     * (§5): only those are tried, so sessions without a sandbox never pay for a miss. A
     * stand-in the server marked is known by its header alone (longer than "#!WRAPPER
     * --shadow\n"): a hint, which the launcher never trusts, so neither the snapshot (it asks
     * about every script) nor the #! chain (the launcher runs its own descriptor) is read
     * first. On a miss, everything below goes on as if it had not been tried. */
    if (c->standing && argv && argv[0] && p.abs[0] == '/' && p.kind == K_SCRIPT &&
        eg_sess.wrapper[0] && eq(p.iname[0], eg_sess.wrapper) && eq(p.iarg[0], "--shadow") &&
        p.size > strlen(eg_sess.wrapper) + 12) {
        struct eg_plan standing = {.how = EG_HOW_STANDING, .fd = p.fd, .path = p.abs,
                                   .argv = argv, .envp = w->envp};
        (void)run(ctx, &standing);
    }

    if (!snap_needs_ask(&p)) {
        err = run(ctx, &plan);
        prog_close(&p);
        return err;
    }

    /* A script: what binfmt_script would give its interpreter as the script's name. */
    char *script_name = p.script_name;
    if (p.kind == K_SCRIPT) {
        int named_by = -1;
        if (!path || !*path)
            named_by = p.fd;
        else if (path[0] != '/' && dirfd != AT_FDCWD)
            named_by = dirfd;
        if (named_by >= 0) { /* "/dev/fd/N[/path]": gone after the exec if close-on-exec */
            int fl = eg_sys_fcntl(named_by, F_GETFD, 0);
            if (fl < 0 || (fl & FD_CLOEXEC)) {
                prog_close(&p);
                return ENOENT;
            }
            struct sb s = {script_name, 0, sizeof p.script_name};
            char num[24];
            num[eg_fmt_long(num, named_by)] = '\0';
            sb_str(&s, "/dev/fd/");
            sb_str(&s, num);
            if (path && *path) {
                sb_str(&s, "/");
                sb_str(&s, path);
            }
        } else {
            size_t n = strlen(path);
            if (n >= sizeof p.script_name) {
                prog_close(&p);
                return ENAMETOOLONG;
            }
            memcpy(script_name, path, n + 1);
        }
        err = open_chain(&p);
        if (err) {
            prog_close(&p);
            return err;
        }
    }

    cwd = get_cwd(w);
    size_t argc;
    size_t need = request_size(c, &p, cwd, argv, &argc);
    /* argv as sent, then the script's argv: interpreters, script name, argv[1:] */
    size_t ptrs = (2 * argc + 2 * EG_MAX_INTERP + 4) * sizeof(char *);
    size_t total = ptrs + need + ANSWER_CAP;
    void *map = NULL;
    char vla[total <= STACK_MAX ? total : 1] __attribute__((aligned(16)));
    char *mem = vla;
    if (total > STACK_MAX) {
        map = eg_sys_map_anon(total);
        if (!map) {
            prog_close(&p);
            eg_deny_line(argv, path ? path : p.abs, "out of memory", NULL);
            c->denied = 1;
            return EACCES;
        }
        mem = map;
    }
    char **argv_copy = (char **)mem;
    char *frame = mem + ptrs;
    char *ans = frame + need;
    struct answer a = {.v = V_ERROR};
    void *ans_map = NULL;
    size_t ans_maplen = 0;
    ask(c, &p, cwd, argv, argc, frame, need, argv_copy, ans, &a, &ans_map, &ans_maplen);

    switch (a.v) {
    case V_RUN:
        plan.argv = argv_copy;
        if (p.ninterp) { /* run the judged interpreter as the kernel would have */
            char **x = argv_copy + argc + 1;
            size_t i = 0;
            for (int k = p.ninterp - 1; k >= 0; k--) {
                x[i++] = p.iname[k];
                if (p.iarg[k][0])
                    x[i++] = p.iarg[k];
            }
            x[i++] = script_name;
            for (size_t j = 1; j < argc; j++)
                x[i++] = argv_copy[j];
            x[i] = NULL;
            plan.fd = p.ifd[p.ninterp - 1];
            plan.argv = x;
        }
        err = run(ctx, &plan);
        break;
    case V_DENY:
        write_message(a.text, a.text_len);
        c->denied = 1;
        err = EACCES;
        last_denied.dev = p.dev;
        last_denied.ino = p.ino;
        __atomic_store_n(&last_denied.pid, eg_sys_getpid(), __ATOMIC_RELAXED);
        break;
    case V_ESCALATE:
        if (!eg_sess.wrapper[0]) {
            eg_deny_line(argv, p.abs, "escalation needs EXECGATE_WRAPPER, which is not set", NULL);
            c->denied = 1;
            err = EACCES;
            break;
        }
        plan.how = EG_HOW_CLAIM;
        plan.path = eg_sess.wrapper;
        plan.ticket = a.text;
        plan.argv = argv_copy;
        err = run(ctx, &plan);
        if (err) {
            deny_no_wrapper(argv, p.abs, err);
            c->denied = 1;
            err = EACCES;
        }
        break;
    default:
        eg_deny_line(argv, p.abs, a.reason, NULL);
        c->denied = 1;
        err = EACCES;
        break;
    }
    if (ans_map)
        eg_sys_munmap(ans_map, ans_maplen);
    if (map)
        eg_sys_munmap(map, total);
    prog_close(&p);
    return err;
}

/* glibc's maybe_script_execute: /bin/sh FILE ARGV[1..], itself gated. */
static int sh_fallback(struct eg_call *c, struct work *w, const char *file, char *const *argv,
                       eg_run_fn run, void *ctx)
{
    size_t argc = 0;
    if (argv)
        while (argv[argc])
            argc++;
    size_t n = (argc > 1 ? argc : 1) + 2;
    size_t bytes = n * sizeof(char *);
    void *map = NULL;
    char *vla[bytes <= STACK_MAX ? n : 1];
    char **nargv = vla;
    if (bytes > STACK_MAX) {
        map = eg_sys_map_anon(bytes);
        if (!map)
            return ENOMEM;
        nargv = map;
    }
    nargv[0] = (char *)"/bin/sh";
    nargv[1] = (char *)file;
    size_t i = 2;
    for (size_t k = 1; k < argc; k++)
        nargv[i++] = argv[k];
    nargv[i] = NULL;
    int r = attempt(c, w, AT_FDCWD, "/bin/sh", 0, nargv, run, ctx);
    if (map)
        eg_sys_munmap(map, bytes);
    return r;
}

/* noinline: its candidate buffer stays out of eg_gate's frame (see struct prog) */
__attribute__((noinline)) static int search(struct eg_call *c, struct work *w, eg_run_fn run,
                                            void *ctx)
{
    const char *file = c->path;
    size_t flen = strlen(file);
    if (flen > NAME_MAX)
        return ENAMETOOLONG;
    const char *sp = c->search_path ? c->search_path : "/bin:/usr/bin";
    char cand[EG_PATH];
    int got_eacces = 0, last = ENOENT;
    for (const char *p = sp;; ) {
        const char *sub = strchrnul(p, ':');
        size_t elen = (size_t)(sub - p);
        if (elen + 1 + flen + 1 <= sizeof cand) {
            memcpy(cand, p, elen);
            size_t at = elen;
            if (elen)
                cand[at++] = '/';
            memcpy(cand + at, file, flen + 1);
            int r = attempt(c, w, AT_FDCWD, cand, 0, c->argv, run, ctx);
            if (r == ENOEXEC && c->sh_fallback && !c->denied)
                r = sh_fallback(c, w, cand, c->argv, run, ctx);
            if (r == 0 || c->denied || c->settled)
                return r;
            switch (r) {
            case EACCES:
                got_eacces = 1;
                /* fallthrough */
            case ENOENT:
            case ESTALE:
            case ENOTDIR:
            case ENODEV:
            case ETIMEDOUT:
                last = r;
                break;
            default:
                return r;
            }
        }
        if (!*sub)
            break;
        p = sub + 1;
    }
    return got_eacces ? EACCES : last;
}

int eg_gate(struct eg_call *c, eg_run_fn run, void *ctx)
{
    c->denied = 0;
    c->settled = 0;
    if (!eg_sess.ok) {
        eg_deny_line(c->argv, c->path, "no execgate session: ", eg_sess.reason);
        c->denied = 1;
        return EACCES;
    }
    struct work w;
    w.have_cwd = 0;

    size_t esz = eg_env_size(c->envp);
    void *map = NULL;
    char vla[esz <= STACK_MAX ? esz : 1] __attribute__((aligned(16)));
    void *mem = vla;
    if (esz > STACK_MAX) {
        map = eg_sys_map_anon(esz);
        if (!map) {
            eg_deny_line(c->argv, c->path, "out of memory", NULL);
            c->denied = 1;
            return EACCES;
        }
        mem = map;
    }
    w.envp = eg_env_build(c->envp, mem, esz);
    int r;
    if (!w.envp) {
        eg_deny_line(c->argv, c->path, "environment changed while it was being read", NULL);
        c->denied = 1;
        r = EACCES;
    } else if (!c->path || !c->search || strchr(c->path, '/')) {
        r = attempt(c, &w, c->dirfd, c->path, c->atflags, c->argv, run, ctx);
        if (r == ENOEXEC && c->sh_fallback && !c->denied && c->path)
            r = sh_fallback(c, &w, c->path, c->argv, run, ctx);
    } else if (!*c->path) {
        r = ENOENT;
    } else {
        r = search(c, &w, run, ctx);
    }
    if (map)
        eg_sys_munmap(map, esz);
    return r;
}

/* ---------------------------------------------------------------- the front's first program */

int eg_snapshot_verdict(const void *snap, size_t len, const char *cwd, const char *path,
                        const char *wrapper, char *real, size_t real_cap, int *fd_out)
{
    struct prog p;
    int err = prog_open(&p, cwd, AT_FDCWD, path, -1, 0);
    if (err)
        return -err;
    struct snap_map m = {.base = snap, .size = len};
    snap_validate(&m);
    /* exactly the interposer's decision (snap_needs_ask), with this snapshot instead of the
     * session's; the wrapper (a gate of its own) is left to the server */
    int ask = !p.real[0] || p.nlink > 1 || snap_match(&m, &p) || leaves_the_gate(&p) ||
              (wrapper && wrapper[0] && eq(p.real, wrapper));
    size_t n = strlen(p.real);
    if (n + 1 > real_cap) {
        ask = 1;
        n = 0;
    }
    memcpy(real, p.real, n);
    real[n] = '\0';
    if (!ask && fd_out && p.own_fd) { /* the very file judged, for the caller to execute */
        *fd_out = p.fd;
        p.own_fd = 0;
    }
    prog_close(&p);
    return ask;
}
