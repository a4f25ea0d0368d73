#include "file_util.h"

#include <stdio.h>
#include <sys/stat.h>

size_t test_file_size(const char *path) {
    struct stat st;
    return stat(path, &st) ? 0 : (size_t)st.st_size;
}

void test_copy_file(const char *from, const char *to, size_t keep) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    char buf[65536];
    size_t n, done = 0;
    while (in && out && done < keep && (n = fread(buf, 1, sizeof buf < keep - done ? sizeof buf : keep - done, in)) > 0)
        done += fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
}
