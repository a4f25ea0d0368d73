/* FFN weights streamed from the model file into two staging slots (ffn_stream.h). */
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

/* One selected tensor of one layer: the file range read for it and where it lands in a slot. */
typedef struct {
    size_t field;       /* offsetof(layer_weights, <the weight>) */
    const char *name;   /* "ffn_gate.weight", for messages */
    uint64_t file_off;  /* range start: the tensor's offset rounded down to FFN_STREAM_ALIGN */
    size_t read_len;    /* range length: up to the tensor's end rounded up to FFN_STREAM_ALIGN */
    size_t need;        /* bytes of the range up to the tensor's end: less only at end of file */
    size_t slot_off;    /* the range's place in the slot, a multiple of FFN_STREAM_ALIGN */
    size_t data_off;    /* the tensor's first byte in the slot */
} part;

/* A slot's life: EMPTY -> QUEUED (caller) -> READING (reader) -> READY | FAILED (reader). */
enum slot_state { SLOT_EMPTY, SLOT_QUEUED, SLOT_READING, SLOT_READY, SLOT_FAILED };

typedef struct {
    uint8_t *buf;        /* [slot_bytes], FFN_STREAM_ALIGN-aligned */
    int layer;           /* the layer it holds or receives; -1 none */
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
    part *parts;         /* [n_layer][n_parts] */
    size_t slot_bytes;
    slot slots[2];
    int last_slot;       /* slot of the layer returned last; -1 before the first */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;  /* guards slots' layer/state, req and the totals */
    pthread_cond_t work; /* caller -> reader: req set, or quit */
    pthread_cond_t done; /* reader -> caller: a read ended (req back to -1) */
    int req;             /* slot the reader fills; -1 when the reader is idle */
    atomic_bool quit;    /* read without mu between chunks, so close cuts a read short */
    uint64_t bytes;
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

/* Fills parts ([n_layer][n], or NULL) and returns the slot size: the largest layer's rounded ranges. */
static size_t layout(const model *m, unsigned which, part *parts) {
    size_t slot_bytes = 0;
    for (int l = 0; l < m->n_layer; l++) {
        size_t fields[3], used = 0;
        const char *names[3];
        const int n = selected(&m->layers[l], which, fields, names);
        for (int k = 0; k < n; k++) {
            const weight *w = field_of(&m->layers[l], fields[k]);
            const uint64_t off = file_offset(m, w), end = off + weight_bytes(w), start = align_down(off);
            const part p = {.field = fields[k], .name = names[k], .file_off = start,
                            .read_len = align_up(end) - start, .need = end - start,
                            .slot_off = used, .data_off = used + (off - start)};
            if (parts) parts[l * n + k] = p;
            used += p.read_len;
        }
        if (used > slot_bytes) slot_bytes = used;
    }
    return slot_bytes;
}

size_t ffn_stream_bytes(const model *m, unsigned which) {
    if (!(which & FFN_STREAM_ALL) || (which & ~(unsigned)FFN_STREAM_ALL)) return 0;
    return 2 * layout(m, which, NULL);
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

/* Reads part p of layer l into dst (its slot position). Short reads continue from
 * the last aligned offset (O_DIRECT needs it); errors and reads that end early are
 * retried FFN_STREAM_RETRIES times. 0, or -1 with err set; *got counts the bytes read. */
static int read_part(ffn_stream *s, const part *p, int l, uint8_t *dst, uint64_t *got, char *err, size_t errlen) {
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

static int read_layer(ffn_stream *s, int l, uint8_t *buf, uint64_t *got, char *err, size_t errlen) {
    const part *parts = &s->parts[(size_t)l * (size_t)s->n_parts];
    for (int k = 0; k < s->n_parts; k++)
        if (read_part(s, &parts[k], l, buf + parts[k].slot_off, got, err, errlen)) return -1;
    return 0;
}

/* Reader thread: fills the requested slot, publishes READY/FAILED and the totals under mu. */
static void *reader_main(void *arg) {
    ffn_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->req < 0 && !atomic_load(&s->quit)) pthread_cond_wait(&s->work, &s->mu);
        if (atomic_load(&s->quit)) break;
        slot *sl = &s->slots[s->req];
        sl->state = SLOT_READING;
        const int layer = sl->layer;
        pthread_mutex_unlock(&s->mu);

        const double t0 = clock_seconds();
        uint64_t got = 0;
        const int rc = read_layer(s, layer, sl->buf, &got, sl->err, sizeof sl->err);
        const double dt = clock_seconds() - t0;

        pthread_mutex_lock(&s->mu);
        sl->state = rc ? SLOT_FAILED : SLOT_READY;
        s->bytes += got, s->read_s += dt;
        s->req = -1;
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

ffn_stream *ffn_stream_open(const model *m, const char *model_path, unsigned which, char *err, size_t errlen) {
    if (!(which & FFN_STREAM_ALL) || (which & ~(unsigned)FFN_STREAM_ALL))
        return err_set(err, errlen, "%s: ffn_stream: which = %#x selects no FFN tensor", model_path, which), NULL;
    if (m->n_layer <= 0 || !m->layers) return err_set(err, errlen, "%s: model has no layers", model_path), NULL;
    if (check_ranges(m, model_path, which, err, errlen)) return NULL;
    ffn_stream *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, errlen, "ffn_stream: out of memory"), NULL;
    s->m = m, s->fd = -1, s->req = -1, s->last_slot = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    const char *fail = getenv("PI2_STREAM_FAIL_READS");
    s->fail_reads = fail ? atoi(fail) : 0;
    for (int i = 0; i < 2; i++) s->slots[i].layer = -1;

    size_t fields[3];
    const char *names[3];
    s->n_parts = selected(&m->layers[0], which, fields, names);
    s->path = strdup(model_path);
    s->parts = calloc((size_t)m->n_layer * (size_t)s->n_parts, sizeof *s->parts);
    if (!s->path || !s->parts) goto oom;
    s->slot_bytes = layout(m, which, s->parts);
    if (open_file(s, model_path, err, errlen)) goto fail;
    for (int i = 0; i < 2; i++)
        if (posix_memalign((void **)&s->slots[i].buf, FFN_STREAM_ALIGN, s->slot_bytes)) goto oom;
    if (pthread_create(&s->thread, NULL, reader_main, s)) {
        err_set(err, errlen, "%s: ffn_stream: cannot start the reader thread", model_path);
        goto fail;
    }
    s->started = true;
    return s;
oom:
    err_set(err, errlen, "%s: ffn_stream: out of memory (two slots of %zu bytes)", model_path, s->slot_bytes);
fail:
    ffn_stream_close(s);
    return NULL;
}

static int find_slot(const ffn_stream *s, int l) {
    for (int i = 0; i < 2; i++)
        if (s->slots[i].layer == l && s->slots[i].state != SLOT_EMPTY) return i;
    return -1;
}

/* Hands slot k to the reader for layer l, once it is idle (one request at a time). Holds mu. */
static void request(ffn_stream *s, int k, int l) {
    while (s->req >= 0) pthread_cond_wait(&s->done, &s->mu);
    s->slots[k].layer = l, s->slots[k].state = SLOT_QUEUED;
    s->req = k;
    pthread_cond_signal(&s->work);
}

static void fill_layer(const ffn_stream *s, int l, const uint8_t *buf, layer_weights *out) {
    *out = s->m->layers[l];
    const part *parts = &s->parts[(size_t)l * (size_t)s->n_parts];
    for (int k = 0; k < s->n_parts; k++) ((weight *)((char *)out + parts[k].field))->data = buf + parts[k].data_off;
}

int ffn_stream_layer(ffn_stream *s, int l, int next, layer_weights *out, char *err, size_t errlen) {
    const int n_layer = s->m->n_layer;
    if (l < 0 || l >= n_layer || next < -1 || next >= n_layer)
        return err_set(err, errlen, "%s: ffn_stream_layer(%d, next %d): outside the model's %d layers", s->path, l,
                       next, n_layer), -1;
    pthread_mutex_lock(&s->mu);
    const double t0 = clock_seconds();
    int k = find_slot(s, l);
    if (k < 0) { /* not prefetched: read it into the slot not holding the last layer, which stays intact */
        k = s->last_slot >= 0 ? s->last_slot ^ 1 : 0;
        request(s, k, l);
    }
    while (s->slots[k].state == SLOT_QUEUED || s->slots[k].state == SLOT_READING)
        pthread_cond_wait(&s->done, &s->mu);
    int rc = 0;
    if (s->slots[k].state == SLOT_FAILED) {
        err_set(err, errlen, "%s", s->slots[k].err);
        s->slots[k].state = SLOT_EMPTY, s->slots[k].layer = -1; /* the next ask reads it again */
        rc = -1;
    } else {
        s->last_slot = k;
        if (next >= 0 && find_slot(s, next) < 0) request(s, k ^ 1, next);
    }
    s->wait_s += clock_seconds() - t0;
    pthread_mutex_unlock(&s->mu);
    if (rc == 0) fill_layer(s, l, s->slots[k].buf, out);
    return rc;
}

void ffn_stream_stats(const ffn_stream *s, uint64_t *bytes, double *wait_s, double *read_s) {
    pthread_mutex_t *mu = (pthread_mutex_t *)&s->mu; /* locking does not change what the stream reports */
    pthread_mutex_lock(mu);
    if (bytes) *bytes = s->bytes;
    if (wait_s) *wait_s = s->wait_s;
    if (read_s) *read_s = s->read_s;
    pthread_mutex_unlock(mu);
}

bool ffn_stream_direct(const ffn_stream *s) { return atomic_load(&s->direct); }

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
    for (int i = 0; i < 2; i++) free(s->slots[i].buf);
    free(s->parts);
    free(s->path);
    free(s);
}
