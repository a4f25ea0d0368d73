/* FFN weights streamed from the model file into staging slots (ffn_stream.h). */
#include "engine/ffn_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/pages.h"

/* One selected tensor's rows of one piece: the file range read for them and where they land in a slot. */
typedef struct {
    size_t field;       /* offsetof(layer_weights, <the weight>) */
    const char *name;   /* "ffn_gate.weight", for messages */
    int layer;
    uint64_t file_off;  /* range start: the tensor's offset rounded down to FFN_STREAM_ALIGN */
    size_t read_len;    /* range length: up to the tensor's end rounded up to FFN_STREAM_ALIGN */
    size_t need;        /* bytes of the range up to the tensor's end: less only at end of file */
    size_t slot_off;    /* the range's place in the slot, a multiple of FFN_STREAM_ALIGN */
    size_t data_off;    /* the rows' first byte in the slot */
    size_t row_bytes;   /* one neuron's row; 0 for ffn_down, whose rows are not neurons */
} part;

/* A slot's life: EMPTY -> QUEUED (caller) -> READING (reader) -> READY | FAILED (reader). */
enum slot_state { SLOT_EMPTY, SLOT_QUEUED, SLOT_READING, SLOT_READY, SLOT_FAILED };

typedef struct {
    uint8_t *buf;        /* [slot_bytes], FFN_STREAM_ALIGN-aligned */
    long piece;          /* the piece it holds or receives (layer * per_layer + index); -1 none */
    enum slot_state state;
    char err[512];       /* FAILED: why; written by the reader before it publishes FAILED under mu */
} slot;

struct ffn_stream {
    const model *m;
    char *path;
    int fd;
    atomic_bool direct;  /* fd has O_DIRECT; cleared by the reader on fallback */
    int fail_reads;      /* test hook: reads still to fail with EIO (reader thread only) */
    int n_parts;         /* selected tensors per layer */
    long piece;          /* neurons per piece */
    long per_layer;      /* pieces per layer */
    part *parts;         /* [n_layer * per_layer][n_parts] */
    size_t slot_bytes;
    slot slots[FFN_STREAM_SLOTS];
    int n_slots;         /* ffn_stream_slots */
    int current;         /* slot of the piece returned last, kept intact; -1 before the first */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;  /* guards slots' piece/state, the queue and the totals */
    pthread_cond_t work; /* caller -> reader: a slot queued, or quit */
    pthread_cond_t done; /* reader -> caller: a read ended */
    int queue[FFN_STREAM_SLOTS]; /* QUEUED slots, read in this order */
    int queued;
    atomic_bool quit;    /* read without mu between chunks, so close cuts a read short */
    ffn_stream_resident resident; /* rows == NULL: read everything (set under mu, used by the reader) */
    const uint8_t **held; /* [piece]: the reader's look-ups of one piece's resident rows */
    uint64_t bytes, copied;
    double wait_s, read_s;
};

static uint64_t align_down(uint64_t x) { return x & ~(uint64_t)(FFN_STREAM_ALIGN - 1); }
static uint64_t align_up(uint64_t x) { return align_down(x + FFN_STREAM_ALIGN - 1); }

static const weight *field_of(const layer_weights *w, size_t field) {
    return (const weight *)((const char *)w + field);
}

/* The selected weights of a layer: gate, up, down (down_t where the file has it). Returns their count. */
static int selected(const layer_weights *w, unsigned which, size_t *fields, const char **names) {
    int n = 0;
    if (which & FFN_STREAM_GATE) fields[n] = offsetof(layer_weights, gate), names[n++] = "ffn_gate.weight";
    if (which & FFN_STREAM_UP) fields[n] = offsetof(layer_weights, up), names[n++] = "ffn_up.weight";
    if (which & FFN_STREAM_DOWN) {
        if (w->down_t.data) fields[n] = offsetof(layer_weights, down_t), names[n++] = "ffn_down_t.weight";
        else fields[n] = offsetof(layer_weights, down), names[n++] = "ffn_down.weight";
    }
    return n;
}

static uint64_t file_offset(const model *m, const weight *w) {
    return (uint64_t)((uintptr_t)w->data - (uintptr_t)m->gguf.base);
}

static bool whole_layers(const model *m, unsigned which) {
    if (!(which & FFN_STREAM_DOWN)) return false;
    for (int l = 0; l < m->n_layer; l++)
        if (!m->layers[l].down_t.data) return true;
    return false;
}

long ffn_stream_piece_neurons(const model *m, unsigned which, long step) {
    if (step < 1 || step >= m->n_ff || whole_layers(m, which)) return m->n_ff;
    uint64_t per_neuron = 0;
    for (int l = 0; l < m->n_layer; l++) {
        size_t fields[3];
        const char *names[3];
        const int n = selected(&m->layers[l], which, fields, names);
        uint64_t bytes = 0;
        for (int k = 0; k < n; k++) bytes += field_of(&m->layers[l], fields[k])->row_bytes;
        if (bytes > per_neuron) per_neuron = bytes;
    }
    const uint64_t steps = per_neuron ? FFN_STREAM_PIECE_BYTES / (per_neuron * (uint64_t)step) : 1;
    const long piece = (long)(steps > 0 ? steps : 1) * step;
    return piece < m->n_ff ? piece : m->n_ff;
}

/* Fills parts ([n_layer * per_layer][n], or NULL) and returns the slot size: the largest piece's rounded
 * ranges. A neuron-row tensor's piece is its rows [n0, n1); ffn_down (whole layers only) is all of it. */
static size_t layout(const model *m, unsigned which, long piece, part *parts) {
    const long per_layer = (m->n_ff + piece - 1) / piece;
    size_t slot_bytes = 0;
    for (int l = 0; l < m->n_layer; l++)
        for (long i = 0; i < per_layer; i++) {
            const long n0 = i * piece, n1 = n0 + piece < m->n_ff ? n0 + piece : m->n_ff;
            size_t fields[3], used = 0;
            const char *names[3];
            const int n = selected(&m->layers[l], which, fields, names);
            for (int k = 0; k < n; k++) {
                const weight *w = field_of(&m->layers[l], fields[k]);
                const bool rows = fields[k] != offsetof(layer_weights, down);
                const uint64_t off = file_offset(m, w) + (rows ? (uint64_t)n0 * w->row_bytes : 0);
                const uint64_t end = off + (rows ? (uint64_t)(n1 - n0) * w->row_bytes : weight_bytes(w));
                const uint64_t start = align_down(off);
                const part p = {.field = fields[k], .name = names[k], .layer = l, .file_off = start,
                                .read_len = align_up(end) - start, .need = end - start,
                                .slot_off = used, .data_off = used + (off - start), .row_bytes = rows ? w->row_bytes : 0};
                if (parts) parts[((size_t)l * (size_t)per_layer + (size_t)i) * (size_t)n + (size_t)k] = p;
                used += p.read_len;
            }
            if (used > slot_bytes) slot_bytes = used;
        }
    return slot_bytes;
}

static int slots_for(const model *m, long piece) { return piece < m->n_ff ? FFN_STREAM_SLOTS : 2; }

int ffn_stream_slots(const model *m, unsigned which, long step) {
    return slots_for(m, ffn_stream_piece_neurons(m, which, step));
}

size_t ffn_stream_bytes(const model *m, unsigned which, long step) {
    if (!(which & FFN_STREAM_ALL) || (which & ~(unsigned)FFN_STREAM_ALL) || step < 1) return 0;
    const long piece = ffn_stream_piece_neurons(m, which, step);
    return (size_t)slots_for(m, piece) * layout(m, which, piece, NULL);
}

unsigned ffn_stream_prefill_which(ffn_mode mode) {
    return FFN_STREAM_UP | FFN_STREAM_DOWN | (mode == FFN_GATE_FIRST ? 0 : FFN_STREAM_GATE);
}

/* Never trust a pointer's offset: every selected tensor must lie inside the model's file. */
static int check_ranges(const model *m, const char *path, unsigned which, char *err, size_t errlen) {
    const uintptr_t base = (uintptr_t)m->gguf.base;
    for (int l = 0; l < m->n_layer; l++) {
        size_t fields[3];
        const char *names[3];
        const int n = selected(&m->layers[l], which, fields, names);
        for (int k = 0; k < n; k++) {
            const weight *w = field_of(&m->layers[l], fields[k]);
            const uintptr_t p = (uintptr_t)w->data;
            const uint64_t bytes = weight_bytes(w);
            if (!w->data || p < base || p - base > m->gguf.size || bytes > m->gguf.size - (p - base)) {
                err_set(err, errlen, "%s: blk.%d.%s (%llu bytes) does not lie inside the model's %zu bytes", path, l,
                        names[k], (unsigned long long)bytes, m->gguf.size);
                return -1;
            }
        }
    }
    return 0;
}

/* O_DIRECT, else (refused, or the test hook) buffered; the file must be the model's by its size. */
static int open_file(ffn_stream *s, const char *path, char *err, size_t errlen) {
    const char *buffered = getenv("PI2_STREAM_BUFFERED");
    const bool forced = buffered && *buffered == '1';
    errno = EINVAL;
    s->fd = forced ? -1 : open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (s->fd < 0 && errno == EINVAL) {
        log_info("%s: %s; buffered reads, dropped from the page cache after each", path,
                 forced ? "PI2_STREAM_BUFFERED=1" : "O_DIRECT refused");
        s->fd = open(path, O_RDONLY | O_CLOEXEC);
    } else {
        atomic_store(&s->direct, s->fd >= 0);
    }
    if (s->fd < 0) return err_set(err, errlen, "open %s: %s", path, strerror(errno)), -1;
    struct stat st;
    if (fstat(s->fd, &st) || !S_ISREG(st.st_mode)) return err_set(err, errlen, "%s: not a regular file", path), -1;
    if ((uint64_t)st.st_size != (uint64_t)s->m->gguf.size)
        return err_set(err, errlen, "%s: %llu bytes, but the model was loaded from %zu bytes: not its file", path,
                       (unsigned long long)st.st_size, s->m->gguf.size), -1;
    return 0;
}

/* The reader's one pread, behind the test hook. */
static ssize_t stream_pread(ffn_stream *s, void *dst, size_t len, uint64_t off) {
    if (s->fail_reads > 0) {
        s->fail_reads--;
        errno = EIO;
        return -1;
    }
    return pread(s->fd, dst, len, (off_t)off);
}

/* A read refused with EINVAL under O_DIRECT: clear the flag and go on buffered. */
static bool fall_back(ffn_stream *s) {
    const int flags = fcntl(s->fd, F_GETFL);
    if (!atomic_load(&s->direct) || flags < 0 || fcntl(s->fd, F_SETFL, flags & ~O_DIRECT) < 0) return false;
    atomic_store(&s->direct, false);
    log_info("%s: O_DIRECT read refused; buffered reads, dropped from the page cache after each", s->path);
    return true;
}

/* Reads part p into dst (its slot position). Short reads continue from the
 * last aligned offset (O_DIRECT needs it); errors and reads that end early are
 * retried FFN_STREAM_RETRIES times. 0, or -1 with err set; *got counts the bytes read. */
static int read_part(ffn_stream *s, const part *p, uint8_t *dst, uint64_t *got, char *err, size_t errlen) {
    const int l = p->layer;
    size_t done = 0;
    int failures = 0;
    while (done < p->need) {
        if (atomic_load(&s->quit)) return err_set(err, errlen, "%s: stream closed", s->path), -1;
        const size_t pos = (size_t)align_down(done);
        const size_t len = p->read_len - pos < FFN_STREAM_READ_MAX ? p->read_len - pos : FFN_STREAM_READ_MAX;
        const ssize_t r = stream_pread(s, dst + pos, len, p->file_off + pos);
        const int e = errno;
        if (r < 0 && e == EINTR) continue;
        if (r < 0 && e == EINVAL && fall_back(s)) continue;
        if (r > 0) {
            *got += (uint64_t)r;
            if (!atomic_load(&s->direct)) /* keep the page cache from holding what the slot holds */
                posix_fadvise(s->fd, (off_t)(p->file_off + pos), (off_t)r, POSIX_FADV_DONTNEED);
        }
        if (r > 0 && pos + (size_t)r > done) {
            done = pos + (size_t)r, failures = 0;
            continue;
        }
        if (++failures <= FFN_STREAM_RETRIES) continue;
        if (r < 0)
            return err_set(err, errlen, "%s: blk.%d.%s: read of %zu bytes at offset %llu failed %d times: %s", s->path,
                           l, p->name, len, (unsigned long long)(p->file_off + pos), failures, strerror(e)), -1;
        return err_set(err, errlen, "%s: blk.%d.%s: short read at offset %llu: the file ends before byte %llu",
                       s->path, l, p->name, (unsigned long long)(p->file_off + done),
                       (unsigned long long)(p->file_off + p->need)), -1;
    }
    return 0;
}

/* Rows [r0, r1) of the piece's part p (row 0: the piece's first neuron): their byte range rounded out to
 * FFN_STREAM_ALIGN, into the same place of the slot as a read of the whole part puts it. */
static int read_rows(ffn_stream *s, const part *p, long r0, long r1, uint8_t *buf, uint64_t *got, char *err,
                     size_t errlen) {
    const uint64_t first = p->file_off + (p->data_off - p->slot_off); /* the piece's first row in the file */
    const uint64_t off = first + (uint64_t)r0 * p->row_bytes, end = first + (uint64_t)r1 * p->row_bytes;
    part sub = *p;
    sub.file_off = align_down(off);
    sub.read_len = align_up(end) - sub.file_off;
    sub.need = end - sub.file_off;
    return read_part(s, &sub, buf + p->slot_off + (sub.file_off - p->file_off), got, err, errlen);
}

/* The piece's neurons whose rows are held in memory (s->held), read the rest: every run of neurons that
 * are not held, extended over held runs shorter than FFN_STREAM_GAP_BYTES of the longest row, is read;
 * the held rows outside those runs are copied. */
static int fill_from_resident(ffn_stream *s, long g, uint8_t *buf, uint64_t *got, uint64_t *copied, char *err,
                              size_t errlen) {
    const part *parts = &s->parts[(size_t)g * (size_t)s->n_parts];
    const int l = (int)(g / s->per_layer);
    const long n0 = (g % s->per_layer) * s->piece, n = (n0 + s->piece < s->m->n_ff ? n0 + s->piece : s->m->n_ff) - n0;
    size_t longest = 0;
    for (int k = 0; k < s->n_parts; k++) {
        if (!parts[k].row_bytes && read_part(s, &parts[k], buf + parts[k].slot_off, got, err, errlen)) return -1;
        if (parts[k].row_bytes > longest) longest = parts[k].row_bytes;
    }
    const long gap = longest ? (long)(FFN_STREAM_GAP_BYTES / longest) : 0;
    for (long i = 0; i < n; i++) s->held[i] = s->resident.rows(s->resident.ctx, l, n0 + i);
    for (long i = 0; i < n;) {
        if (s->held[i]) {
            i++;
            continue;
        }
        long end = i;
        for (;;) { /* the run of rows to read, through short held gaps */
            while (end < n && !s->held[end]) end++;
            long next = end;
            while (next < n && s->held[next]) next++;
            if (next == n || next - end >= gap) break;
            end = next;
        }
        for (int k = 0; k < s->n_parts; k++)
            if (parts[k].row_bytes && read_rows(s, &parts[k], i, end, buf, got, err, errlen)) return -1;
        for (long r = i; r < end; r++) s->held[r] = NULL; /* read: not copied */
        i = end;
    }
    for (int k = 0; k < s->n_parts; k++) {
        const part *p = &parts[k];
        const size_t from = p->field == offsetof(layer_weights, gate) ? s->resident.gate_off
                            : p->field == offsetof(layer_weights, up) ? s->resident.up_off
                                                                       : s->resident.down_off;
        if (!p->row_bytes) continue;
        for (long i = 0; i < n; i++)
            if (s->held[i]) {
                memcpy(buf + p->data_off + (size_t)i * p->row_bytes, s->held[i] + from, p->row_bytes);
                *copied += p->row_bytes;
            }
    }
    return 0;
}

static int read_piece(ffn_stream *s, long g, uint8_t *buf, uint64_t *got, uint64_t *copied, char *err,
                      size_t errlen) {
    if (s->resident.rows) return fill_from_resident(s, g, buf, got, copied, err, errlen);
    const part *parts = &s->parts[(size_t)g * (size_t)s->n_parts];
    for (int k = 0; k < s->n_parts; k++)
        if (read_part(s, &parts[k], buf + parts[k].slot_off, got, err, errlen)) return -1;
    return 0;
}

/* Reader thread: fills the requested slot, publishes READY/FAILED and the totals under mu. */
static void *reader_main(void *arg) {
    ffn_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->queued && !atomic_load(&s->quit)) pthread_cond_wait(&s->work, &s->mu);
        if (atomic_load(&s->quit)) break;
        slot *sl = &s->slots[s->queue[0]];
        memmove(s->queue, s->queue + 1, sizeof(int) * (size_t)--s->queued);
        sl->state = SLOT_READING;
        const long piece = sl->piece;
        pthread_mutex_unlock(&s->mu);

        const double t0 = clock_seconds();
        uint64_t got = 0, copied = 0;
        const int rc = read_piece(s, piece, sl->buf, &got, &copied, sl->err, sizeof sl->err);
        const double dt = clock_seconds() - t0;

        pthread_mutex_lock(&s->mu);
        sl->state = rc ? SLOT_FAILED : SLOT_READY;
        s->bytes += got, s->copied += copied, s->read_s += dt;
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

ffn_stream *ffn_stream_open(const model *m, const char *model_path, unsigned which, long step, char *err,
                            size_t errlen) {
    if (!(which & FFN_STREAM_ALL) || (which & ~(unsigned)FFN_STREAM_ALL))
        return err_set(err, errlen, "%s: ffn_stream: which = %#x selects no FFN tensor", model_path, which), NULL;
    if (step < 1) return err_set(err, errlen, "%s: ffn_stream: a piece step of %ld neurons", model_path, step), NULL;
    if (m->n_layer <= 0 || !m->layers) return err_set(err, errlen, "%s: model has no layers", model_path), NULL;
    if (check_ranges(m, model_path, which, err, errlen)) return NULL;
    ffn_stream *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, errlen, "ffn_stream: out of memory"), NULL;
    s->m = m, s->fd = -1, s->current = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    const char *fail = getenv("PI2_STREAM_FAIL_READS");
    s->fail_reads = fail ? atoi(fail) : 0;
    for (int i = 0; i < FFN_STREAM_SLOTS; i++) s->slots[i].piece = -1;

    size_t fields[3];
    const char *names[3];
    s->n_parts = selected(&m->layers[0], which, fields, names);
    s->piece = ffn_stream_piece_neurons(m, which, step);
    s->n_slots = slots_for(m, s->piece);
    s->per_layer = (m->n_ff + s->piece - 1) / s->piece;
    s->path = strdup(model_path);
    s->parts = calloc((size_t)m->n_layer * (size_t)s->per_layer * (size_t)s->n_parts, sizeof *s->parts);
    s->held = calloc((size_t)s->piece, sizeof *s->held);
    if (!s->path || !s->parts || !s->held) goto oom;
    s->slot_bytes = layout(m, which, s->piece, s->parts);
    if (open_file(s, model_path, err, errlen)) goto fail;
    for (int i = 0; i < s->n_slots; i++)
        if (posix_memalign((void **)&s->slots[i].buf, FFN_STREAM_ALIGN, s->slot_bytes)) goto oom;
    if (pthread_create(&s->thread, NULL, reader_main, s)) {
        err_set(err, errlen, "%s: ffn_stream: cannot start the reader thread", model_path);
        goto fail;
    }
    s->started = true;
    return s;
oom:
    err_set(err, errlen, "%s: ffn_stream: out of memory (%d slots of %zu bytes)", model_path, s->n_slots,
            s->slot_bytes);
fail:
    ffn_stream_close(s);
    return NULL;
}

static int find_slot(const ffn_stream *s, long g) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].piece == g && s->slots[i].state != SLOT_EMPTY) return i;
    return -1;
}

/* pieces from g to h, in stream order (wrapping after the last) */
static long ahead_of(const ffn_stream *s, long g, long h) {
    const long total = (long)s->m->n_layer * s->per_layer;
    return ((h - g) % total + total) % total;
}

/* A slot free for piece g or the ones after it: not the caller's current piece, not queued or being read,
 * and holding nothing (or a failed read, or a piece outside the n_slots from g). -1 if none;
 * with evict, the one read furthest ahead of g instead, while any slot is not busy. */
static int free_slot(const ffn_stream *s, long g, bool evict) {
    int far = -1;
    for (int i = 0; i < s->n_slots; i++) {
        const slot *sl = &s->slots[i];
        if (i == s->current || sl->state == SLOT_QUEUED || sl->state == SLOT_READING) continue;
        if (sl->state != SLOT_READY || ahead_of(s, g, sl->piece) >= s->n_slots) return i;
        if (far < 0 || ahead_of(s, g, sl->piece) > ahead_of(s, g, s->slots[far].piece)) far = i;
    }
    return evict ? far : -1;
}

/* Queues slot k for piece g: first (what the caller waits for) or after the others. Holds mu. */
static void request(ffn_stream *s, int k, long g, bool first) {
    s->slots[k].piece = g, s->slots[k].state = SLOT_QUEUED;
    if (first) memmove(s->queue + 1, s->queue, sizeof(int) * (size_t)s->queued);
    s->queue[first ? 0 : s->queued] = k;
    s->queued++;
    pthread_cond_signal(&s->work);
}

/* gate, up and down_t of layer l viewing neurons [n0, n1): the streamed ones in buf, the others in m */
static void fill_piece(const ffn_stream *s, long g, const uint8_t *buf, long n0, long n1, layer_weights *out) {
    const int l = (int)(g / s->per_layer);
    *out = s->m->layers[l];
    layer_weights_neurons(out, n0, n1);
    const part *parts = &s->parts[(size_t)g * (size_t)s->n_parts];
    for (int k = 0; k < s->n_parts; k++) ((weight *)((char *)out + parts[k].field))->data = buf + parts[k].data_off;
}

int ffn_stream_piece(ffn_stream *s, int l, long n0, layer_weights *out, long *n1, char *err, size_t errlen) {
    const int n_layer = s->m->n_layer;
    const long n_ff = s->m->n_ff;
    if (l < 0 || l >= n_layer || n0 < 0 || n0 >= n_ff || n0 % s->piece)
        return err_set(err, errlen, "%s: ffn_stream_piece(layer %d, neuron %ld): outside the model's %d layers of %ld "
                       "neurons, or not at a piece of %ld", s->path, l, n0, n_layer, n_ff, s->piece), -1;
    const long g = (long)l * s->per_layer + n0 / s->piece, total = (long)n_layer * s->per_layer;
    pthread_mutex_lock(&s->mu);
    const double t0 = clock_seconds();
    int k = find_slot(s, g);
    while (k < 0) { /* not asked for ahead: read it first, into a slot not holding the current piece */
        k = free_slot(s, g, true);
        if (k >= 0) request(s, k, g, true);
        else pthread_cond_wait(&s->done, &s->mu); /* every other slot queued or being read */
    }
    while (s->slots[k].state == SLOT_QUEUED || s->slots[k].state == SLOT_READING)
        pthread_cond_wait(&s->done, &s->mu);
    int rc = 0;
    if (s->slots[k].state == SLOT_FAILED) {
        err_set(err, errlen, "%s", s->slots[k].err);
        s->slots[k].state = SLOT_EMPTY, s->slots[k].piece = -1; /* the next ask reads it again */
        rc = -1;
    } else {
        s->current = k;
        for (long i = 1; i < s->n_slots && i < total; i++) { /* the pieces after it, into free slots */
            const long h = (g + i) % total;
            if (find_slot(s, h) >= 0) continue;
            const int f = free_slot(s, g, false);
            if (f < 0) break;
            request(s, f, h, false);
        }
    }
    s->wait_s += clock_seconds() - t0;
    pthread_mutex_unlock(&s->mu);
    if (rc == 0) {
        *n1 = n0 + s->piece < n_ff ? n0 + s->piece : n_ff;
        fill_piece(s, g, s->slots[k].buf, n0, *n1, out);
    }
    return rc;
}

void ffn_stream_set_resident(ffn_stream *s, const ffn_stream_resident *r) {
    pthread_mutex_lock(&s->mu);
    /* a read in progress finishes with the source it began with; the reader starts the next under mu */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].state == SLOT_READING) {
            pthread_cond_wait(&s->done, &s->mu);
            i = -1; /* look at every slot again */
        }
    s->resident = r ? *r : (ffn_stream_resident){0};
    pthread_mutex_unlock(&s->mu);
}

void ffn_stream_stats(const ffn_stream *s, uint64_t *bytes, uint64_t *copied, double *wait_s, double *read_s) {
    pthread_mutex_t *mu = (pthread_mutex_t *)&s->mu; /* locking does not change what the stream reports */
    pthread_mutex_lock(mu);
    if (bytes) *bytes = s->bytes;
    if (copied) *copied = s->copied;
    if (wait_s) *wait_s = s->wait_s;
    if (read_s) *read_s = s->read_s;
    pthread_mutex_unlock(mu);
}

/* a read queued or in progress; holds mu */
static bool reading(const ffn_stream *s) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].state == SLOT_READING) return true;
    return s->queued > 0;
}

void ffn_stream_wait_reads(ffn_stream *s) {
    pthread_mutex_lock(&s->mu);
    while (reading(s)) pthread_cond_wait(&s->done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

bool ffn_stream_direct(const ffn_stream *s) { return atomic_load(&s->direct); }

void ffn_stream_release(ffn_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->queued = 0; /* the reader takes nothing more; every slot is emptied below */
    for (int i = 0; i < s->n_slots; i++) {
        while (s->slots[i].state == SLOT_READING) pthread_cond_wait(&s->done, &s->mu);
        s->slots[i].state = SLOT_EMPTY, s->slots[i].piece = -1;
        pages_release(s->slots[i].buf, s->slot_bytes);
    }
    s->current = -1;
    pthread_mutex_unlock(&s->mu);
}

void ffn_stream_close(ffn_stream *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        atomic_store(&s->quit, true);
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    pthread_cond_destroy(&s->done);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    if (s->fd >= 0) close(s->fd);
    for (int i = 0; i < s->n_slots; i++) free(s->slots[i].buf);
    free(s->parts);
    free(s->held);
    free(s->path);
    free(s);
}
