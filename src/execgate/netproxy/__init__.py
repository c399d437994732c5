"""The session's network proxy (sandbox network mode ``proxy``, docs/sandbox.md).

The sandboxed session has a network namespace with only loopback; the launcher hands the
server a socket listening on 127.0.0.1 inside it (native/netns.c). The proxy, outside in the
server process, accepts on it and forwards what policy allows: HTTP absolute-form requests,
HTTPS by ``CONNECT`` (judged by host and port, no TLS interception) and SOCKS5 ``CONNECT``.

    wire.py      request heads and SOCKS5 messages: pure parsing and replies
    resolve.py   names to addresses (a hosts file first), and which addresses are internal
    relay.py     moving bytes between two sockets (splice: the data never enters Python)
    server.py    the proxy: one task group per listener, the Gatekeeper interface
"""
