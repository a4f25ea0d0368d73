/* Prompt files (prompts_file.h). */
#include "calib/prompts_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int calib_read_prompts(const char *path, char ***out, char *err, size_t errlen) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        err_set(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char **lines = NULL, *line = NULL;
    size_t cap = 0;
    int n = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        char **grown = realloc(lines, sizeof *lines * (size_t)(n + 1));
        char *copy = strdup(line);
        if (!grown || !copy) {
            free(copy);
            calib_free_prompts(grown ? grown : lines, n);
            lines = NULL, n = -1;
            err_set(err, errlen, "out of memory reading %s", path);
            break;
        }
        lines = grown;
        lines[n++] = copy;
    }
    free(line);
    fclose(f);
    *out = lines;
    return n;
}

void calib_free_prompts(char **prompts, int n) {
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
}
