#include "mkmodel_run.h"

#include <stdio.h>
#include <stdlib.h>

const char *test_build_dir(void) {
    const char *b = getenv("BUILD");
    return b && *b ? b : "build";
}

const char *test_exec_wrap(void) {
    const char *w = getenv("PI2_TEST_WRAP");
    return w ? w : "";
}

int mkmodel_run(const char *dir, const char *name, const char *flags, char *path, size_t cap) {
    char cmd[1536];
    snprintf(path, cap, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "%s %s/bin/mkmodel -o %s %s 2>/dev/null", test_exec_wrap(), test_build_dir(), path, flags);
    return system(cmd);
}
