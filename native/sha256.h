/* SHA-256 (FIPS 180-4): the decision log's chain hash (decisionlog/chain.py's line_hash), for
 * the native front's first record (native/chain.c). No allocation, no global state; not
 * constant-time (it hashes log lines, not secrets). */
#ifndef EXECGATE_SHA256_H
#define EXECGATE_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct eg_sha256 {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    unsigned char block[64];
    size_t used; /* bytes waiting in block */
};

void eg_sha256_init(struct eg_sha256 *c);
void eg_sha256_update(struct eg_sha256 *c, const void *data, size_t len);
/* The digest as 64 lower-case hex digits and a NUL (hashlib's hexdigest()). */
void eg_sha256_hex(struct eg_sha256 *c, char out[65]);

#endif
