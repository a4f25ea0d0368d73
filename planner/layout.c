/* Budget to layout (layout.h). */
#include "layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ffn_stream.h"
#include "engine/predictor.h"
#include "engine/prompt.h"
#include "plan/bundle.h"
#include "plan/plan_file.h"
#include "util/log.h"

static uint64_t kv_bytes(const model *m, int ctx) {
    return (uint64_t)m->n_layer * (uint64_t)ctx * (uint64_t)(m->n_head_kv * m->head_dim) * 2 /* K, V */ * 2 /* F16 */;
}

/* the predictor's first stage (fc1: n_embd x rank) as a share of its weights (fc2: rank x n_ff beside
 * it); 0 without a predictor in the model (a side file's stages are not known here: all second stage) */
static double stage1_share(const model *m) {
    const weight *fc1 = &m->layers[0].fc1, *fc2 = &m->layers[0].fc2;
    if (!fc1->data || !fc2->data) return 0;
    const double e1 = (double)fc1->rows * (double)fc1->cols, e2 = (double)fc2->rows * (double)fc2->cols;
    return e1 + e2 > 0 ? e1 / (e1 + e2) : 0;
}

void layout_fixed_of(const layout_inputs *in, layout_fixed *f) {
    const model *m = in->m;
    memset(f, 0, sizeof *f);
    const uint64_t norms = (uint64_t)m->n_embd * sizeof(float);
    /* an F16 PowerInfer predictor the kernels convert: one Q8_0 copy in the weights segment (stack/offload.h) */
    const uint64_t shared_copy = in->side_predictor_bytes ? 0 : predictor_q8_0_image_bytes(m);
    uint64_t attention = 0, predictor = shared_copy, gates = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        attention += weight_bytes(&w->wq) + weight_bytes(&w->wk) + weight_bytes(&w->wv) + weight_bytes(&w->wo) + 2 * norms;
        for (int i = 0; i < 2 && !in->side_predictor_bytes; i++) {
            const weight *p = i ? &w->fc2 : &w->fc1;
            if (!shared_copy || (p->type != GGML_TYPE_F16 && p->type != GGML_TYPE_F32)) predictor += weight_bytes(p);
        }
        gates += weight_bytes(&w->gate);
    }
    predictor += in->side_predictor_bytes; /* the side file's weights, about its size */
    /* the token embedding is read a row at a time, unless the output shares it */
    const uint64_t output = weight_bytes(m->tied_output ? &m->tok_embd : &m->output) + norms;
    const uint64_t row = m->tok_embd.row_bytes;
    f->gate_row = m->layers[0].gate.row_bytes;
    f->up_row = m->layers[0].up.row_bytes;
    f->down_row = ggml_row_bytes(bundle_down_type(m), (uint64_t)m->n_embd);
    f->neuron_bytes = f->gate_row + f->up_row + f->down_row;
    const bool predicts = in->mode == FFN_PREDICTOR;
    const uint64_t kv = kv_bytes(m, in->ctx);
    f->preload = attention + output + row + (predicts ? predictor : gates) + kv;
    /* a decode token also reads the keys and values before it: over a context of ctx tokens, half the
     * cache on average (134 MB a token for a 7B model at ctx 512, ~7 % of a predictor token's bytes) */
    f->dense_bytes = (double)(attention + output + (predicts ? predictor : 0)) + 0.5 * (double)kv;
    /* the guess runs the first stage whole in every cpu-worker, the second for its own neurons */
    const double stage1 = predicts ? (double)predictor * stage1_share(m) : 0;
    f->guess_whole_bytes = stage1;
    f->guess_split_bytes = predicts ? (double)predictor - stage1 : 0;
    const uint64_t prompt = prompt_pass_bytes(m, in->max_prefill, in->ctx, in->threads);
    f->process = (uint64_t)(in->n_processes + 1) * PROCESS_BYTES_EACH + STACK_SHARED_BYTES + prompt;
    /* the npu-worker's staging slots (npu-worker/prefill.c) */
    f->staging = ffn_stream_bytes(m, ffn_stream_prefill_which(in->mode), prompt_pass_neuron_step(m));
    f->lendable = prompt + f->staging;
}

uint64_t layout_stride(const layout_fixed *f, int per_bundle) {
    const uint64_t bytes = (uint64_t)per_bundle * f->neuron_bytes;
    return (bytes + BUNDLE_ALIGN - 1) / BUNDLE_ALIGN * BUNDLE_ALIGN;
}

/* The io-worker's CPU for a batch of bundle loads, beside each read's, in wake-ups of a sleeping thread
 * (hw_profile.wake_us): the doorbell's, about four more as the reads complete (file_reader_reap waits
 * for a quarter of those in flight), and the batch's submission and slot claims. On the 7B file at 3 GiB
 * (Zen 5): 8.4 ms of io-worker CPU a token for ~1,280 reads at 3.7 us each and ~90 batches, ~41 us a
 * batch, against a 5.9 us wake-up. */
#define IO_WAKES_PER_BATCH 7

/* A layer's next bundle against another's: more needed first, then the lower layer. */
static bool ahead(const bundle_order *o, const long *hot, int a, int b) {
    const double pa = o->p_bundle[(size_t)a * (size_t)o->n_bundles + (size_t)hot[a]];
    const double pb = o->p_bundle[(size_t)b * (size_t)o->n_bundles + (size_t)hot[b]];
    return pa > pb || (pa == pb && a < b);
}

/* heap[0..n) of layers ordered by ahead(): moves heap[i] down to its place */
static void sift_down(const bundle_order *o, const long *hot, int *heap, int n, int i) {
    for (;;) {
        int best = i;
        const int l = 2 * i + 1, r = l + 1;
        if (l < n && ahead(o, hot, heap[l], heap[best])) best = l;
        if (r < n && ahead(o, hot, heap[r], heap[best])) best = r;
        if (best == i) return;
        const int t = heap[i];
        heap[i] = heap[best], heap[best] = t;
        i = best;
    }
}

/* In the file's order a layer's needs are not strictly descending: the `total` bundles are taken one at a
 * time from the layer whose next whole bundle is most needed (a prefix per layer, as the bundle file
 * and the prompt's pinned rows want it). Returns how many it took. */
static long allocate_in_file_order(const bundle_order *o, int n_layer, long total, long *hot) {
    int *heap = malloc(sizeof(int) * (size_t)n_layer), n = 0;
    if (!heap) {
        log_error("out of memory pinning bundles: none pinned");
        return 0;
    }
    for (int l = 0; l < n_layer; l++)
        if (o->n_whole > 0) heap[n++] = l;
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(o, hot, heap, n, i);
    long taken = 0;
    while (taken < total && n > 0) {
        const int l = heap[0];
        hot[l]++, taken++;
        if (hot[l] == o->n_whole) heap[0] = heap[--n];
        sift_down(o, hot, heap, n, 0);
    }
    free(heap);
    return taken;
}

/* the hot bundles: the `total` most needed across layers. Each layer's whole bundles are descending, so
 * per layer a prefix; equal bundles are the same size, so this maximizes the expected hits exactly. A
 * short last bundle (not in the descending order) is pinned only after all its layer's whole ones. */
static void allocate_hot(const bundle_order *o, int n_layer, long total, long *hot) {
    const long n = o->n_bundles, whole = o->n_whole, all = (long)n_layer * n, all_whole = (long)n_layer * whole;
    if (total >= all) {
        for (int l = 0; l < n_layer; l++) hot[l] = n;
        return;
    }
    memset(hot, 0, sizeof(long) * (size_t)n_layer);
    if (total <= 0) return;
    long taken = 0;
    if (o->file_order) {
        taken = allocate_in_file_order(o, n_layer, total < all_whole ? total : all_whole, hot);
    } else if (whole > 0) {
        const double threshold = o->p_desc[(total < all_whole ? total : all_whole) - 1];
        for (int l = 0; l < n_layer; l++) {
            const double *p = o->p_bundle + (size_t)l * n;
            while (hot[l] < whole && p[hot[l]] > threshold) hot[l]++;
            taken += hot[l];
        }
        for (int l = 0; l < n_layer && taken < total; l++) { /* ties, layer by layer */
            const double *p = o->p_bundle + (size_t)l * n;
            while (hot[l] < whole && taken < total && p[hot[l]] >= threshold) hot[l]++, taken++;
        }
    }
    for (int l = 0; l < n_layer && taken < total; l++) /* short last bundles, behind full layers */
        if (hot[l] == whole && whole < n) hot[l]++, taken++;
}

/* the smallest depth within 10 % of the best IOPS at this read size */
static int queue_depth_for(const hw_profile *hw, uint64_t stride) {
    double best = 0;
    for (int d = 0; d < HW_IO_DEPTHS; d++) best = fmax(best, hw_io_iops(hw, stride, hw_io_depth[d]));
    for (int d = 0; d < HW_IO_DEPTHS; d++)
        if (hw_io_iops(hw, stride, hw_io_depth[d]) >= 0.9 * best) return hw_io_depth[d];
    return hw_io_depth[HW_IO_DEPTHS - 1];
}

static void predict(const layout_inputs *in, const layout_fixed *f, layout *lay, const long *resident);

/* hot_total bundles pinned, and lent_slots more between prompts: lay's hot and lent bundles and the
 * prediction of decode with both resident (the most needed hot_total + lent_slots: a superset of the
 * hot ones, layer by layer). */
static void place(const layout_inputs *in, const layout_fixed *f, layout *lay, long hot_total, long lent_slots,
                  long *resident) {
    const int n_layer = in->m->n_layer;
    allocate_hot(lay->order, n_layer, hot_total, lay->hot_bundles);
    allocate_hot(lay->order, n_layer, hot_total + lent_slots, resident);
    for (int l = 0; l < n_layer; l++) {
        lay->lent_bundles[l] = resident[l] > lay->hot_bundles[l] ? resident[l] - lay->hot_bundles[l] : 0;
        resident[l] = lay->hot_bundles[l] + lay->lent_bundles[l];
    }
    predict(in, f, lay, resident);
}

/* Hot bundles that fit in room beside lay's cold slots, at most all. */
static long hot_fitting(const layout *lay, uint64_t room, long all) {
    const uint64_t cold = (uint64_t)lay->cold_slots * lay->stride;
    const uint64_t hot = cold < room ? (room - cold) / lay->hot_stride : 0;
    return hot < (uint64_t)all ? (long)hot : all;
}

/* The cold shares tried, largest first: the first is kept unless a smaller one is predicted faster by
 * SMALLER_COLD_MARGIN. */
static const double cold_shares[] = {0.10, 0.05, 0.02, 0.0};
#define COLD_SHARES ((int)(sizeof cold_shares / sizeof *cold_shares))

int layout_make(const layout_inputs *in, const layout_fixed *f, const bundle_order *order, uint64_t budget,
                layout *lay) {
    const int n_layer = in->m->n_layer;
    memset(lay, 0, sizeof *lay);
    lay->order = order;
    lay->budget = budget;
    lay->stride = layout_stride(f, order->per_bundle);
    lay->hot_stride = (uint64_t)order->per_bundle * f->neuron_bytes;
    lay->queue_depth = queue_depth_for(in->hw, lay->stride);
    lay->max_prefill = in->max_prefill;
    lay->process = f->process;
    lay->hot_bundles = calloc((size_t)n_layer, sizeof(long));
    lay->lent_bundles = calloc((size_t)n_layer, sizeof(long));
    long *resident = calloc((size_t)n_layer, sizeof(long));
    /* a minimal cold cache: one layer's needed bundles twice over (in flight, and being computed) */
    double most = 0;
    for (int l = 0; l < n_layer; l++) {
        double need = 0;
        for (long b = 0; b < order->n_bundles; b++) need += order->p_bundle[(size_t)l * order->n_bundles + b];
        most = fmax(most, need);
    }
    const long min_cold = 2 * (long)ceil(most) + 1;
    const uint64_t fixed = f->preload + f->process;
    const uint64_t all_ffn = (uint64_t)n_layer * (uint64_t)order->n_bundles * lay->stride;
    lay->floor = fixed + f->staging + (uint64_t)min_cold * lay->stride;
    if (!lay->hot_bundles || !lay->lent_bundles || !resident) {
        log_error("out of memory for a layout of %d layers", n_layer);
        free(resident);
        return -1;
    }
    if (budget >= fixed + all_ffn) {
        lay->all_resident = true;
        lay->hot_stride = lay->stride;
        place(in, f, lay, (long)n_layer * order->n_bundles, 0, resident);
        free(resident);
        return 0;
    }
    if (budget < lay->floor) {
        free(resident);
        return -1;
    }
    /* the cold shares are of the budget's room counted in slots; the hot bundles take the rest, packed */
    const uint64_t room = budget - fixed - f->staging;
    const long slots = (long)(room / lay->stride), all = (long)n_layer * order->n_bundles;
    const long lent_slots = (long)(f->lendable / lay->stride);
    /* The cold share predicted fastest; a larger one unless a smaller is faster by a margin, as the model
     * counts no reuse between tokens and real text has some. */
    long best_cold = -1;
    double best_tps = 0;
    for (int i = 0; i < COLD_SHARES; i++) {
        long cold = (long)(cold_shares[i] * (double)slots);
        if (cold < min_cold) cold = min_cold;
        if (cold > slots) cold = slots;
        lay->cold_slots = cold;
        place(in, f, lay, hot_fitting(lay, room, all), lent_slots, resident);
        if (best_cold < 0 || lay->pred.tok_s > best_tps * (1 + SMALLER_COLD_MARGIN))
            best_cold = cold, best_tps = lay->pred.tok_s;
    }
    lay->cold_slots = best_cold;
    place(in, f, lay, hot_fitting(lay, room, all), lent_slots, resident);
    free(resident);
    return 0;
}

/* lay->pred with resident[l] bundles of each layer in memory and lay's cold slots. */
static void predict(const layout_inputs *in, const layout_fixed *f, layout *lay, const long *resident) {
    const int n_layer = in->m->n_layer;
    const bundle_order *order = lay->order;
    const cost_inputs ci = {.n_layer = n_layer,
                            .n_ff = in->m->n_ff,
                            .mode = in->mode,
                            .dense_bytes = f->dense_bytes,
                            .gate_row = f->gate_row,
                            .up_row = f->up_row,
                            .down_row = f->down_row,
                            .active = order->active,
                            .n_bundles = order->n_bundles,
                            .stride = (size_t)lay->stride,
                            .p_bundle = order->p_bundle,
                            .p_unasked = order->p_unasked,
                            .guess_whole_bytes = f->guess_whole_bytes,
                            .guess_split_bytes = f->guess_split_bytes};
    const cost_layout cl = {.hot_bundles = resident,
                            .cold_slots = lay->cold_slots,
                            .queue_depth =
                                (int)plan_reads_in_flight((unsigned)lay->queue_depth, (unsigned)in->cpu_workers),
                            .threads = in->threads,
                            .io_cpu_us = in->io_shares_compute ? hw_io_cpu_us(in->hw, lay->stride, in->checksums) : 0,
                            /* each cpu-worker's batch: IO_WAKES_PER_BATCH wake-ups of the io-worker */
                            .io_batch_us = in->io_shares_compute ? in->cpu_workers * IO_WAKES_PER_BATCH * in->hw->wake_us
                                                                 : 0};
    cost_predict(&ci, in->hw, &cl, &lay->pred);
}

void layout_free(layout *lay) {
    free(lay->hot_bundles);
    free(lay->lent_bundles);
    lay->hot_bundles = lay->lent_bundles = NULL;
}
