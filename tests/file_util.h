/* Test helper: file sizes and truncated copies, for tests of readers that
 * must refuse a file cut short. */
#ifndef PI2_TEST_FILE_UTIL_H
#define PI2_TEST_FILE_UTIL_H

#include <stddef.h>

size_t test_file_size(const char *path); /* 0 when it cannot be stat'ed */
/* The first `keep` bytes of from into to (all of it when the file is shorter). */
void test_copy_file(const char *from, const char *to, size_t keep);

#endif
