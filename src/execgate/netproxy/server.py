"""The proxy: accepts on the listeners the sandbox hands over, asks a :class:`Gatekeeper`
about each connection, and relays what it admits.

One task group per listener, one task per connection in it. A listener arrives over the
launcher's report socket with ``"SPAWN_ID PID"`` (native/netns.c): every connection on it
belongs to that spawn of the session. The client says where it wants to go; the gatekeeper
decides and names the addresses to dial (resolved once, checked); the proxy dials exactly
those.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc
from anyio.from_thread import start_blocking_portal

from execgate.netproxy import wire
from execgate.netproxy.relay import recv_some, relay, send_all
from execgate.netproxy.resolve import IPAddress
from execgate.netproxy.wire import Target, WireError

log = logging.getLogger("execgate.netproxy")

#: Seconds a client has to send its request head, and the proxy to reach a server.
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 15.0
#: Open connections per listener: beyond it a newcomer is closed at once, so a session cannot
#: use up the server's descriptors (which the gate needs to answer execs).
MAX_CONNECTIONS = 1024


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a listener came from: the spawn of the session whose network namespace it is in,
    and that spawn's process."""

    spawn_id: int
    pid: int


@dataclass(frozen=True, slots=True)
class Connection:
    """One client connection's request, as the gatekeeper sees it."""

    target: Target
    origin: Origin
    peer_port: int  # the client's port on the namespace's loopback (finds its process)


@dataclass(frozen=True, slots=True)
class Admission:
    """The gatekeeper's answer: dial ``addresses`` (in order), or refuse saying ``reason``."""

    addresses: tuple[IPAddress, ...] = ()
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return bool(self.addresses)


class Gatekeeper(Protocol):
    async def admit(self, connection: Connection) -> Admission:
        """Decide one connection (may take long: a human may be asked). Never raises."""
        ...

    def connected(self, connection: Connection, address: IPAddress | None, error: str) -> None:
        """The outcome of dialling an admitted connection (``error`` empty on success)."""
        ...


class NetProxy:
    def __init__(self, gatekeeper: Gatekeeper) -> None:
        self.gatekeeper = gatekeeper

    async def serve_reports(self, report: socket.socket) -> None:
        """Receive listeners on ``report`` and serve each, until cancelled."""
        report.setblocking(False)
        async with anyio.create_task_group() as group:
            while True:
                try:
                    data, fds = _recv_fds(report)
                except BlockingIOError:
                    await anyio.wait_readable(report)
                    continue
                if not data and not fds:
                    break  # the launcher is gone: its children can send nothing more
                listeners = [socket.socket(fileno=fd) for fd in fds]
                origin = _origin(data)
                if origin is None or len(listeners) != 1:
                    log.warning("proxy: malformed listener report %r", data[:64])
                    for sock in listeners:
                        sock.close()
                    continue
                group.start_soon(self.serve_listener, listeners[0], origin)

    async def serve_listener(self, listener: socket.socket, origin: Origin) -> None:
        """Accept on ``listener`` until its spawn's process has exited (or cancelled); each
        connection in this task group, served to its end."""
        listener.setblocking(False)
        slots = anyio.Semaphore(MAX_CONNECTIONS)
        accepting = anyio.CancelScope()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_cancel_when_gone, origin.pid, accepting)
                with accepting:
                    await self._accept(listener, origin, slots, group)
                listener.close()  # the namespace goes with its last holder
        finally:
            listener.close()

    async def _accept(
        self,
        listener: socket.socket,
        origin: Origin,
        slots: anyio.Semaphore,
        group: anyio.abc.TaskGroup,
    ) -> None:
        while True:
            try:
                conn, address = listener.accept()
            except BlockingIOError:
                await anyio.wait_readable(listener)
                continue
            except OSError as exc:  # EMFILE and friends: pause instead of spinning
                log.error("proxy: accept failed: %s", exc)
                await anyio.sleep(0.05)
                continue
            try:
                slots.acquire_nowait()  # released when the connection is done
            except anyio.WouldBlock:
                log.warning("proxy: %d connections open: refusing more", MAX_CONNECTIONS)
                conn.close()
                continue
            conn.setblocking(False)
            port = address[1] if isinstance(address, tuple) else 0
            group.start_soon(self._serve, conn, origin, port, slots)

    async def _serve(
        self, conn: socket.socket, origin: Origin, peer_port: int, slots: anyio.Semaphore
    ) -> None:
        try:
            await self._handle(conn, origin, peer_port)
        except Exception:  # one connection never takes the proxy down
            log.exception("proxy: connection failed")
        finally:
            conn.close()
            slots.release()

    async def _handle(self, conn: socket.socket, origin: Origin, peer_port: int) -> None:
        buffer = bytearray()
        with anyio.move_on_after(HEAD_TIMEOUT) as scope:
            while not buffer:
                chunk = await recv_some(conn)
                if not chunk:
                    return
                buffer += chunk
        if scope.cancelled_caught:
            return
        if buffer[0] == wire.SOCKS_VERSION:
            await self._socks(conn, buffer, origin, peer_port)
        else:
            await self._http(conn, buffer, origin, peer_port)

    async def _read_until(
        self, conn: socket.socket, buffer: bytearray, complete: Callable[[bytearray], object]
    ) -> bool:
        """Read into ``buffer`` until ``complete(buffer)`` is true; False at end of stream or
        when the client takes too long."""
        with anyio.move_on_after(HEAD_TIMEOUT):
            while not complete(buffer):
                chunk = await recv_some(conn)
                if not chunk:
                    return False
                buffer += chunk
            return True
        return False

    async def _http(
        self, conn: socket.socket, buffer: bytearray, origin: Origin, peer_port: int
    ) -> None:
        try:
            if not await self._read_until(conn, buffer, lambda b: wire.head_end(b) >= 0):
                return
            end = wire.head_end(buffer)
            request = wire.parse_http_head(bytes(buffer[:end]))
        except WireError as exc:
            await send_all(conn, wire.http_response(exc.status, f"execgate proxy: {exc}"))
            return
        rest = bytes(buffer[end:])
        connection = Connection(request.target, origin, peer_port)
        admission = await self.gatekeeper.admit(connection)
        if not admission.allowed:
            await send_all(conn, wire.http_response(403, admission.reason))
            return
        upstream, error = await self._dial(connection, admission.addresses)
        if upstream is None:
            await send_all(conn, wire.http_response(502, f"execgate proxy: {error}"))
            return
        with upstream:
            if request.target.protocol == "https":
                await send_all(conn, wire.http_response(200))
            else:
                await send_all(upstream, request.forward)
            if rest:
                await send_all(upstream, rest)
            await relay(conn, upstream)

    async def _socks(
        self, conn: socket.socket, buffer: bytearray, origin: Origin, peer_port: int
    ) -> None:
        try:
            if not await self._read_until(conn, buffer, lambda b: wire.socks_greeting(b) >= 0):
                return
        except WireError:
            await send_all(conn, wire.SOCKS_METHOD_REFUSED)
            return
        del buffer[: wire.socks_greeting(buffer)]
        await send_all(conn, wire.SOCKS_METHOD_REPLY)
        try:
            if not await self._read_until(conn, buffer, lambda b: wire.socks_request(b)):
                return
            parsed = wire.socks_request(buffer)
        except WireError as exc:
            await send_all(conn, wire.socks_reply(exc.socks))
            return
        assert parsed is not None
        length, target = parsed
        rest = bytes(buffer[length:])
        connection = Connection(target, origin, peer_port)
        admission = await self.gatekeeper.admit(connection)
        if not admission.allowed:
            await send_all(conn, wire.socks_reply(wire.SOCKS_NOT_ALLOWED))
            return
        upstream, _error = await self._dial(connection, admission.addresses)
        if upstream is None:
            await send_all(conn, wire.socks_reply(wire.SOCKS_HOST_UNREACHABLE))
            return
        with upstream:
            await send_all(conn, wire.socks_reply(wire.SOCKS_OK))
            if rest:
                await send_all(upstream, rest)
            await relay(conn, upstream)

    async def _dial(
        self, connection: Connection, addresses: Sequence[IPAddress]
    ) -> tuple[socket.socket | None, str]:
        """Connect to the first of ``addresses`` that answers (exactly those: no lookup)."""
        error = "no address"
        port = connection.target.port
        for address in addresses:
            family = socket.AF_INET if address.version == 4 else socket.AF_INET6
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                with anyio.fail_after(CONNECT_TIMEOUT):
                    await _connect(sock, (str(address), port))
            except (OSError, TimeoutError) as exc:
                sock.close()
                error = f"cannot connect to {address} port {port}: " + (
                    exc.strerror if isinstance(exc, OSError) and exc.strerror else "timed out"
                )
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.gatekeeper.connected(connection, address, "")
            return sock, ""
        self.gatekeeper.connected(connection, None, error)
        return None, error


async def _cancel_when_gone(pid: int, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once process ``pid`` has exited (at once if it is gone already): a
    listener outliving its spawn would hold a network namespace and a descriptor of the
    server for the rest of the session, one per confined spawn. Without pidfds (Linux < 5.3)
    the listener stays until the session ends."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        scope.cancel()
        return
    except OSError:
        return
    try:
        await anyio.wait_readable(pidfd)
        scope.cancel()
    finally:
        os.close(pidfd)


async def _connect(sock: socket.socket, address: tuple[str, int]) -> None:
    code = sock.connect_ex(address)
    if code == 0:
        return
    if code not in (errno.EINPROGRESS, errno.EAGAIN):
        raise OSError(code, os.strerror(code))
    await anyio.wait_writable(sock)
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise OSError(code, os.strerror(code))


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _ = sock.recvmsg(256, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % fds.itemsize
            fds.frombytes(payload[:usable])
    return data, list(fds)


def _origin(data: bytes) -> Origin | None:
    with contextlib.suppress(ValueError):
        spawn, pid = data.decode("ascii").split(" ")
        return Origin(int(spawn), int(pid))
    return None


class ProxyThread:
    """A :class:`NetProxy` serving the listeners reported on ``report``, on an event loop of
    its own in a thread: relaying never holds up the gate's answers to execs."""

    def __init__(self, proxy: NetProxy, report: socket.socket) -> None:
        self._portal_cm = start_blocking_portal(name="execgate-proxy")
        self._portal = self._portal_cm.__enter__()
        self._served = self._portal.start_task_soon(proxy.serve_reports, report)

    def stop(self) -> None:
        """Close every listener and connection and end the thread (blocks until it ended)."""
        self._served.cancel()
        with contextlib.suppress(Exception):
            self._portal_cm.__exit__(None, None, None)
