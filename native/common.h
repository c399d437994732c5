/* Frames and fields of the EG1 protocol (docs/protocol.md §2), shared by every native program.
 *
 * Everything here is async-signal-safe and malloc-free except eg_recv_frame_alloc(), so the
 * interposer can use it inside vfork children and signal handlers.
 */
#ifndef EXECGATE_COMMON_H
#define EXECGATE_COMMON_H

#include <stddef.h>
#include <sys/types.h>

#define EG_TAG "EG1"
#define EG_MAX_PAYLOAD (16u << 20)
#define EG_MAX_FDS 253
#define EG_HEADER 4
/* A held spawn's hold socket, in the child (docs/protocol.md §7 "Held spawns"). */
#define EG_HOLD_FD 3

/* A frame under construction in caller-provided memory. The first EG_HEADER bytes are the
 * length header, filled in by eg_send_frame(). `overflow` sticks once a field did not fit. */
struct eg_buf {
    char *data;
    size_t len;
    size_t cap;
    int overflow;
};

void eg_buf_init(struct eg_buf *b, char *mem, size_t cap);
void eg_put_n(struct eg_buf *b, const char *s, size_t n);
void eg_put(struct eg_buf *b, const char *s);
void eg_put_long(struct eg_buf *b, long long v);
void eg_put_ulong(struct eg_buf *b, unsigned long long v);

/* Fill in b's length header: b->data[0..b->len) is then one whole frame. 0, or -EMSGSIZE if
 * b overflowed, is empty or is too large. Async-signal-safe. */
int eg_seal_frame(struct eg_buf *b);

/* Send b as one frame; fds (may be NULL/0) ride on the first sendmsg. 0 or -errno
 * (-EMSGSIZE if b overflowed or is too large, -E2BIG for too many fds). */
int eg_send_frame(int sock, struct eg_buf *b, const int *fds, int nfds);

/* Receive one frame into buf (cap bytes). Returns the payload length, or:
 *   -ENODATA     clean EOF before any byte of the header
 *   -ECONNRESET  EOF in the middle of the frame
 *   -EMSGSIZE    payload larger than cap (or EG_MAX_PAYLOAD)
 *   -EPROTO      empty payload, or descriptors were truncated (MSG_CTRUNC)
 *   -errno       any other failure (EINTR is returned, not retried, only before the first
 *                byte arrived and only if retry_eintr is 0: callers that forward signals
 *                need to see it)
 * Received descriptors (close-on-exec) are stored in fds (up to maxfds), count in *nfds;
 * on error they are closed. */
ssize_t eg_recv_frame(int sock, char *buf, size_t cap, int *fds, int *nfds, int maxfds,
                      int retry_eintr);

/* Receive one frame whose payload goes into buf when it fits in cap bytes, else into a fresh
 * anonymous mapping (*map, *maplen: the caller munmaps it). *payload points at the payload.
 * Descriptors that arrive are closed. Errors as eg_recv_frame (EINTR retried).
 * Async-signal-safe (no malloc). */
ssize_t eg_recv_frame_mm(int sock, char *buf, size_t cap, char **payload, void **map,
                         size_t *maplen);

/* Wait until sock is readable or hung up: 0, or -errno (EINTR retried). Call it before a
 * blocking receive of an answer: a receive's sleep is also woken by the write-space wake-up
 * the peer's read of our request causes (a wasted wake-up, often of an idle CPU); a poll's
 * sleep only by POLLIN. Async-signal-safe. */
int eg_await_readable(int sock);

/* Same, but the payload is malloc'ed (caller frees *out). Not for vfork children. */
ssize_t eg_recv_frame_alloc(int sock, char **out, int *fds, int *nfds, int maxfds);

/* Reading fields out of a received payload. */
struct eg_fields {
    const char *p;
    const char *end;
};

void eg_fields_init(struct eg_fields *f, const char *payload, size_t len);
/* Next field (NUL-terminated in place) or NULL when none is left. */
const char *eg_next(struct eg_fields *f, size_t *len);
/* Next field as a decimal integer; -1 if absent or not a well-formed number. */
int eg_next_long(struct eg_fields *f, long long *out);
/* Nonzero when every field has been consumed. */
int eg_fields_done(const struct eg_fields *f);

/* Connect a close-on-exec stream socket to a pathname Unix socket: fd or -errno. */
int eg_connect(const char *path);

/* write()/read() until done, retrying EINTR: 0 or -errno (-ECONNRESET on EOF for read). */
int eg_write_all(int fd, const void *buf, size_t n);
int eg_read_all(int fd, void *buf, size_t n);

/* Small async-signal-safe string helpers (no locale, no malloc). */
size_t eg_strlen(const char *s);
/* Format v in decimal into out (>= 24 bytes); returns the length. */
size_t eg_fmt_long(char *out, long long v);

#endif
