/* libFuzzer harness: the GGUF / PWRI reader (lib/gguf/gguf.c gguf_parse),
 * then a look-up of a key and a tensor in what parses. */
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    gguf_file g;
    if (gguf_parse(&g, data, size, "fuzz.gguf", err, sizeof err) == 0) {
        uint64_t v;
        (void)gguf_get_uint(&g, "llama.block_count", &v);
        (void)gguf_find_tensor(&g, "token_embd.weight");
        gguf_close(&g);
    }
    return 0;
}
