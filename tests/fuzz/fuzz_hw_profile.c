/* libFuzzer harness: the hardware profile's text file (planner/hw_profile_file.c
 * hw_profile_read), then an interpolation of what loads. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../../planner/hw_profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0; /* fmemopen refuses an empty buffer */
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f) return 0;
    char err[512];
    hw_profile h;
    if (hw_profile_read(&h, f, "fuzz.txt", err, sizeof err) == 0) (void)hw_io_iops(&h, 10000, 3);
    fclose(f);
    return 0;
}
