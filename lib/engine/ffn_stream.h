/* Streams a model's FFN weights layer by layer from its file, for a dense
 * prefill under a memory budget where the FFN is not resident.
 *
 * Two staging slots, double-buffered: while the caller computes layer l from
 * one slot, a reader thread reads the next layer into the other with large
 * sequential O_DIRECT reads (buffered reads dropped from the page cache after
 * each read where the file system refuses O_DIRECT). Each selected tensor is
 * read as its byte range rounded out to 4096 (so O_DIRECT offsets, lengths and
 * buffers are aligned); the tensor starts at its offset inside that range.
 *
 * One caller thread per stream. The stream reads the file model_path, which
 * must be the file m was loaded from (its size is checked; every tensor range
 * is checked to lie inside it).
 *
 * Errors: functions that can fail return NULL or -1 and put a message in
 * err (errlen bytes) naming the file and, for reads, the tensor, the offset
 * and the cause. A failed read is retried 3 times before it is reported.
 *
 * Test hooks (environment, read by ffn_stream_open): PI2_STREAM_FAIL_READS=N
 * makes the first N reads fail with EIO; PI2_STREAM_BUFFERED=1 takes the
 * buffered path as if O_DIRECT were refused. */
#ifndef PI2_FFN_STREAM_H
#define PI2_FFN_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

#define FFN_STREAM_ALIGN 4096u             /* O_DIRECT alignment of offsets, lengths, buffers */
#define FFN_STREAM_READ_MAX (8u << 20)     /* bytes per read() */
#define FFN_STREAM_RETRIES 3               /* retries of a failed or short read */

/* Which of a layer's FFN tensors stream (bit flags). */
enum {
    FFN_STREAM_GATE = 1,
    FFN_STREAM_UP = 2,
    FFN_STREAM_DOWN = 4, /* ffn_down_t where the file has it (PWRI), else ffn_down */
    FFN_STREAM_ALL = 7,
};

typedef struct ffn_stream ffn_stream;

/* Opens model_path (O_DIRECT, else buffered reads with the pages dropped
 * after each read, logged once), checks every selected tensor's range, and
 * allocates the two slots (ffn_stream_bytes) and starts the reader thread.
 * NULL with err set: no tensor selected, a bad file, a range outside it,
 * out of memory. */
ffn_stream *ffn_stream_open(const model *m, const char *model_path, unsigned which, char *err, size_t errlen);

/* Bytes ffn_stream_open allocates for m and `which`: two slots, each the
 * largest layer's selected tensors rounded out to 4096. 0 if none selected. */
size_t ffn_stream_bytes(const model *m, unsigned which);

/* Layer l's selected tensors, read completely: reads l now unless it is
 * already read or being read (then waits for it), then starts reading layer
 * `next` into the other slot (-1: none; normally l + 1, or 0 after the last
 * layer when another block of tokens follows).
 *
 * *out = m->layers[l] with the selected weights' `data` pointing into the
 * slot (everything else, and unselected weights, as in m). Those pointers stay
 * valid until the next call: that call keeps them intact while it reads or
 * waits for its own layer, and overwrites them only once it starts reading
 * its `next` into their slot (a call with next = -1 leaves them intact).
 *
 * 0, or -1 with err set (a bad l or next, or the read failed; a failed read
 * of a prefetched layer is reported by the call that asks for it, and a
 * later call reads it again). */
int ffn_stream_layer(ffn_stream *s, int l, int next, layer_weights *out, char *err, size_t errlen);

/* Totals so far: bytes read from the file, seconds the caller waited inside
 * ffn_stream_layer, seconds the reader spent reading. Any may be NULL. */
void ffn_stream_stats(const ffn_stream *s, uint64_t *bytes, double *wait_s, double *read_s);

/* Reads bypass the page cache (O_DIRECT); false after the fallback. */
bool ffn_stream_direct(const ffn_stream *s);

/* Stops the reader (a read in progress ends after its current chunk), joins
 * it and frees everything. NULL is fine. */
void ffn_stream_close(ffn_stream *s);

#endif
