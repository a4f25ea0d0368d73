/* Test helper: synthetic models from build/bin/mkmodel ($BUILD/bin when BUILD
 * is set), written into a directory the test owns; and where the build's
 * programs are, and what they run under, for any test that starts them. */
#ifndef PI2_TEST_MKMODEL_RUN_H
#define PI2_TEST_MKMODEL_RUN_H

#include <stddef.h>

/* mkmodel -o dir/name FLAGS (stderr silenced); path receives dir/name.
 * Returns system()'s status: 0 on success. */
int mkmodel_run(const char *dir, const char *name, const char *flags, char *path, size_t cap);
/* The build directory the tests run from. */
const char *test_build_dir(void);
/* The command the build's programs run under: $PI2_TEST_WRAP (tests/run.sh;
 * qemu-aarch64 for a cross build), else "". */
const char *test_exec_wrap(void);

#endif
