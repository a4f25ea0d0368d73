/* mkdir -p (mkdirs.h). */
#include "util/mkdirs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

static int make(const char *dir, char *failed, unsigned failed_len) {
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) return 0;
    const int e = errno;
    if (failed) snprintf(failed, failed_len, "%s", dir);
    errno = e;
    return -1;
}

int mkdirs(const char *dir, char *failed, unsigned failed_len) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *s = buf + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (make(buf, failed, failed_len)) return -1;
            *s = '/';
        }
    return make(buf, failed, failed_len);
}
