/* libFuzzer harness: plan files (lib/plan/plan_file.c plan_parse). Any bytes
 * give a valid plan or an error; never a crash, a leak or undefined behaviour.
 * The file's checksum would stop almost every mutation at the frame, so an
 * input whose first byte is even is the message alone, framed here with its
 * right checksum: the fuzzer reaches the protobuf decoder and the validation. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_file.h"
#include "util/checksum.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    if (size && data[0] % 2 == 0) {
        const size_t body = size - 1;
        uint8_t *framed = malloc(body + 16);
        if (!framed) return 0;
        memcpy(framed, PLAN_MAGIC, 8);
        memcpy(framed + 8, data + 1, body);
        const uint64_t sum = checksum64(data + 1, body);
        for (int i = 0; i < 8; i++) framed[8 + body + (size_t)i] = (uint8_t)(sum >> (8 * i));
        plan_free(plan_parse(framed, body + 16, "fuzz.pb", err, sizeof err));
        free(framed);
        return 0;
    }
    plan_free(plan_parse(data, size, "fuzz.pb", err, sizeof err));
    return 0;
}
