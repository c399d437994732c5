/* The decision log's hash chain, written from C (decisionlog/chain.py is the other writer):
 * the native front of `execgate run` appends the first exec's record itself (docs/protocol.md
 * §8), byte for byte the line Python's ChainedFile.append writes for adopt's first record.
 *
 * Not for vfork children or signal handlers: these allocate. Errors are returned, never
 * printed: the caller says what failed.
 */
#ifndef EXECGATE_CHAIN_H
#define EXECGATE_CHAIN_H

#include <stddef.h>

/* A growing string (malloc'ed). `failed` sticks once an allocation failed. */
struct eg_str {
    char *p;
    size_t len, cap;
    int failed;
};

void eg_str_add(struct eg_str *s, const char *data, size_t len);
void eg_str_free(struct eg_str *s);

/* Python's longest word and argument vector in a record, in characters
 * (decisionlog/argv.py's WORD_LIMIT and ARGV_LIMIT). */
#define EG_WORD_LIMIT 4096
#define EG_ARGV_LIMIT 65536

/* Append bytes as the JSON string Python writes for os.fsdecode(bytes) with
 * json.dumps(..., ensure_ascii=True): UTF-8 decoded, every undecodable byte as its
 * surrogate escape (\udcXX), everything outside ' '..'~' as \uXXXX (pairs above U+FFFF).
 * At most limit characters are kept (-1: all); *chars gets the string's full length in
 * characters (may be NULL). */
void eg_json_text(struct eg_str *out, const char *bytes, long limit, long *chars);

/* What the first exec's record says (execgate/adopt.py's first record: decision `run`,
 * source `none`). Texts are bytes as the front has them. */
struct eg_first_record {
    long long time_us; /* Unix time in microseconds */
    const char *session, *cwd, *program, *sandbox;
    long long pid, ppid;
    char *const *argv;
};

/* The record's line without its `prev`: `{"time":…,"source":"none"` (no closing brace). */
void eg_first_record_body(struct eg_str *out, const struct eg_first_record *r);

/* Append one record (body as above) to the chained log at path, as ChainedFile.append does:
 * the log's folder made 0700 when missing, the lock file `.NAME.lock` beside it flock'ed
 * exclusively, `prev` the hash of the file's last line (or of the newest rotated file's, or
 * GENESIS), a torn last line ended first, the files rotated when the line would pass
 * max_bytes, one write on an O_APPEND descriptor. Opens never block or go on into a
 * non-regular file (a FIFO, a device): such a log is refused.
 * 0 when written; else -1, and why holds the one sentence Python's writer warns with
 * (`cannot write the decision log …`). */
int eg_chain_append(const char *path, long long max_bytes, int keep, const char *body,
                    size_t body_len, char *why, size_t why_cap);

#endif
