/* execgate-run PYTHON [RUN ARGUMENTS...]: the native front (front.h) for `python -m execgate
 * run` (execgate/console.py), its slow path `PYTHON -m execgate run ARGUMENTS...`. */
#include "front.h"

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    char *slow[] = {argv[1], "-m", "execgate"};
    eg_front(slow, 3, argc - 2, argv + 2);
}
