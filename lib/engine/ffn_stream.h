/* Streams a model's FFN weights from its file, for a dense prefill under a
 * memory budget where the FFN is not resident.
 *
 * The unit is a piece: a run of a layer's neurons (their gate, up and down_t
 * rows, as prompt_ffn_source hands them to the prompt pass), of up to
 * FFN_STREAM_PIECE_BYTES, so the staging area is a small fraction of a layer
 * and the memory it would take goes to cached neurons; a file with ffn_down
 * (its rows are not neurons) streams whole layers. FFN_STREAM_SLOTS staging
 * slots (two for whole layers: one is read while the caller computes the
 * other): while the caller computes one piece from one slot, a reader thread
 * reads the pieces after it (in layer order, wrapping from the last layer to
 * the first for the next block of a long prompt) into the others, so that
 * during a layer's attention, which needs no FFN rows, the reads get ahead;
 * with large sequential O_DIRECT reads (buffered reads dropped from the page
 * cache after each read where the file system refuses O_DIRECT). Each
 * tensor's rows of a piece are read as their byte range rounded out to 4096
 * (so O_DIRECT offsets, lengths and buffers are aligned); the rows start at
 * their offset inside that range.
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

#include "engine/ffn_mode.h"
#include "engine/model.h"

#define FFN_STREAM_ALIGN 4096u             /* O_DIRECT alignment of offsets, lengths, buffers */
#define FFN_STREAM_READ_MAX (8u << 20)     /* bytes per read() */
#define FFN_STREAM_PIECE_BYTES (8u << 20)  /* a piece's rows at most, unless one step of neurons is more */
#define FFN_STREAM_SLOTS 5                 /* the caller's piece and up to 4 read ahead */
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
 * allocates the slots (ffn_stream_bytes) and starts the reader thread.
 * step: pieces hold a multiple of this many neurons (prompt_pass_neuron_step;
 * n_ff or more: whole layers). NULL with err set: no tensor selected, step <
 * 1, a bad file, a range outside it, out of memory. */
ffn_stream *ffn_stream_open(const model *m, const char *model_path, unsigned which, long step, char *err,
                            size_t errlen);

/* Neurons per piece for m, `which` and step: the most whole steps whose rows
 * fit FFN_STREAM_PIECE_BYTES (at least one step), n_ff when ffn_down is
 * selected or the steps would cover the layer. */
long ffn_stream_piece_neurons(const model *m, unsigned which, long step);

/* What a budgeted prefill streams in `mode`: gate, up and down, but not the
 * gate in gate-first, which keeps every gate row resident. */
unsigned ffn_stream_prefill_which(ffn_mode mode);

/* Staging slots for m, `which` and step: FFN_STREAM_SLOTS for pieces, 2 for
 * whole layers. */
int ffn_stream_slots(const model *m, unsigned which, long step);

/* Bytes ffn_stream_open allocates for m, `which` and step: ffn_stream_slots
 * slots, each the largest piece's selected rows, every tensor's rounded out
 * to 4096. 0 if none selected or step < 1. */
size_t ffn_stream_bytes(const model *m, unsigned which, long step);

/* The piece of layer l that starts at neuron n0 (n0 a multiple of the piece
 * size), read completely: read now unless it is already read or being read
 * (then waits for it); then the pieces after it are queued for reading into
 * the other slots. *n1 = the piece's end, and *out = m->layers[l] with gate, up
 * and down_t viewing neurons [n0, *n1): `data` at neuron n0's row (in the
 * slot for the streamed ones, in m's memory for the others) and `rows` = *n1
 * - n0 (a whole layer's ffn_down as it is). Those pointers stay valid until
 * the next call: that call keeps them intact while it reads or waits for its
 * own piece; later reads may reuse their slot. A prompt_ffn_source's piece
 * function.
 *
 * 0, or -1 with err set (a bad l or n0, or the read failed; a failed read of
 * a prefetched piece is reported by the call that asks for it, and a later
 * call reads it again). */
int ffn_stream_piece(ffn_stream *s, int l, long n0, layer_weights *out, long *n1, char *err, size_t errlen);

/* Rows that are in memory already (under a budget, the plan's pinned
 * bundles): rows(ctx, layer, neuron) is where that neuron's rows are, its
 * gate row at gate_off, up at up_off and down_t at down_off from it, or NULL
 * when they must be read. A piece's rows are then read only as the runs of
 * neurons rows() names NULL (merged over runs of named ones shorter than
 * FFN_STREAM_GAP_BYTES of a row, which cost less to read through than a read
 * of their own), and the named ones outside those runs are copied; the slot
 * holds the same bytes either way (the caller vouches that its rows equal
 * the file's). ffn_down rows (whole layers) are always read. rows() is called
 * from the reader thread and must not block. Set before a prompt (or NULL to
 * read everything again); the source must outlive its use. */
typedef struct {
    const uint8_t *(*rows)(void *ctx, int layer, long neuron);
    void *ctx;
    size_t gate_off, up_off, down_off;
} ffn_stream_resident;

#define FFN_STREAM_GAP_BYTES (128u << 10) /* ~ one request's latency at the disk's sequential rate */

void ffn_stream_set_resident(ffn_stream *s, const ffn_stream_resident *r);

/* Totals so far: bytes read from the file, bytes copied from the resident
 * rows, seconds the caller waited inside ffn_stream_piece, seconds the reader
 * spent filling slots. Any may be NULL. */
void ffn_stream_stats(const ffn_stream *s, uint64_t *bytes, uint64_t *copied, double *wait_s, double *read_s);

/* Waits until no read is queued or in progress, the read-ahead past the
 * caller's last piece included: totals taken after it do not depend on how
 * far the reader got meanwhile. */
void ffn_stream_wait_reads(ffn_stream *s);

/* Reads bypass the page cache (O_DIRECT); false after the fallback. */
bool ffn_stream_direct(const ffn_stream *s);

/* Between prompts: drops the reads queued ahead, waits for the one in
 * progress and gives the slots' pages back (pages_release); the next
 * ffn_stream_piece reads into them again. */
void ffn_stream_release(ffn_stream *s);

/* Stops the reader (a read in progress ends after its current chunk), joins
 * it and frees everything. NULL is fine. */
void ffn_stream_close(ffn_stream *s);

#endif
