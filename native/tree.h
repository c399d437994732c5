/* execgate's process-tree killing, shared by the session launcher (native/launch.c) and the
 * native front of `execgate run` (native/front.c): both are child subreapers, so every process
 * of their session stays their descendant, and both end a session by signalling every one of
 * them, top-down, without ever signalling a reused pid.
 *
 * Not async-signal-safe (malloc, opendir); for the main loop of a single-threaded program.
 */
#ifndef EXECGATE_TREE_H
#define EXECGATE_TREE_H

#include <stddef.h>
#include <sys/types.h>

/* /proc/PID/stat: parent pid and start time (clock ticks since boot); either may be NULL.
 * 0, or -1 when the process is gone or the file is unreadable. */
int eg_read_stat(pid_t pid, pid_t *ppid, unsigned long long *start);

/* The parent pid of the live process behind pidfd, from the kernel's pidfd information
 * (PIDFD_GET_INFO, Linux 6.13): no /proc read. 0, or -1 when that is not available (an older
 * kernel, the process gone): the caller reads /proc. */
int eg_pidfd_ppid(int pidfd, pid_t *ppid);

/* Send sig (and SIGCONT after it when also_cont) to every descendant of self (the calling
 * process), breadth first, walking /proc/PID/task/TID/children. self's own children are
 * signalled with kill() (they cannot be reused before self reaps them); deeper ones through a
 * pidfd opened before checking they are still the child of the process that was walked, so a
 * recycled pid is never signalled. spare (0: none): a child of self that is left alone, with
 * its descendants. Returns how many were signalled. */
size_t eg_signal_descendants(pid_t self, pid_t spare, int sig, int also_cont);

#endif
