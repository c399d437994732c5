/* execgate: the installed command (README, docs/protocol.md §8).
 *
 * A native program, so that `execgate run` starts without Python: `execgate run ARGUMENTS…`
 * is the native front (front.h) in this very process. Every other command, and `run` when the
 * front declines it (its slow path) or EXECGATE_FRONT_DECLINED is set, goes to the Python
 * command line: the console script `execgate-py` installed beside this program (found from
 * /proc/self/exe, so a link to it, as pipx makes, finds its own). The kernel starts that
 * script with the interpreter its `#!` line names, so this program never needs to know which
 * Python the package was installed for. (EXECGATE_FAST_START=0 is the front's to honour.)
 */
#include "front.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PYTHON_CLI "execgate-py"

/* dirname(/proc/self/exe)/execgate-py into out; 0 or -1. */
static int python_cli(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return -1;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash || (size_t)(slash - out) + sizeof PYTHON_CLI + 1 > cap)
        return -1;
    memcpy(slash + 1, PYTHON_CLI, sizeof PYTHON_CLI);
    return 0;
}

int main(int argc, char **argv)
{
    static char cli[PATH_MAX];
    if (python_cli(cli, sizeof cli) < 0) {
        fprintf(stderr, "execgate: error: cannot find where this program is (/proc/self/exe)\n");
        return 70;
    }
    char *slow[] = {cli};
    if (argc >= 2 && !strcmp(argv[1], "run") && !getenv("EXECGATE_FRONT_DECLINED"))
        eg_front(slow, 1, argc - 2, argv + 2);
    argv[0] = cli;
    execv(cli, argv);
    fprintf(stderr, "execgate: error: cannot run %s: %s\n", cli, strerror(errno));
    return 70;
}
