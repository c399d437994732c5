/* The C decision-log writer (native/chain.c, native/sha256.c) driven from the tests:
 *   chaintool sha256                      < DATA   the SHA-256 of stdin, in hex
 *   chaintool line PREV RECORD...                  the first record's line, chained to PREV
 *   chaintool append PATH MAX KEEP COUNT RECORD... append it COUNT times (the why on stderr)
 * RECORD: TIME_US SESSION PID PPID CWD PROGRAM SANDBOX -- ARGV... */
#include "chain.h"
#include "sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int record(char **a, int n, struct eg_first_record *r)
{
    if (n < 9 || strcmp(a[7], "--"))
        return -1;
    r->time_us = atoll(a[0]);
    r->session = a[1];
    r->pid = atoll(a[2]);
    r->ppid = atoll(a[3]);
    r->cwd = a[4];
    r->program = a[5];
    r->sandbox = a[6];
    r->argv = a + 8;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "sha256")) {
        struct eg_sha256 c;
        eg_sha256_init(&c);
        char buf[4096];
        ssize_t n;
        while ((n = read(0, buf, sizeof buf)) > 0)
            eg_sha256_update(&c, buf, (size_t)n);
        char hex[65];
        eg_sha256_hex(&c, hex);
        puts(hex);
        return 0;
    }
    struct eg_first_record r;
    struct eg_str body = {0};
    if (argc >= 3 && !strcmp(argv[1], "line") && record(argv + 3, argc - 3, &r) == 0) {
        eg_first_record_body(&body, &r);
        printf("%s,\"prev\":\"%s\"}", body.p, argv[2]);
        return body.failed;
    }
    if (argc >= 6 && !strcmp(argv[1], "append") && record(argv + 6, argc - 6, &r) == 0) {
        eg_first_record_body(&body, &r);
        char why[8192];
        for (int i = 0; i < atoi(argv[5]); i++)
            if (eg_chain_append(argv[2], atoll(argv[3]), atoi(argv[4]), body.p, body.len, why,
                                sizeof why) < 0) {
                fprintf(stderr, "%s\n", why);
                return 1;
            }
        return 0;
    }
    fprintf(stderr, "usage: chaintool sha256|line|append ...\n");
    return 2;
}
