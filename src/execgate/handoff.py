"""Handing this CPU to a process just woken, before going on with work that can wait.

On a virtual machine whose idle CPUs wake slowly (the host must run them again first), a
process our write has woken often runs only once this CPU is free: it waits as long as we keep
computing. After waking a process whose work comes first (the shell a call releases, the client
an answer is for), the event loop's thread therefore blocks for a moment, which lets this
CPU's scheduler take the woken process, then yields to it in case our own wake-up from that
block preempted it. The launcher does the same before it exits at a session's end
(native/launch.c). Measured on a 2-CPU VM (``bench/compare_reference.py``, the ``shell`` round
trip after 15 ms of quiet): the client took an answer 700 to 950 µs after it was written, and
30 to 200 µs with this; the round trip went from 1.3-1.45 times the reference's to 1.03-1.07 times.

The block is short; the event loop does nothing else meanwhile.
"""

from __future__ import annotations

import os
import time

#: Long enough for this CPU's scheduler to take the woken process; short enough to go
#: unnoticed by anything else the event loop serves.
PAUSE = 0.0001


def give_way() -> None:
    """Block for :data:`PAUSE`, then yield this CPU to whatever is runnable here."""
    time.sleep(PAUSE)
    os.sched_yield()
