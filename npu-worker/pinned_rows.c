#include "pinned_rows.h"

#include <stdlib.h>

#include "util/log.h"

struct pinned_rows {
    const stack_view *sv;
    char seg_name[SHM_NAME_MAX];
    shm_segment *seg;
    const uint8_t *hot;  /* the segment's "hot" region */
    ffn_stream_resident source;
};

/* Where neuron n of layer l is, when its bundle is pinned. */
static const uint8_t *pinned(void *ctx, int l, long n) {
    const pinned_rows *p = ctx;
    const offload *o = &p->sv->off;
    const int32_t pos = o->pos_of[(size_t)l * (size_t)p->sv->m.n_ff + (size_t)n];
    const uint32_t bundle = (uint32_t)(pos / o->per_bundle);
    if (bundle >= o->plan->hot_bundles[l]) return NULL;
    return p->hot + o->hot_offset[l] + (uint64_t)bundle * o->hot_stride +
           (uint64_t)(pos % o->per_bundle) * o->neuron_bytes;
}

/* Whether the bundles hold each row the prompt pass streams as the model has it. */
static bool rows_as_in_model(const stack_view *sv) {
    const bundle_file *b = &sv->off.bundles;
    for (int l = 0; l < sv->m.n_layer; l++) {
        const layer_weights *w = &sv->m.layers[l];
        if (!w->down_t.data || w->down_t.type != b->down_type || w->down_t.row_bytes != b->down_bytes ||
            w->up.type != b->up_type || w->up.row_bytes != b->up_bytes)
            return false;
        if (sv->off.mode != FFN_GATE_FIRST && (w->gate.type != b->gate_type || w->gate.row_bytes != b->gate_bytes))
            return false;
    }
    return true;
}

pinned_rows *pinned_rows_open(const stack_view *sv, const char *runid) {
    if (!sv->budgeted) return NULL;
    if (!sv->off.pos_of || !rows_as_in_model(sv)) {
        log_info("the prompt reads every FFN row it streams: the bundles do not hold them as the model does");
        return NULL;
    }
    pinned_rows *p = calloc(1, sizeof *p);
    if (!p || shm_make_name(p->seg_name, sizeof p->seg_name, runid, STACK_SEG_FFN)) {
        log_error("pinned rows: %s", p ? shm_last_error() : "out of memory");
        free(p);
        return NULL;
    }
    p->sv = sv;
    const bundle_file *b = &sv->off.bundles;
    p->source = (ffn_stream_resident){.rows = pinned, .ctx = p, .gate_off = 0, .up_off = b->gate_bytes,
                                      .down_off = b->gate_bytes + b->up_bytes};
    return p;
}

const ffn_stream_resident *pinned_rows_source(pinned_rows *p) {
    if (!p) return NULL;
    if (p->seg && !shm_is_stale(p->seg)) return &p->source;
    shm_detach(p->seg);
    p->seg = NULL;
    uint64_t bytes = 0;
    if (!(p->seg = shm_attach(p->seg_name, SHM_KIND_SLOTS, SHM_ATTACH_READONLY | SHM_ATTACH_NO_POPULATE)) ||
        !(p->hot = shm_region_ptr(p->seg, "hot", &bytes)) || bytes < offload_hot_region_bytes(&p->sv->off)) {
        log_warn("neuron cache segment %s: %s; the prompt reads every FFN row", p->seg_name,
                 p->seg ? "no hot region of the plan's size" : shm_last_error());
        shm_detach(p->seg);
        p->seg = NULL;
        return NULL;
    }
    return &p->source;
}

void pinned_rows_close(pinned_rows *p) {
    if (!p) return;
    shm_detach(p->seg);
    free(p);
}
