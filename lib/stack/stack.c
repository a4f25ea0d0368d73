#include "stack/stack.h"

#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "stack/chunk_queue.h"
#include "util/clock.h"
#include "util/cpu_relax.h"

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

void act_layout_compute(act_layout *L, const model *m, const stack_params *p) {
    uint64_t off = 0, f = sizeof(float);
    L->x_layers = off; off = align64(off + (uint64_t)(m->n_layer + 1) * (uint64_t)m->n_embd * f);
    L->x_mid = off;    off = align64(off + (uint64_t)m->n_embd * f);
    L->att_out = off;  off = align64(off + (uint64_t)m->n_embd * f);
    L->hb = off;       off = align64(off + (uint64_t)m->n_ff * f);
    L->ffn_partials = off; off = align64(off + (uint64_t)ffn_chunk_count(m) * (uint64_t)m->n_embd * f);
    L->chunk_queues = off; off += (uint64_t)p->n_cpu_workers * chunk_queue_bytes(ffn_chunk_count(m));
    L->logits = off;   off = align64(off + (uint64_t)m->n_vocab * f);
    L->tokens = off;   off = align64(off + (uint64_t)p->max_prefill * sizeof(int32_t));
    L->total = off;
}

uint64_t kv_region_bytes(const model *m, int n_ctx) {
    return (uint64_t)m->n_layer * (uint64_t)n_ctx * (uint64_t)m->n_head_kv * (uint64_t)m->head_dim * sizeof(uint16_t);
}

uint64_t weights_file_offset(const model *m) { return m->gguf.data_offset & ~(uint64_t)4095; }

uint64_t weights_region_bytes(const model *m) {
    uint64_t n = (uint64_t)m->gguf.size - weights_file_offset(m);
    return (n + 4095) & ~(uint64_t)4095;
}

static int rebase_one(const model *m, weight *w, const void *image, uint64_t image_bytes) {
    if (!w->data) return 0;
    uint64_t at = (uint64_t)((const uint8_t *)w->data - m->gguf.base), start = weights_file_offset(m);
    uint64_t bytes = (uint64_t)w->rows * w->row_bytes;
    if (at < start || at - start > image_bytes || bytes > image_bytes - (at - start)) return -1;
    w->data = (const uint8_t *)image + (at - start);
    return 0;
}

int model_rebase(model *m, const void *image, uint64_t image_bytes) {
    int bad = rebase_one(m, &m->tok_embd, image, image_bytes);
    if (m->tied_output) m->output = m->tok_embd;
    else bad |= rebase_one(m, &m->output, image, image_bytes);
    for (int l = 0; l < m->n_layer; l++) {
        layer_weights *w = &m->layers[l];
        weight *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->gate, &w->up, &w->down, &w->down_t, &w->fc1, &w->fc2};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) bad |= rebase_one(m, all[i], image, image_bytes);
    }
    return bad ? -1 : 0;
}

void work_share_even_cut(int worker, int n_workers, uint32_t *begin, uint32_t *end) {
    *begin = (uint32_t)((uint64_t)WORK_SHARE_ONE * (uint64_t)worker / (uint64_t)n_workers);
    *end = (uint32_t)((uint64_t)WORK_SHARE_ONE * (uint64_t)(worker + 1) / (uint64_t)n_workers);
}

void work_share_from_cut(work_share *s, const model *m, uint32_t begin, uint32_t end) {
    s->cut_begin = begin, s->cut_end = end;
    s->kvh_begin = work_share_at(m->n_head_kv, begin), s->kvh_end = work_share_at(m->n_head_kv, end);
    const long group = m->n_head_kv ? m->n_head / m->n_head_kv : 0;
    s->qh_begin = s->kvh_begin * group, s->qh_end = s->kvh_end * group;
    s->row_begin = work_share_at(m->n_embd, begin), s->row_end = work_share_at(m->n_embd, end);
    s->ff_begin = work_share_at(m->n_ff, begin), s->ff_end = work_share_at(m->n_ff, end);
    s->vocab_begin = work_share_at(m->n_vocab, begin), s->vocab_end = work_share_at(m->n_vocab, end);
}

void work_share_compute(work_share *s, const model *m, int worker, int n_workers) {
    uint32_t begin, end;
    work_share_even_cut(worker, n_workers, &begin, &end);
    work_share_from_cut(s, m, begin, end);
}

void ctl_init(stack_ctl *c, const stack_params *p, const char *model_path, uint64_t model_size,
              const char *predictor_path, const char *plan_path) {
    memset(c, 0, offsetof(stack_ctl, bundle_rings)); /* the rings' words are never read before written */
    for (int i = 0; i < STACK_MAX_CPU_WORKERS; i++) bundle_ring_init(&c->bundle_rings[i]);
    c->params = *p;
    snprintf(c->model_path, sizeof c->model_path, "%s", model_path);
    snprintf(c->predictor_path, sizeof c->predictor_path, "%s", predictor_path ? predictor_path : "");
    snprintf(c->plan_path, sizeof c->plan_path, "%s", plan_path ? plan_path : "");
    c->model_size = model_size;
    atomic_store(&c->epoch, 1);
    atomic_store(&c->barrier, (uint64_t)1 << 32);
    c->magic = STACK_CTL_MAGIC; /* last: a concurrent attacher never sees a half-made block */
}

int ctl_check(const stack_ctl *c, const char *model_path, uint64_t model_size, char *err, size_t errlen) {
    if (c->magic != STACK_CTL_MAGIC) { snprintf(err, errlen, "control block: bad magic"); return -1; }
    char resolved[PATH_MAX];
    if (realpath(model_path, resolved)) model_path = resolved; /* cachemgr stores the canonical path */
    if (c->model_size != model_size || strncmp(c->model_path, model_path, sizeof c->model_path)) {
        snprintf(err, errlen, "the stack runs model '%.200s' (%llu bytes), not '%.200s'", c->model_path,
                 (unsigned long long)c->model_size, model_path);
        return -1;
    }
    const stack_params *p = &c->params;
    if (p->n_ctx < 1 || p->n_cpu_workers < 1 || p->n_cpu_workers > STACK_MAX_CPU_WORKERS || p->max_prefill < 1 ||
        p->ffn_mode < FFN_DENSE || p->ffn_mode > FFN_PREDICTOR ||
        !memchr(c->predictor_path, 0, sizeof c->predictor_path) || !memchr(c->plan_path, 0, sizeof c->plan_path)) {
        snprintf(err, errlen,
                 "control block: bad stack parameters (n_ctx %d, cpu workers %d, max_prefill %d, ffn mode %d)",
                 p->n_ctx, p->n_cpu_workers, p->max_prefill, p->ffn_mode);
        return -1;
    }
    return 0;
}

proc_row *ctl_proc_find(stack_ctl *c, const char *name) {
    for (int i = 0; i < STACK_MAX_PROCS; i++)
        if (!strncmp(c->procs[i].name, name, sizeof c->procs[i].name)) return &c->procs[i];
    return NULL;
}

proc_row *ctl_proc_claim(stack_ctl *c, const char *name, int32_t pid) {
    proc_row *row = ctl_proc_find(c, name); /* a restarted process takes its old row */
    for (int i = 0; i < STACK_MAX_PROCS && !row; i++) {
        /* a free row is taken by swapping its pid from 0, so two processes
         * starting at once never share one; the name is written after */
        int32_t none = 0;
        if (!c->procs[i].name[0] && atomic_compare_exchange_strong(&c->procs[i].pid, &none, pid)) {
            row = &c->procs[i];
            snprintf(row->name, sizeof row->name, "%s", name);
        }
    }
    if (!row) return NULL;
    atomic_store(&row->pid, pid);
    atomic_fetch_add(&row->starts, 1);
    ctl_proc_beat(row, PROC_STARTING);
    return row;
}

void ctl_proc_beat(proc_row *r, enum proc_state st) {
    atomic_store(&r->heartbeat_ms, clock_ms());
    atomic_store(&r->state, (uint32_t)st);
}

#define B_EPOCH(w) ((uint32_t)((w) >> 32))
#define B_ARRIVED(w) ((uint32_t)(((w) >> 16) & 0xffff))
#define B_PHASE(w) ((uint32_t)((w) & 0xffff))
#define B_PACK(e, a, p) (((uint64_t)(e) << 32) | ((uint64_t)((a) & 0xffff) << 16) | (uint64_t)((p) & 0xffff))

int ctl_barrier_wait(stack_ctl *c, uint32_t epoch, int n, int timeout_ms) {
    uint64_t w = atomic_load(&c->barrier), next;
    do {
        if (B_EPOCH(w) != epoch) return -1;
        uint32_t arrived = B_ARRIVED(w) + 1;
        next = arrived == (uint32_t)n ? B_PACK(epoch, 0, B_PHASE(w) + 1) : B_PACK(epoch, arrived, B_PHASE(w));
    } while (!atomic_compare_exchange_weak(&c->barrier, &w, next));
    if (B_ARRIVED(next) == 0) return 0; /* we were the last */
    uint32_t phase = B_PHASE(w);
    int64_t deadline = clock_ms() + timeout_ms;
    for (unsigned i = 0;; i++) {
        /* acquire: pairs with the last arrival's seq_cst compare-exchange that moved the phase on, so
         * every row the other workers wrote before arriving is seen here */
        uint64_t cur = atomic_load_explicit(&c->barrier, memory_order_acquire);
        if (B_EPOCH(cur) != epoch) return -1;
        if (B_PHASE(cur) != phase) return 0;
        ctl_wait_step(i);
        if (i >= CTL_SPINS && (i & 255) == 0 && clock_ms() > deadline) return -1;
    }
}

void ctl_wait_step(unsigned i) {
    if (i < CTL_SPINS) cpu_relax();
    else sched_yield(); /* the worker waited for may share our core */
}

uint32_t ctl_barrier_tag(const stack_ctl *c) {
    /* acquire, as ctl_barrier_wait's: a tag read after the barrier comes with what it published */
    uint64_t w = atomic_load_explicit(&c->barrier, memory_order_acquire);
    return (B_EPOCH(w) << 16) | B_PHASE(w);
}

uint32_t ctl_new_epoch(stack_ctl *c) {
    uint32_t e = (uint32_t)atomic_fetch_add(&c->epoch, 1) + 1;
    atomic_store(&c->barrier, B_PACK(e, 0, 0));
    return e;
}
