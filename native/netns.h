/* The network namespace of a sandbox in proxy mode (docs/sandbox.md, "Network through the
 * proxy").
 *
 * A confined child in proxy mode gets a network namespace of its own with nothing but
 * loopback, and in it a TCP socket listening on 127.0.0.1:PORT that the session's proxy, in
 * the server process outside, accepts on: the only way out. The listening socket leaves the
 * namespace by descriptor passing over the launcher's report socket, so nothing inside can
 * reach the proxy's control side, and no relay process runs inside.
 */
#ifndef EXECGATE_NETNS_H
#define EXECGATE_NETNS_H

#include <stddef.h>

struct sb_config;

/* In a freshly fork()ed launcher child that is about to be confined (single-threaded; not
 * for CLONE_VM children): enter a new network namespace -- inside a new user namespace
 * mapping our uid/gid to themselves when we may not create one directly -- bring loopback
 * up, listen on 127.0.0.1:c->proxy_port, and send the listening socket (SCM_RIGHTS) with the
 * text "SPAWN_ID PID" over c->proxy_report. Nothing is left open. 0, or -errno with a
 * one-line message in msg. */
int sb_enter_proxy_netns(const struct sb_config *c, long long spawn_id, char *msg, size_t cap);

#endif
