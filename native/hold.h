/* A held spawn's wait for its call (docs/protocol.md §7 "Held spawns").
 *
 * The launcher starts the session's shell ahead of the call it will serve: it execs the judged
 * shell with a placeholder command, in the session's sandbox, with one end of a socket pair it
 * made at EG_HOLD_FD and EXECGATE_HOLD set. The dynamic loader and libc start-up run then;
 * the interposer's constructor (eg_hold) waits on the socket before the shell's own code runs.
 * `release` brings the call: the working directory, the descriptors, the arguments and the
 * environment, which the constructor puts in place (the argument and environment strings are
 * written over the placeholder's, so /proc/PID/cmdline and environ read the call's) before the
 * shell's main sees them. While it waits it keeps the locale its environment names loaded
 * (the process's own locale stays "C"). End-of-file (never released, or the launcher gone)
 * exits 126.
 *
 * A hold is honoured only through a socket the process's parent made (SO_PEERCRED), i.e. the
 * spawner's own word; anything else (an inherited variable, another process's socket) is
 * ignored, and the program runs as exec'd. What a parent can hand over this way it could have
 * given at the exec itself.
 *
 * Called once, from the constructor, single-threaded, before eg_session_load (the session's
 * variables are the call's). Not async-signal-safe concerns: nothing else runs yet. */
#ifndef EXECGATE_HOLD_H
#define EXECGATE_HOLD_H

/* When envp asks for a hold that checks out: wait for the release and apply it (argv's
 * strings rewritten in place, *envp and environ replaced); otherwise return at once with
 * nothing changed. Exits 126 when a checked hold ends without a usable release. */
void eg_hold(int argc, char **argv, char ***envp);

#endif
