/* A stand-in for execgate-wrapper that notes each start in $SHIM_LOG, then becomes the real
 * wrapper ($SHIM_REAL) with the same argv (its argv[0] is its mode). Built -static: no
 * interposer in it, as in the real one. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    (void)argc;
    int log = open(getenv("SHIM_LOG"), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log >= 0) {
        write(log, argv[0], strlen(argv[0]));
        write(log, "\n", 1);
        close(log);
    }
    execv(getenv("SHIM_REAL"), argv);
    return 127;
}
