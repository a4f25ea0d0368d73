/* libFuzzer harness: the bus's messages (lib/stack/msg.c): msg_unpack, then
 * msg_validate against a 7B-shaped stack's limits, as every receiver does. */
#include <stddef.h>
#include <stdint.h>

#include "stack/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    Pi2__Envelope *env = msg_unpack(data, size, err, sizeof err);
    if (env) {
        /* 7B-shaped: 32 layers of 11008 neurons, 32 heads, 4096 positions, 32000 tokens */
        const msg_limits lim = {32, 11008, 32, 4096, 32000, 1u << 20, 4u << 30, 1u << 30, 4u << 30, 8192};
        (void)msg_validate(env, &lim, err, sizeof err);
        msg_free(env);
    }
    return 0;
}
