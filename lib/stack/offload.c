/* The budgeted stack's layout (offload.h). */
#include "stack/offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/predictor.h"
#include "plan/plan_file.h"
#include "stack/neuron_cache.h"
#include "stack/stack.h"

#define PAGE 4096u

static uint64_t page_down(uint64_t x) { return x & ~(uint64_t)(PAGE - 1); }
static uint64_t page_up(uint64_t x) { return (x + PAGE - 1) & ~(uint64_t)(PAGE - 1); }

/* The plan file: path itself, or path/plan.pb for a directory. */
static int plan_file_of(const char *path, char *out, size_t len) {
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    return snprintf(out, len, dir ? "%s/plan.pb" : "%s", path) >= (int)len ? -1 : 0;
}

/* The bundle file's path: relative to the plan's directory. */
static int bundle_path_of(const char *plan_path, const char *rel, char *out, size_t len) {
    const char *slash = strrchr(plan_path, '/');
    int dir_len = slash ? (int)(slash - plan_path) : 1;
    return snprintf(out, len, "%.*s/%s", dir_len, slash ? plan_path : ".", rel) >= (int)len ? -1 : 0;
}

/* Whether w is one of the preloaded tensors. */
static bool offload_preloads(const offload *o, const model *m, const weight *w) {
    if (!w->data) return false;
    if (w == &m->tok_embd) return m->tied_output; /* else read a row per token from the file */
    if (w == &m->output) return !m->tied_output; /* a tied output is the embedding, preloaded as that */
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *L = &m->layers[l];
        if (w == &L->wq || w == &L->wk || w == &L->wv || w == &L->wo) return true;
        /* F16/F32 predictors the kernels convert are in the segment as one shared Q8_0 copy instead */
        if (w == &L->fc1 || w == &L->fc2)
            return o->mode == FFN_PREDICTOR && !o->side_predictor &&
                   (!o->predictor_image_bytes || (w->type != GGML_TYPE_F16 && w->type != GGML_TYPE_F32));
        if (w == &L->gate) return o->mode == FFN_GATE_FIRST;
    }
    return false; /* up, down, down_t (and gate in predictor mode): from the neuron cache */
}

/* Every preloaded tensor, in a fixed order every process visits alike. */
static int for_each_weight(const model *m, weight **out) {
    int n = 0;
    out[n++] = (weight *)&m->tok_embd;
    out[n++] = (weight *)&m->output;
    for (int l = 0; l < m->n_layer; l++) {
        layer_weights *L = (layer_weights *)&m->layers[l];
        weight *all[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->fc1, &L->fc2};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) out[n++] = all[i];
    }
    return n;
}

static int by_file_offset(const void *a, const void *b) {
    const preload_range *x = a, *y = b;
    return (x->file_offset > y->file_offset) - (x->file_offset < y->file_offset);
}

/* Each preloaded tensor's pages, sorted and merged where they touch, then packed. */
static int make_ranges(offload *o, const model *m, char *err, size_t errlen) {
    weight **all = malloc(sizeof *all * (size_t)(2 + 7 * m->n_layer));
    o->ranges = malloc(sizeof *o->ranges * (size_t)(2 + 7 * m->n_layer));
    if (!all || !o->ranges) {
        free(all);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int n_all = for_each_weight(m, all);
    int n = 0;
    for (int i = 0; i < n_all; i++) {
        if (!offload_preloads(o, m, all[i])) continue;
        const uint64_t at = (uint64_t)((const uint8_t *)all[i]->data - m->gguf.base);
        o->ranges[n++] = (preload_range){page_down(at), page_up(at + weight_bytes(all[i])) - page_down(at), 0};
    }
    free(all);
    qsort(o->ranges, (size_t)n, sizeof *o->ranges, by_file_offset);
    int merged = 0;
    for (int i = 0; i < n; i++) {
        preload_range *last = merged ? &o->ranges[merged - 1] : NULL;
        if (last && o->ranges[i].file_offset <= last->file_offset + last->bytes) {
            uint64_t end = o->ranges[i].file_offset + o->ranges[i].bytes;
            if (end > last->file_offset + last->bytes) last->bytes = end - last->file_offset;
        } else {
            o->ranges[merged++] = o->ranges[i];
        }
    }
    o->n_ranges = merged;
    uint64_t at = 0;
    for (int i = 0; i < merged; i++) {
        o->ranges[i].seg_offset = at;
        at += o->ranges[i].bytes;
    }
    o->predictor_image_offset = at;
    at += page_up(o->predictor_image_bytes);
    o->preload_bytes = at ? at : PAGE;
    return 0;
}

static size_t pow2_dividing(size_t x) { return x & (~x + 1); }

static int make_positions(offload *o, const model *m, char *err, size_t errlen) {
    const size_t n_ff = (size_t)m->n_ff;
    o->pos_of = malloc(sizeof *o->pos_of * n_ff * (size_t)m->n_layer);
    if (!o->pos_of) {
        snprintf(err, errlen, "out of memory for the neurons' bundle positions");
        return -1;
    }
    for (int l = 0; l < m->n_layer; l++)
        for (size_t p = 0; p < n_ff; p++) o->pos_of[l * n_ff + (size_t)o->bundles.order[l * n_ff + p]] = (int32_t)p;
    return 0;
}

int offload_open(offload *o, const model *m, const char *model_path, const char *plan_path, bool positions,
                 char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    if (plan_file_of(plan_path, o->plan_path, sizeof o->plan_path)) {
        snprintf(err, errlen, "plan path %s is too long", plan_path);
        return -1;
    }
    if (!(o->plan = plan_load(o->plan_path, m, model_path, err, errlen))) return -1;
    const Pi2__Plan *p = o->plan;
    if (bundle_path_of(o->plan_path, p->bundle_file, o->bundle_path, sizeof o->bundle_path)) {
        snprintf(err, errlen, "%s: bundle_file %s makes too long a path", o->plan_path, p->bundle_file);
        goto fail;
    }
    if (bundle_open(&o->bundles, o->bundle_path, m, model_path, err, errlen) ||
        plan_check_bundle(p, o->plan_path, &o->bundles, o->bundle_path, err, errlen))
        goto fail;
    o->mode = p->mode == PI2__PLAN_MODE__PLAN_MODE_PREDICTOR ? FFN_PREDICTOR : FFN_GATE_FIRST;
    o->side_predictor = p->predictor && *p->predictor;
    if (o->mode == FFN_PREDICTOR && !o->side_predictor) o->predictor_image_bytes = predictor_q8_0_image_bytes(m);
    const bundle_file *b = &o->bundles;
    o->stride = b->stride;
    o->per_bundle = b->per_bundle;
    o->n_bundles = b->n_bundles;
    o->gate_bytes = b->gate_bytes;
    o->up_bytes = b->up_bytes;
    o->down_bytes = b->down_bytes;
    o->neuron_bytes = b->neuron_bytes;
    o->hot_stride = (size_t)plan_hot_bundle_bytes(p);
    o->cold_slots = p->cold_slots;
    o->cold_bytes = (uint64_t)(p->cold_slots ? p->cold_slots : 1) * o->stride;
    o->hot_offset = calloc((size_t)m->n_layer, sizeof *o->hot_offset);
    o->lent_offset = calloc((size_t)m->n_layer, sizeof *o->lent_offset);
    if (!o->hot_offset || !o->lent_offset) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int l = 0; l < m->n_layer; l++) {
        o->hot_offset[l] = o->hot_bytes;
        o->hot_bytes += (uint64_t)p->hot_bundles[l] * o->hot_stride;
        o->lent_offset[l] = o->lent_bytes;
        o->lent_bytes += (uint64_t)offload_lent_bundles(o, l) * o->stride;
    }
    const ncache_shape shape = offload_cache_shape(o, m);
    if (!(o->table_bytes = ncache_table_bytes(&shape))) {
        snprintf(err, errlen, "%s: a slot table of %u slots for %ld bundles per layer is out of range", o->plan_path,
                 shape.n_slots, o->n_bundles);
        goto fail;
    }
    o->unit = pow2_dividing(PAGE | o->gate_bytes | o->up_bytes | o->down_bytes);
    /* the lent region comes after the table and the pin logs, at a 2 MiB boundary */
    const uint64_t reach = offload_hot_region_bytes(o) + o->cold_bytes + o->table_bytes +
                           offload_pin_log_bytes(o, STACK_MAX_CPU_WORKERS) + o->lent_bytes + 2 * SHM_SPARSE_ALIGN;
    if (reach / o->unit > INT32_MAX) {
        snprintf(err, errlen, "%s: the neuron cache (%llu bytes) is too large to address in units of %zu bytes",
                 o->plan_path, (unsigned long long)reach, o->unit);
        goto fail;
    }
    if (make_ranges(o, m, err, errlen) || (positions && make_positions(o, m, err, errlen))) goto fail;
    return 0;
fail:
    offload_close(o);
    return -1;
}

void offload_close(offload *o) {
    if (o->plan) bundle_close(&o->bundles);
    plan_free(o->plan);
    free(o->ranges);
    free(o->hot_offset);
    free(o->lent_offset);
    free(o->pos_of);
    memset(o, 0, sizeof *o);
}

int offload_rebase(const offload *o, model *m, const uint8_t *image, uint64_t image_bytes) {
    weight **all = malloc(sizeof *all * (size_t)(2 + 7 * m->n_layer));
    if (!all) return -1;
    const int n_all = for_each_weight(m, all);
    int bad = 0;
    for (int i = 0; i < n_all; i++) {
        weight *w = all[i];
        if (!offload_preloads(o, m, w)) continue;
        const uint64_t at = (uint64_t)((const uint8_t *)w->data - m->gguf.base), bytes = weight_bytes(w);
        const preload_range *r = NULL;
        for (int k = 0; k < o->n_ranges && !r; k++)
            if (at >= o->ranges[k].file_offset && at - o->ranges[k].file_offset + bytes <= o->ranges[k].bytes)
                r = &o->ranges[k];
        if (!r || r->seg_offset + (at - r->file_offset) + bytes > image_bytes) {
            bad = 1;
            continue;
        }
        w->data = image + r->seg_offset + (at - r->file_offset);
    }
    if (m->tied_output) m->output = m->tok_embd;
    free(all);
    return bad ? -1 : 0;
}

ncache_shape offload_cache_shape(const offload *o, const model *m) {
    /* at least one slot: a plan with everything hot still has a (never used) table */
    return (ncache_shape){(uint32_t)m->n_layer, 1, (uint32_t)o->n_bundles, o->cold_slots ? o->cold_slots : 1,
                          o->stride};
}

void offload_hot_range(const offload *o, int l, uint64_t *file_offset, uint64_t *bytes) {
    *file_offset = bundle_file_offset(&o->bundles, l, 0);
    *bytes = (uint64_t)o->plan->hot_bundles[l] * o->stride;
}

void offload_lent_range(const offload *o, int l, uint64_t *file_offset, uint64_t *bytes) {
    *file_offset = bundle_file_offset(&o->bundles, l, o->plan->hot_bundles[l]);
    *bytes = (uint64_t)offload_lent_bundles(o, l) * o->stride;
}

uint64_t offload_pin_log_bytes(const offload *o, int n_workers) {
    return (uint64_t)n_workers * (uint64_t)o->n_bundles * sizeof(uint32_t);
}

int offload_lent_regions(shm_segment *seg, const offload *o, offload_lend **flag, uint8_t **lent, char *err,
                         size_t errlen) {
    uint64_t flag_bytes = 0, lent_bytes = 0;
    *flag = shm_region_ptr(seg, "lend", &flag_bytes);
    *lent = shm_region_ptr(seg, "lent", &lent_bytes);
    if (!*flag || !*lent || flag_bytes < sizeof **flag || lent_bytes != o->lent_bytes) {
        snprintf(err, errlen, "no \"lend\" and \"lent\" regions holding the plan's %llu bytes of lent bundles",
                 (unsigned long long)o->lent_bytes);
        return -1;
    }
    return 0;
}

ncache *offload_cache_attach(shm_segment *seg, char *err, size_t errlen) {
    uint64_t cold_bytes, table_bytes;
    uint8_t *cold = shm_region_ptr(seg, "cold", &cold_bytes);
    void *table = shm_region_ptr(seg, "table", &table_bytes);
    if (!cold || !table) {
        snprintf(err, errlen, "the neuron cache segment has no \"%s\" region", cold ? "table" : "cold");
        return NULL;
    }
    return ncache_attach(table, table_bytes, cold, cold_bytes, err, errlen);
}
