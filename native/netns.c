/* Proxy mode's network namespace (see netns.h). */
#include "netns.h"

#include "sandbox.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int say(char *msg, size_t cap, int err, const char *what)
{
    snprintf(msg, cap, "sandbox: proxy network: %s: %s", what, strerror(err));
    return -err;
}

/* A new network namespace: directly with CAP_SYS_ADMIN, else in a new user namespace (which
 * the mount namespace entered later then belongs to as well). */
static int enter_netns(char *msg, size_t cap)
{
    if (unshare(CLONE_NEWNET) == 0)
        return 0;
    if (errno != EPERM)
        return say(msg, cap, errno, "unshare(CLONE_NEWNET)");
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNET) < 0)
        return say(msg, cap, errno, "not privileged, and no user namespace either");
    const char *what = NULL;
    int r = sb_map_own_ids(uid, gid, &what);
    if (r < 0)
        return say(msg, cap, -r, what);
    return 0;
}

static int loopback_up(char *msg, size_t cap)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return say(msg, cap, errno, "socket");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    int r = 0;
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        r = say(msg, cap, errno, "loopback flags");
    } else {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
            r = say(msg, cap, errno, "bringing loopback up");
    }
    close(s);
    return r;
}

int sb_enter_proxy_netns(const struct sb_config *c, long long spawn_id, char *msg, size_t cap)
{
    if (c->proxy_port <= 0 || c->proxy_report < 0)
        return say(msg, cap, EINVAL, "no proxy port or report socket");
    int r = enter_netns(msg, cap);
    if (r < 0 || (r = loopback_up(msg, cap)) < 0)
        return r;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0)
        return say(msg, cap, errno, "socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->proxy_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1024) < 0) {
        r = say(msg, cap, errno, "listening on 127.0.0.1");
        close(l);
        return r;
    }
    char text[64];
    int n = snprintf(text, sizeof text, "%lld %d", spawn_id, (int)getpid());
    struct iovec iov = {.iov_base = text, .iov_len = (size_t)n};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &l, sizeof l);
    ssize_t k;
    while ((k = sendmsg(c->proxy_report, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    r = k < 0 ? say(msg, cap, errno, "handing the listener to the proxy") : 0;
    close(l);
    return r;
}
