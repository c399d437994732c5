/* The native front of `execgate run` (front.c, docs/protocol.md §8). */
#ifndef EXECGATE_FRONT_H
#define EXECGATE_FRONT_H

/* Run `execgate run RUN...` (the nrun words after `run`) from its start-up plan, or exec the
 * slow path: slow[0..nslow) (an executable and its first arguments, e.g. `PYTHON -m execgate`)
 * followed by `run` and RUN, with EXECGATE_FRONT_DECLINED=1 in its environment. Never
 * returns. For the process's main thread only: it becomes a child subreaper, blocks and
 * reads signals, forks the session's server and launcher and waits for them. */
void eg_front(char *const *slow, int nslow, int nrun, char **run) __attribute__((noreturn));

#endif
