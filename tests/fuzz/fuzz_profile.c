/* libFuzzer harness: model profiles (lib/calib/model_profile_file.c
 * model_profile_parse, then a co-activation lookup of what loads). */
#include <stddef.h>
#include <stdint.h>

#include "calib/model_profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    model_profile p;
    if (model_profile_parse(&p, data, size, "fuzz.profile", err, sizeof err) == 0) {
        (void)model_profile_cofired(&p, p.n_layer - 1, 0, p.n_ff - 1);
        model_profile_free(&p);
    }
    return 0;
}
