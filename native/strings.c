/* The string functions libexecgate.so calls, its own and hidden (never exported, so they
 * interpose nothing).
 *
 * Why: the exec path runs in a child that was just fork()ed, where the first touch of each libc
 * text page is a page fault, and without -z now a libc function is bound at its first call
 * (the dynamic loader's lookup, in a vfork child too). With these, the exec path calls nothing
 * outside the library. The strings involved are short (paths, environment entries), so simple
 * loops are enough.
 *
 * The empty asm statements keep the compiler from recognising a loop as memcpy/memset and
 * turning it into a call to the very function it is in.
 */
#include <stddef.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define NO_IDIOM(p) __asm__("" : "+r"(p))

HIDDEN void *memcpy(void *restrict dst, const void *restrict src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--) {
        NO_IDIOM(d);
        *d++ = *s++;
    }
    return dst;
}

HIDDEN void *memmove(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d < s) {
        while (n--) {
            NO_IDIOM(d);
            *d++ = *s++;
        }
    } else {
        while (n--) {
            NO_IDIOM(d);
            d[n] = s[n];
        }
    }
    return dst;
}

HIDDEN void *memset(void *dst, int c, size_t n)
{
    unsigned char *d = dst;
    while (n--) {
        NO_IDIOM(d);
        *d++ = (unsigned char)c;
    }
    return dst;
}

HIDDEN int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y)
            return *x - *y;
    return 0;
}

HIDDEN void *memchr(const void *s, int c, size_t n)
{
    const unsigned char *p = s;
    for (; n; n--, p++)
        if (*p == (unsigned char)c)
            return (void *)p;
    return NULL;
}

HIDDEN size_t strlen(const char *s)
{
    const char *p = s;
    while (*p) {
        NO_IDIOM(p);
        p++;
    }
    return (size_t)(p - s);
}

HIDDEN size_t strnlen(const char *s, size_t max)
{
    size_t n = 0;
    while (n < max && s[n])
        n++;
    return n;
}

HIDDEN int strcmp(const char *a, const char *b)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    while (*x && *x == *y)
        x++, y++;
    return *x - *y;
}

HIDDEN int strncmp(const char *a, const char *b, size_t n)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (; n; n--, x++, y++) {
        if (*x != *y)
            return *x - *y;
        if (!*x)
            return 0;
    }
    return 0;
}

HIDDEN char *strchrnul(const char *s, int c)
{
    while (*s && *s != (char)c)
        s++;
    return (char *)s;
}

HIDDEN char *strchr(const char *s, int c)
{
    const char *p = strchrnul(s, c);
    return *p == (char)c ? (char *)p : NULL;
}

HIDDEN char *strrchr(const char *s, int c)
{
    const char *last = NULL;
    do {
        if (*s == (char)c)
            last = s;
    } while (*s++);
    return (char *)last;
}
