/* Frames and fields of the EG1 protocol (docs/protocol.md §2). */
#include "common.h"
#include "sys.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

void eg_buf_init(struct eg_buf *b, char *mem, size_t cap)
{
    b->data = mem;
    b->cap = cap;
    b->len = cap >= EG_HEADER ? EG_HEADER : cap;
    b->overflow = cap < EG_HEADER;
}

void eg_put_n(struct eg_buf *b, const char *s, size_t n)
{
    if (b->overflow || n + 1 > b->cap - b->len) {
        b->overflow = 1;
        return;
    }
    memcpy(b->data + b->len, s, n);
    b->data[b->len + n] = '\0';
    b->len += n + 1;
}

void eg_put(struct eg_buf *b, const char *s) { eg_put_n(b, s, strlen(s)); }

size_t eg_strlen(const char *s) { return strlen(s); }

size_t eg_fmt_long(char *out, long long v)
{
    char tmp[24];
    size_t n = 0, i = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out[i++] = '-';
    while (n)
        out[i++] = tmp[--n];
    out[i] = '\0';
    return i;
}

void eg_put_long(struct eg_buf *b, long long v)
{
    char tmp[24];
    eg_put_n(b, tmp, eg_fmt_long(tmp, v));
}

void eg_put_ulong(struct eg_buf *b, unsigned long long v)
{
    char tmp[24], out[24];
    size_t n = 0, i = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        out[i++] = tmp[--n];
    eg_put_n(b, out, i);
}

int eg_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t k = eg_sys_write(fd, p, n);
        if (k < 0) {
            if (k == -EINTR)
                continue;
            return (int)k;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int eg_read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t k = eg_sys_read(fd, p, n);
        if (k < 0) {
            if (k == -EINTR)
                continue;
            return (int)k;
        }
        if (k == 0)
            return -ECONNRESET;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int eg_seal_frame(struct eg_buf *b)
{
    if (b->overflow || b->len <= EG_HEADER || b->len - EG_HEADER > EG_MAX_PAYLOAD)
        return -EMSGSIZE;
    uint32_t payload = (uint32_t)(b->len - EG_HEADER);
    b->data[0] = (char)(payload & 0xff);
    b->data[1] = (char)((payload >> 8) & 0xff);
    b->data[2] = (char)((payload >> 16) & 0xff);
    b->data[3] = (char)((payload >> 24) & 0xff);
    return 0;
}

int eg_send_frame(int sock, struct eg_buf *b, const int *fds, int nfds)
{
    if (nfds < 0 || nfds > EG_MAX_FDS)
        return -E2BIG;
    int sealed = eg_seal_frame(b);
    if (sealed < 0)
        return sealed;

    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * EG_MAX_FDS)];
    } control;
    struct iovec iov = {.iov_base = b->data, .iov_len = b->len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t sent;
    do {
        sent = eg_sys_sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (sent == -EINTR);
    if (sent < 0)
        return (int)sent;
    size_t off = (size_t)sent;
    while (off < b->len) {
        ssize_t k = eg_sys_send(sock, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (k < 0) {
            if (k == -EINTR)
                continue;
            return (int)k;
        }
        off += (size_t)k;
    }
    return 0;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        eg_sys_close(fds[i]);
}

/* Read the 4-byte header with recvmsg, collecting descriptors. Returns payload length or -errno. */
static ssize_t recv_header(int sock, int *fds, int *nfds, int maxfds, int retry_eintr)
{
    unsigned char hdr[EG_HEADER];
    size_t got = 0;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * EG_MAX_FDS)];
    } control;
    *nfds = 0;
    while (got < EG_HEADER) {
        struct iovec iov = {.iov_base = hdr + got, .iov_len = EG_HEADER - got};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (got == 0) {
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
        }
        ssize_t k = eg_sys_recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (k < 0) {
            if (k == -EINTR && (retry_eintr || got > 0))
                continue;
            close_all(fds, *nfds);
            *nfds = 0;
            return k;
        }
        if (got == 0 && msg.msg_controllen > 0) {
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                    continue;
                int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                int *in = (int *)CMSG_DATA(c);
                for (int i = 0; i < n; i++) {
                    if (fds && *nfds < maxfds)
                        fds[(*nfds)++] = in[i];
                    else
                        eg_sys_close(in[i]); /* unexpected descriptors are dropped */
                }
            }
            if (msg.msg_flags & MSG_CTRUNC) {
                close_all(fds, *nfds);
                *nfds = 0;
                return -EPROTO;
            }
        }
        if (k == 0) {
            close_all(fds, *nfds);
            *nfds = 0;
            return got == 0 ? -ENODATA : -ECONNRESET;
        }
        got += (size_t)k;
    }
    uint32_t len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                   (uint32_t)hdr[3] << 24;
    if (len == 0 || len > EG_MAX_PAYLOAD) {
        close_all(fds, *nfds);
        *nfds = 0;
        return len == 0 ? -EPROTO : -EMSGSIZE;
    }
    return (ssize_t)len;
}

ssize_t eg_recv_frame(int sock, char *buf, size_t cap, int *fds, int *nfds, int maxfds,
                      int retry_eintr)
{
    int dummy = 0;
    if (!nfds)
        nfds = &dummy;
    ssize_t len = recv_header(sock, fds, nfds, fds ? maxfds : 0, retry_eintr);
    if (len < 0)
        return len;
    if ((size_t)len > cap) {
        close_all(fds, *nfds);
        *nfds = 0;
        return -EMSGSIZE;
    }
    int r = eg_read_all(sock, buf, (size_t)len);
    if (r < 0) {
        close_all(fds, *nfds);
        *nfds = 0;
        return r;
    }
    return len;
}

ssize_t eg_recv_frame_mm(int sock, char *buf, size_t cap, char **payload, void **map,
                         size_t *maplen)
{
    int nfds = 0;
    *payload = NULL;
    *map = NULL;
    *maplen = 0;
    ssize_t len = recv_header(sock, NULL, &nfds, 0, 1);
    if (len < 0)
        return len;
    char *dst = buf;
    if ((size_t)len > cap) {
        long addr = eg_sys_mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (addr < 0 && addr > -4096)
            return -ENOMEM;
        void *m = (void *)addr;
        *map = m;
        *maplen = (size_t)len;
        dst = m;
    }
    int r = eg_read_all(sock, dst, (size_t)len);
    if (r < 0) {
        if (*map)
            eg_sys_munmap(*map, *maplen);
        *map = NULL;
        *maplen = 0;
        return r;
    }
    *payload = dst;
    return len;
}

int eg_await_readable(int sock)
{
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    int r;
    do {
        r = eg_sys_ppoll(&pfd, 1);
    } while (r == -EINTR);
    return r < 0 ? r : 0;
}

ssize_t eg_recv_frame_alloc(int sock, char **out, int *fds, int *nfds, int maxfds)
{
    int dummy = 0;
    if (!nfds)
        nfds = &dummy;
    *out = NULL;
    ssize_t len = recv_header(sock, fds, nfds, fds ? maxfds : 0, 1);
    if (len < 0)
        return len;
    char *buf = malloc((size_t)len);
    if (!buf) {
        close_all(fds, *nfds);
        *nfds = 0;
        return -ENOMEM;
    }
    int r = eg_read_all(sock, buf, (size_t)len);
    if (r < 0) {
        free(buf);
        close_all(fds, *nfds);
        *nfds = 0;
        return r;
    }
    *out = buf;
    return len;
}

void eg_fields_init(struct eg_fields *f, const char *payload, size_t len)
{
    f->p = payload;
    f->end = payload + len;
}

const char *eg_next(struct eg_fields *f, size_t *len)
{
    if (f->p >= f->end)
        return NULL;
    const char *nul = memchr(f->p, '\0', (size_t)(f->end - f->p));
    if (!nul) { /* unterminated last field: malformed */
        f->p = f->end;
        return NULL;
    }
    const char *s = f->p;
    if (len)
        *len = (size_t)(nul - s);
    f->p = nul + 1;
    return s;
}

int eg_next_long(struct eg_fields *f, long long *out)
{
    size_t n;
    const char *s = eg_next(f, &n);
    if (!s || n == 0 || n > 20)
        return -1;
    int neg = 0;
    size_t i = 0;
    if (s[0] == '-') {
        neg = 1;
        i = 1;
        if (n == 1)
            return -1;
    }
    unsigned long long v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned long long next = v * 10 + (unsigned long long)(s[i] - '0');
        if (next / 10 != v)
            return -1;
        v = next;
    }
    if (v > (unsigned long long)INT64_MAX + (unsigned long long)neg)
        return -1;
    *out = neg ? -(long long)(v - 1) - 1 : (long long)v;
    return 0;
}

int eg_fields_done(const struct eg_fields *f) { return f->p >= f->end; }

int eg_connect(const char *path)
{
    struct sockaddr_un addr;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof addr.sun_path)
        return -ENAMETOOLONG;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, n);
    int fd = eg_sys_socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    int r;
    do {
        r = eg_sys_connect(fd, &addr, (unsigned)(offsetof(struct sockaddr_un, sun_path) + n + 1));
    } while (r == -EINTR);
    if (r < 0 && r != -EISCONN) { /* EISCONN: an interrupted connect completed */
        eg_sys_close(fd);
        return r;
    }
    return fd;
}
