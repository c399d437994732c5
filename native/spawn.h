/* posix_spawn of a judged descriptor: the interposer's own spawn (docs/protocol.md §3).
 *
 * glibc's posix_spawn can only execute a path, which could be swapped after any check. When the
 * caller decided the program itself (the snapshot said run), this spawn executes the very
 * descriptor that was judged (execveat AT_EMPTY_PATH, close-on-exec: no #! is read from it), in
 * a child that shares the caller's memory until it execs (CLONE_VM | CLONE_VFORK, as glibc's
 * own), after applying the caller's attributes and file actions in glibc's order and with its
 * error rules. No wrapper is started: that is one exec fewer for every spawn (make, cargo).
 *
 * The file actions live in glibc's private struct; its layout is checked once per process
 * against actions built with glibc's own functions, never assumed. What this spawn cannot do
 * exactly (an unknown action or flag, a layout that does not check out) is left to glibc's
 * posix_spawn and the wrapper.
 */
#ifndef EXECGATE_SPAWN_H
#define EXECGATE_SPAWN_H

#include <spawn.h>
#include <sys/types.h>

/* Check glibc's file-action layout, once per process (it builds actions with glibc's own
 * functions: malloc, dlsym). Called where the program itself builds file actions (its
 * posix_spawn_file_actions_init; init: glibc's), never from posix_spawn, which may be called in
 * a signal handler or a vfork child. Thread-safe; not async-signal-safe. */
void eg_spawn_check_layout(int (*init)(posix_spawn_file_actions_t *));

/* 1 when eg_spawn_fd carries out these file actions and attributes exactly as glibc would; 0:
 * use glibc's posix_spawn (so always when the layout was never checked). Thread-safe; calls no
 * function that takes a lock. */
int eg_spawn_supported(const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr);

/* Spawn the program open at fd (the judged descriptor, close-on-exec; the caller closes it
 * afterwards) with argv and envp, after attr and fa, as posix_spawn would: 0 and *pid set, or
 * an errno value (an action's or the exec's own failure included, the child then reaped, as
 * glibc reports them). fd survives every file action (it is moved out of an action's way; a
 * closefrom spares it), so the program that starts is the file that was judged. Only after
 * eg_spawn_supported(fa, attr) said 1. Thread-safe; not async-signal-safe. */
int eg_spawn_fd(pid_t *pid, int fd, const posix_spawn_file_actions_t *fa,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);

#endif
