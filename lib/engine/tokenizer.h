/* SentencePiece-BPE tokenizer (GGUF tokenizer.ggml.model = "llama"), as llama.cpp's SPM:
 * a space is prepended, spaces become U+2581, symbol pairs are merged by the
 * highest vocab score (leftmost on ties), unknown pieces fall back to <0xXX> byte tokens.
 *
 * Errors: tokenizer_from_gguf returns NULL with a message in err (errlen bytes);
 * tokenizer_encode returns -1, with no message, when out would overflow or memory runs
 * out. The rest cannot fail (tokenizer_piece writes nothing for an id out of range). */
#ifndef PI2_TOKENIZER_H
#define PI2_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"

typedef struct tokenizer tokenizer;

/* Build from GGUF metadata (tokenizer.ggml.tokens/scores/token_type, bos/eos ids). */
tokenizer *tokenizer_from_gguf(const gguf_file *g, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

int tokenizer_n_vocab(const tokenizer *t);
int tokenizer_bos(const tokenizer *t);
int tokenizer_eos(const tokenizer *t);
/* Whether prompts should start with BOS (tokenizer.ggml.add_bos_token, default true):
 * the usual value for tokenizer_encode's add_bos. */
bool tokenizer_adds_bos(const tokenizer *t);

/* Encode text (NUL-terminated) into out[0..max). Returns the token count, or
 * -1 if more than max tokens would be needed or memory runs out. */
int tokenizer_encode(const tokenizer *t, const char *text, int add_bos, int32_t *out, int max);

/* Bytes of one token as generated text: U+2581 -> ' ', <0xXX> -> that byte,
 * control tokens (BOS/EOS/unknown) -> nothing. Returns the length written (<= cap). */
size_t tokenizer_piece(const tokenizer *t, int32_t token, char *buf, size_t cap);

#endif
