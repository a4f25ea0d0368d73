/* libFuzzer harness: bundle files (lib/plan/bundle.c bundle_parse, then
 * every bundle_check and bundle_verify of what opens). */
#include <stddef.h>
#include <stdint.h>

#include "plan/bundle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    bundle_file b;
    if (bundle_parse(&b, data, size, "fuzz.bundle", err, sizeof err) == 0) {
        for (int l = 0; l < b.n_layer; l++)
            for (long k = 0; k < b.n_bundles; k++) (void)bundle_check(&b, l, k, b.region[l] + (size_t)k * b.stride);
        (void)bundle_verify(&b, err, sizeof err);
        bundle_close(&b);
    }
    return 0;
}
