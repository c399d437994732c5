/* The forbidden program: proves it ran by creating $DIR/forbidden-ran (DIR: its argv[0]'s
 * folder is not reliable under races, so the path is compiled in). */
#include <fcntl.h>
#include <unistd.h>
int main(void)
{
    int fd = open(RAN_FILE, O_WRONLY | O_CREAT, 0666);
    if (fd >= 0)
        close(fd);
    return 0;
}
