"""EG1 messages: what goes on the wire parses back to the same thing; bad input is refused."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execgate.gate import protocol
from execgate.gate.channel import Channel, ChannelClosed
from execgate.gate.protocol import ExecRequest, ProtocolError

field_bytes = st.binary(max_size=40).filter(lambda b: b"\0" not in b)


def payload_of(frame: bytes) -> list[bytes]:
    (length,) = protocol.HEADER.unpack_from(frame)
    assert len(frame) == protocol.HEADER.size + length
    return protocol.split_payload(frame[protocol.HEADER.size :])


@given(
    argv=st.lists(field_bytes, max_size=8),
    path=field_bytes,
    cwd=field_bytes,
    interpreters=st.lists(st.tuples(field_bytes, field_bytes), max_size=4),
)
def test_exec_request_round_trips_with_empty_and_non_utf8_fields(argv, path, cwd, interpreters):
    request = ExecRequest(
        token=b"ab" * 16, via="execve", pid=12, ppid=1, cwd=cwd, path=path,
        interpreters=tuple(interpreters), argv=tuple(argv),
    )  # fmt: skip
    frame = protocol.encode_exec_request(request)
    assert protocol.parse_exec_request(payload_of(frame)) == request


@given(env=st.lists(field_bytes, max_size=6), fds=st.lists(st.integers(0, 1000), max_size=5))
def test_claim_round_trips(env, fds):
    claim = protocol.ClaimRequest(token=b"t", ticket=b"k", fd_numbers=tuple(fds), env=tuple(env))
    assert protocol.parse_claim(payload_of(protocol.encode_claim(claim))) == claim


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"EG1",  # no trailing NUL
        b"EG2\0run\0",
        b"EG1\0",
        b"EG1\0exec\0tok\0",
        b"EG1\0claim\0t\0k\0+1\0\0",  # "+1" is not plain decimal
    ],
)
def test_malformed_payloads_are_refused(payload):
    with pytest.raises(ProtocolError):
        fields = protocol.split_payload(payload)
        if fields[0] == b"exec":
            protocol.parse_exec_request(fields)
        elif fields[0] == b"claim":
            protocol.parse_claim(fields)
        else:
            raise ProtocolError("not a request")


def test_argv_count_must_match():
    frame = protocol.encode_exec_request(
        ExecRequest(b"t", "execve", 1, 1, b"/", b"/bin/true", (), (b"true",))
    )
    fields = payload_of(frame)
    fields[8] = b"2"  # ARGC (after NINTERP = 0)
    with pytest.raises(ProtocolError):
        protocol.parse_exec_request(fields)


def test_interpreter_count_is_checked():
    frame = protocol.encode_exec_request(
        ExecRequest(b"t", "execve", 1, 1, b"/", b"/s", ((b"/bin/sh", b""),), (b"s",))
    )
    fields = payload_of(frame)
    for bad in (b"5", b"-1", b"2", b"x"):  # more than the kernel follows, negative, too many
        fields[7] = bad
        with pytest.raises(ProtocolError):
            protocol.parse_exec_request(fields)


def test_signal_numbers_are_checked():
    assert protocol.parse_signal([b"signal", b"15"]) == 15
    for bad in (b"0", b"99", b"-3", b"x"):
        with pytest.raises(ProtocolError):
            protocol.parse_signal([b"signal", bad])


def test_channel_carries_frames_and_descriptors_across_a_real_socket():
    async def main() -> None:
        left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        a, b = Channel(left), Channel(right)
        read_end, write_end = os.pipe()
        big = b"x" * 300_000  # bigger than a socket buffer: sent in several pieces
        sender = asyncio.ensure_future(a.send(protocol.encode("claim", big), [write_end]))
        fields, fds = await b.recv()
        await sender
        assert fields == [b"claim", big]
        assert len(fds) == 1
        os.write(fds[0], b"through the passed descriptor")
        assert os.read(read_end, 100) == b"through the passed descriptor"
        for fd in (*fds, read_end, write_end):
            os.close(fd)
        a.close()
        with pytest.raises(ChannelClosed):
            await b.recv()
        b.close()

    asyncio.run(main())


env_entry = st.builds(
    lambda name, value: name + b"=" + value,
    st.sampled_from([b"A", b"B", b"LD_X", b"LD_PRELOAD", b"GATE", b""]),
    st.binary(max_size=6).filter(lambda b: b"\0" not in b),
)


@given(
    argv=st.lists(field_bytes, max_size=5),
    drop=st.lists(field_bytes, max_size=3),
    keep=st.lists(env_entry, max_size=3),
    set_=st.lists(env_entry, max_size=3),
    display=st.text(max_size=20).filter(lambda s: "\0" not in s),
)
def test_authorize_is_the_generic_encoding(argv, drop, keep, set_, display):
    """The hand-rolled hot-path encoder (Authorization) writes exactly what encode_fields would."""
    rules = protocol.EnvRules(
        drop=tuple(drop), drop_prefixes=(b"LD_",), keep=tuple(keep), set=tuple(set_)
    )
    head = ["t1", 30000, b"tok", display, b"/bin/x", b"/"]
    counted = [argv, rules.drop, rules.drop_prefixes, rules.keep, rules.set]
    assert protocol.Authorization(
        lifetime_ms=30000, token=b"tok", display=display, path=b"/bin/x", cwd=b"/",
        argv=argv, env=rules,
    ).frame(b"t1") == protocol.encode_fields("authorize", head, counted)  # fmt: skip


def test_authorize_refuses_nul_and_env_rules_check_their_entries():
    with pytest.raises(ProtocolError):
        protocol.Authorization(
            lifetime_ms=0, token=b"tok", display="", path=b"/x\0y", cwd=b"/", argv=[],
            env=protocol.EnvRules(),
        )  # fmt: skip
    with pytest.raises(ValueError):
        protocol.EnvRules(set=(b"NO_EQUALS",))


@given(env=st.lists(env_entry | field_bytes, max_size=12))
def test_env_rules_apply(env):
    rules = protocol.EnvRules(
        drop=(b"GATE",), drop_prefixes=(b"LD_",), keep=(b"LD_X=1",), set=(b"B=set",)
    )
    out = rules.apply(env)
    names = [e.partition(b"=")[0] for e in out]
    assert out[-1] == b"B=set" and names.count(b"B") == 1
    assert len(names) == len(set(names))  # one entry per name
    for entry in out[:-1]:
        name, sep, _ = entry.partition(b"=")
        assert sep and name != b"GATE"
        assert not name.startswith(b"LD_") or entry == b"LD_X=1"
        same = [e for e in env if b"=" in e and e.partition(b"=")[0] == name]
        assert entry == same[-1] or name == b"LD_X"  # the last value (LD_X: the kept one)


@given(st.integers(1, 2**31), st.integers(1, 2**22), st.integers(0, 2**22), st.integers(0, 2**52))
def test_a_standing_report_is_one_whole_frame(standing_id, pid, ppid, micros):
    """What the launcher writes on the report socket (native/launch.c): a whole frame."""
    datagram = protocol.encode("stood", standing_id, pid, ppid, micros)
    stood = protocol.parse_stood(datagram)
    assert (stood.standing_id, stood.pid, stood.ppid) == (standing_id, pid, ppid)
    assert stood.time == micros / 1e6
    for bad in (
        datagram[:-1],  # cut: the header says more
        datagram + b"\0",
        protocol.encode("stood", standing_id, pid, ppid),  # a field short
        protocol.encode("exited", standing_id, pid, ppid, micros),
        protocol.encode("stood", standing_id, pid, "x", micros),
        b"",
    ):
        with pytest.raises(ProtocolError):
            protocol.parse_stood(bad)
