/* A synthetic SentencePiece ("llama") vocabulary for generated models:
 * <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then "▁" and the
 * printable ASCII characters, "▁"+letter/digit, common English words and
 * fragments, then generated letter n-grams, up to the requested size.
 * Every multi-character piece can be built by merging two shorter pieces
 * (its prefix chain is in the vocabulary), so SPM merging reaches it; scores
 * fall with the index, so common words win over generated n-grams.
 *
 * Errors: synth_vocab_build returns -1 with a message in err (errlen bytes)
 * and leaves v empty. */
#ifndef PI2_SYNTH_VOCAB_H
#define PI2_SYNTH_VOCAB_H

#include <stddef.h>
#include <stdint.h>

/* GGUF tokenizer.ggml.token_type values */
enum { SYNTH_TOK_NORMAL = 1, SYNTH_TOK_UNKNOWN = 2, SYNTH_TOK_CONTROL = 3, SYNTH_TOK_BYTE = 6 };

typedef struct {
    int n;
    char **text;       /* NUL-terminated UTF-8 pieces */
    float *score;
    int32_t *type;
} synth_vocab;

/* The smallest vocabulary: specials, bytes, "▁" and printable ASCII. */
#define SYNTH_VOCAB_MIN (3 + 256 + 1 + 94)
#define SYNTH_VOCAB_MAX (1 << 22)

/* Build n pieces. Returns 0, or -1 with a message (n out of range, out of memory). */
int synth_vocab_build(synth_vocab *v, int n, char *err, size_t errlen);
void synth_vocab_free(synth_vocab *v);

#endif
