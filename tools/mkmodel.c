/* mkmodel: write a synthetic llama or bamboo GGUF (or PowerInfer PWRI) model
 * with a synthetic tokenizer and, for ReLU/ReLU² models, planted FFN activation
 * sparsity;
 * optionally load it back and measure the realized firing statistics.
 * See docs/mkmodel.md for the construction. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "synth/synth_model.h"
#include "synth/synth_vocab.h"
#include "synth/synth_measure.h"
#include "util/threadpool.h"

enum { T_EMBD, T_ATTN, T_FFN, T_OUTPUT, T_GROUPS };

typedef enum { ACT_DEFAULT, ACT_SILU, ACT_RELU, ACT_RELU2 } act_choice;
static const char *const act_names[] = {[ACT_SILU] = "silu", [ACT_RELU] = "relu", [ACT_RELU2] = "relu2"};

typedef struct {
    const char *out, *preset;
    const char *arch;    /* "llama" or "bamboo": general.architecture and the hyperparameter key prefix */
    act_choice act;      /* as given; ACT_DEFAULT until resolved from the architecture */
    bool act_given;      /* write pi2.ffn_activation even where the architecture implies it */
    synth_params sp;
    int n_ctx;
    uint32_t type[T_GROUPS];
    float rope_base, rms_eps;
    bool pwri, tied;
    int measure, threads;
} options;

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s -o OUT.gguf [options]\n"
            "Writes a synthetic llama or bamboo model (random weights, synthetic tokenizer). For ReLU\n"
            "models the FFN gate is built so that about --fire of the neurons fire per token, with the\n"
            "hottest neurons taking most firings (--hot); ReLU² (bamboo) uses the same gate and relu(up)\n"
            "zeroes about half of those. Generation streams tensor by tensor (bounded memory).\n"
            "  -o, --output PATH     output file (required)\n"
            "  --preset NAME         tiny (default) | small | 7b; the flags below override it\n"
            "  --dim N --layers N --heads N --kv-heads N --ff N --vocab N --ctx N\n"
            "  --type T              weight type for every 2-D tensor: f32 f16 q8_0 q4_0 (default q4_0)\n"
            "  --type-embd T --type-attn T --type-ffn T --type-output T   per group (norms stay f32)\n"
            "  --arch llama|bamboo   general.architecture and metadata key prefix (default llama)\n"
            "  --act relu|relu2|silu FFN activation: relu2 = relu(gate)*relu(up). Default relu for llama;\n"
            "                        for bamboo relu2, implied by the architecture (pi2.ffn_activation\n"
            "                        is written only when --act is given)\n"
            "  --seed N              PRNG seed (default 1); the output depends only on it and the flags\n"
            "  --fire F              ReLU: mean fraction of FFN neurons firing per token (default 0.10;\n"
            "                        relu2: of gates firing, about half of them are non-zero)\n"
            "  --hot A:B             ReLU: the hottest fraction A of neurons take share B of firings\n"
            "                        (default 0.20:0.80)\n"
            "  --rope-base F         RoPE frequency base (default 10000)\n"
            "  --tied                no output.weight: the output reuses token_embd\n"
            "  --pwri                PowerInfer file: magic PWRI, ffn_down_t instead of ffn_down and a\n"
            "                        low-rank predictor blk.N.fc1/fc2 of relu(gate) (relu or relu2)\n"
            "  --measure N           afterwards run N tokens through the reference engine and print the\n"
            "                        realized firing statistics per layer\n"
            "  -t, --threads N       generation/measurement threads (default 2)\n"
            "  -h, --help            this text\n",
            prog);
}

static int preset(options *o, const char *name) {
    synth_params *p = &o->sp;
    if (!strcmp(name, "tiny")) {
        p->n_embd = 128, p->n_layer = 2, p->n_head = 4, p->n_head_kv = 2, p->n_ff = 512, p->n_vocab = 512;
        o->n_ctx = 512;
    } else if (!strcmp(name, "small")) {
        p->n_embd = 512, p->n_layer = 8, p->n_head = 8, p->n_head_kv = 8, p->n_ff = 1376, p->n_vocab = 4096;
        o->n_ctx = 1024;
    } else if (!strcmp(name, "7b")) {
        p->n_embd = 4096, p->n_layer = 32, p->n_head = 32, p->n_head_kv = 32, p->n_ff = 11008, p->n_vocab = 32000;
        o->n_ctx = 2048;
    } else {
        return -1;
    }
    o->preset = name;
    return 0;
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static bool parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return !errno && end != s && !*end;
}

static bool parse_type(const char *s, uint32_t *out) {
    int t = ggml_type_from_name(s);
    if (t < 0 || !ggml_type_supported((uint32_t)t)) return false;
    *out = (uint32_t)t;
    return true;
}

/* Two passes: the preset first, so explicit shape flags override it wherever they appear. */
static int parse_args(options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    preset(o, "tiny");
    o->arch = "llama";
    o->sp.seed = 1;
    o->sp.fire = 0.10, o->sp.hot_frac = 0.20, o->sp.hot_share = 0.80;
    for (int g = 0; g < T_GROUPS; g++) o->type[g] = GGML_TYPE_Q4_0;
    o->rope_base = 10000.0f, o->rms_eps = 1e-5f;
    o->threads = 2;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--preset") && i + 1 < argc && preset(o, argv[++i]))
            return log_error("unknown preset '%s' (tiny, small, 7b)", argv[i]), -1;
    bool type_all = false, type_group[T_GROUPS] = {0};
    uint32_t type_all_v = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout, argv[0]);
            exit(0);
        }
        if (!strcmp(a, "--tied")) { o->tied = true; continue; }
        if (!strcmp(a, "--pwri")) { o->pwri = true; continue; }
        if (i + 1 >= argc) return log_error("unknown option or missing value: %s (see -h)", a), -1;
        const char *v = argv[++i];
        double f;
        bool ok = true;
        synth_params *p = &o->sp;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) o->out = v;
        else if (!strcmp(a, "--preset")) continue;
        else if (!strcmp(a, "--dim")) ok = parse_int(v, 32, 1 << 16, &p->n_embd);
        else if (!strcmp(a, "--layers")) ok = parse_int(v, 1, 4096, &p->n_layer);
        else if (!strcmp(a, "--heads")) ok = parse_int(v, 1, 1 << 12, &p->n_head);
        else if (!strcmp(a, "--kv-heads")) ok = parse_int(v, 1, 1 << 12, &p->n_head_kv);
        else if (!strcmp(a, "--ff")) ok = parse_int(v, 32, 1 << 18, &p->n_ff);
        else if (!strcmp(a, "--vocab")) ok = parse_int(v, SYNTH_VOCAB_MIN, SYNTH_VOCAB_MAX, &p->n_vocab);
        else if (!strcmp(a, "--ctx")) ok = parse_int(v, 1, 1 << 22, &o->n_ctx);
        else if (!strcmp(a, "--measure")) ok = parse_int(v, 1, 1 << 22, &o->measure);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = parse_int(v, 1, 256, &o->threads);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            p->seed = strtoull(v, &end, 0);
            ok = !errno && end != v && !*end;
        } else if (!strcmp(a, "--fire")) ok = parse_double(v, &p->fire);
        else if (!strcmp(a, "--rope-base")) {
            ok = parse_double(v, &f) && f > 0;
            o->rope_base = (float)f;
        }
        else if (!strcmp(a, "--arch")) {
            ok = !strcmp(v, "llama") || !strcmp(v, "bamboo");
            o->arch = ok && !strcmp(v, "bamboo") ? "bamboo" : "llama";
        } else if (!strcmp(a, "--act")) {
            ok = false;
            for (int k = ACT_SILU; k <= ACT_RELU2; k++)
                if (!strcmp(v, act_names[k])) o->act = (act_choice)k, ok = true;
            o->act_given = ok;
        } else if (!strcmp(a, "--hot")) {
            char *end;
            p->hot_frac = strtod(v, &end);
            ok = end != v && *end == ':' && parse_double(end + 1, &p->hot_share);
        } else if (!strcmp(a, "--type")) ok = parse_type(v, &type_all_v), type_all = true;
        else if (!strcmp(a, "--type-embd")) ok = parse_type(v, &o->type[T_EMBD]), type_group[T_EMBD] = true;
        else if (!strcmp(a, "--type-attn")) ok = parse_type(v, &o->type[T_ATTN]), type_group[T_ATTN] = true;
        else if (!strcmp(a, "--type-ffn")) ok = parse_type(v, &o->type[T_FFN]), type_group[T_FFN] = true;
        else if (!strcmp(a, "--type-output")) ok = parse_type(v, &o->type[T_OUTPUT]), type_group[T_OUTPUT] = true;
        else return log_error("unknown option %s (see -h)", a), -1;
        if (!ok) return log_error("bad value '%s' for %s", v, a), -1;
    }
    for (int g = 0; g < T_GROUPS; g++)
        if (type_all && !type_group[g]) o->type[g] = type_all_v;
    if (!o->out) return log_error("no output file: -o OUT.gguf (see -h)"), -1;
    if (o->act == ACT_DEFAULT) o->act = !strcmp(o->arch, "bamboo") ? ACT_RELU2 : ACT_RELU;
    o->sp.relu = o->act != ACT_SILU;
    o->sp.relu_up = o->act == ACT_RELU2;
    if (o->pwri && !o->sp.relu)
        return log_error("--pwri needs --act relu or relu2 (the predictor predicts relu(gate) firing)"), -1;
    return 0;
}

/* ---- tensor list ---- */

typedef struct {
    char name[64];
    synth_kind kind;
    int layer;
    uint32_t type, n_dims;
    int64_t rows, cols;
} tensor_spec;

typedef struct {
    tensor_spec *t;
    int n;
} tensor_list;

static void add_tensor(tensor_list *L, const synth_model *sm, const char *name, synth_kind k, int layer,
                       uint32_t type) {
    tensor_spec *t = &L->t[L->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = k, t->layer = layer;
    synth_shape(sm, k, &t->rows, &t->cols);
    t->n_dims = t->rows == 1 ? 1 : 2;
    t->type = t->n_dims == 1 ? GGML_TYPE_F32 : type; /* norms always F32 */
}

static int build_tensor_list(tensor_list *L, const options *o, const synth_model *sm) {
    int nl = o->sp.n_layer;
    L->t = calloc((size_t)(3 + 12 * nl), sizeof *L->t);
    if (!L->t) return -1;
    L->n = 0;
    add_tensor(L, sm, "token_embd.weight", SYN_TOKEN_EMBD, 0, o->type[T_EMBD]);
    add_tensor(L, sm, "output_norm.weight", SYN_OUTPUT_NORM, 0, GGML_TYPE_F32);
    if (!o->tied) add_tensor(L, sm, "output.weight", SYN_OUTPUT, 0, o->type[T_OUTPUT]);
    static const struct { const char *name; synth_kind kind; int group; } blk[] = {
        {"attn_norm", SYN_ATTN_NORM, T_ATTN}, {"attn_q", SYN_ATTN_Q, T_ATTN},     {"attn_k", SYN_ATTN_K, T_ATTN},
        {"attn_v", SYN_ATTN_V, T_ATTN},       {"attn_output", SYN_ATTN_OUT, T_ATTN}, {"ffn_norm", SYN_FFN_NORM, T_FFN},
        {"ffn_gate", SYN_FFN_GATE, T_FFN},    {"ffn_up", SYN_FFN_UP, T_FFN},       {"ffn_down", SYN_FFN_DOWN, T_FFN},
    };
    char name[64];
    for (int l = 0; l < nl; l++) {
        for (size_t i = 0; i < sizeof blk / sizeof *blk; i++) {
            synth_kind k = blk[i].kind;
            if (o->pwri && k == SYN_FFN_DOWN) k = SYN_FFN_DOWN_T; /* PowerInfer keeps down neuron-major */
            snprintf(name, sizeof name, "blk.%d.%s%s.weight", l, blk[i].name, k == SYN_FFN_DOWN_T ? "_t" : "");
            add_tensor(L, sm, name, k, l, o->type[blk[i].group]);
        }
        if (o->pwri) { /* predictor rows of 2(r+1) are not a multiple of 32: F16 */
            snprintf(name, sizeof name, "blk.%d.fc1.weight", l);
            add_tensor(L, sm, name, SYN_PRED_FC1, l, GGML_TYPE_F16);
            snprintf(name, sizeof name, "blk.%d.fc2.weight", l);
            add_tensor(L, sm, name, SYN_PRED_FC2, l, GGML_TYPE_F16);
        }
    }
    return 0;
}

/* ---- metadata ---- */

static uint32_t llama_file_type(const options *o) {
    for (int g = 1; g < T_GROUPS; g++)
        if (o->type[g] != o->type[0]) return UINT32_MAX; /* mixed: no single ftype */
    switch (o->type[0]) {
    case GGML_TYPE_F32: return 0;
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q8_0: return 7;
    default: return UINT32_MAX;
    }
}

static void write_metadata(gguf_writer *w, const options *o, const synth_model *sm, const synth_vocab *v) {
    const synth_params *p = &o->sp;
    char name[96];
    snprintf(name, sizeof name, "mkmodel %s%s%s %s seed %llu", strcmp(o->arch, "llama") ? o->arch : "",
             strcmp(o->arch, "llama") ? " " : "", o->preset ? o->preset : "custom", act_names[o->act],
             (unsigned long long)p->seed);
    gguf_w_str(w, "general.architecture", o->arch);
    gguf_w_str(w, "general.name", name);
    gguf_w_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
    if (llama_file_type(o) != UINT32_MAX) gguf_w_u32(w, "general.file_type", llama_file_type(o));
    /* hyperparameters under "<arch>.", as model_load reads them */
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, o->arch), key)
    char key[96];
    gguf_w_u32(w, ARCH_KEY("context_length"), (uint32_t)o->n_ctx);
    gguf_w_u32(w, ARCH_KEY("embedding_length"), (uint32_t)p->n_embd);
    gguf_w_u32(w, ARCH_KEY("block_count"), (uint32_t)p->n_layer);
    gguf_w_u32(w, ARCH_KEY("feed_forward_length"), (uint32_t)p->n_ff);
    gguf_w_u32(w, ARCH_KEY("attention.head_count"), (uint32_t)p->n_head);
    gguf_w_u32(w, ARCH_KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    gguf_w_u32(w, ARCH_KEY("rope.dimension_count"), (uint32_t)(p->n_embd / p->n_head));
    gguf_w_f32(w, ARCH_KEY("rope.freq_base"), o->rope_base);
    gguf_w_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), o->rms_eps);
    gguf_w_u32(w, ARCH_KEY("vocab_size"), (uint32_t)p->n_vocab);
#undef ARCH_KEY
    /* bamboo implies relu2 (model_load's default): leave the key out unless asked, so that default is used */
    if (strcmp(o->arch, "bamboo") || o->act_given) gguf_w_str(w, "pi2.ffn_activation", act_names[o->act]);
    gguf_w_u64(w, "pi2.mkmodel.seed", p->seed);
    if (p->relu) {
        gguf_w_f32(w, "pi2.mkmodel.fire", (float)p->fire);
        gguf_w_f32(w, "pi2.mkmodel.hot_fraction", (float)p->hot_frac);
        gguf_w_f32(w, "pi2.mkmodel.hot_share", (float)p->hot_share);
        gguf_w_f32(w, "pi2.mkmodel.lognormal_sigma", (float)synth_lognormal_sigma(sm));
        gguf_w_u32(w, "pi2.mkmodel.rank", (uint32_t)synth_rank(sm));
    }
    if (o->pwri) gguf_w_f32(w, "powerinfer.sparse_threshold", 0.0f);
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_str_arr(w, "tokenizer.ggml.tokens", (uint64_t)v->n, (const char *const *)v->text, NULL);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, (uint64_t)v->n, v->score);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, (uint64_t)v->n, v->type);
    gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false);
}

/* ---- streaming tensor data ---- */

typedef struct {
    const synth_model *sm;
    const tensor_spec *t;
    int64_t row0, nrows;
    size_t row_bytes;
    float *scratch; /* [n_threads][cols] */
    uint8_t *out;   /* [nrows][row_bytes] */
} gen_job;

static void gen_worker(void *ctx, int ith, int nth) {
    gen_job *j = ctx;
    long b, e;
    pool_split((long)j->nrows, ith, nth, &b, &e);
    float *row = j->scratch + (size_t)ith * j->t->cols;
    for (long r = b; r < e; r++) {
        synth_row(j->sm, j->t->kind, j->t->layer, j->row0 + r, row);
        quantize_row(j->t->type, row, j->out + (size_t)r * j->row_bytes, j->t->cols);
    }
}

#define BLOCK_BYTES (8u << 20) /* quantized bytes per generation step */

static int write_tensor_data(gguf_writer *w, threadpool *pool, const synth_model *sm, const tensor_spec *t,
                             float *scratch, uint8_t *buf) {
    size_t row_bytes = ggml_row_bytes(t->type, (uint64_t)t->cols);
    int64_t per_block = (int64_t)(BLOCK_BYTES / row_bytes);
    if (per_block < 1) per_block = 1;
    gen_job j = {sm, t, 0, 0, row_bytes, scratch, buf};
    for (int64_t r = 0; r < t->rows; r += per_block) {
        j.row0 = r;
        j.nrows = t->rows - r < per_block ? t->rows - r : per_block;
        pool_run(pool, gen_worker, &j);
        if (gguf_w_data(w, buf, (size_t)j.nrows * row_bytes)) return -1;
    }
    return 0;
}

/* Relative quantization error energy of gate rows in `type`, measured on a
 * few rows of a model built without that correction. */
static double gate_quant_error(const synth_params *p, uint32_t type) {
    if (type == GGML_TYPE_F32) return 0;
    char err[256];
    synth_model *sm = synth_model_new(p, err, sizeof err);
    if (!sm) return 0; /* the caller's own synth_model_new reports the problem */
    int d = p->n_embd;
    float *row = malloc(2 * (size_t)d * sizeof *row);
    void *q = malloc(ggml_row_bytes(type, (uint64_t)d) + ggml_row_bytes(GGML_TYPE_F32, (uint64_t)d));
    double num = 0, den = 0;
    for (int i = 0; row && q && i < 16 && i < p->n_ff; i++) {
        synth_row(sm, SYN_FFN_GATE, 0, i, row);
        quantize_row(type, row, q, d);
        dequantize_row(type, q, row + d, d);
        for (int k = 0; k < d; k++) num += (row[k] - row[d + k]) * (double)(row[k] - row[d + k]), den += (double)row[k] * row[k];
    }
    free(row);
    free(q);
    synth_model_free(sm);
    return den > 0 ? num / den : 0;
}

static int write_model(const options *o, const synth_model *sm, const synth_vocab *v) {
    tensor_list L = {0};
    int rc = -1;
    gguf_writer *w = gguf_writer_new(o->pwri ? "PWRI" : "GGUF", GGUF_DEFAULT_ALIGNMENT);
    threadpool *pool = pool_new(o->threads);
    FILE *fp = fopen(o->out, "wb");
    int64_t max_cols = 0;
    float *scratch = NULL;
    uint8_t *buf = NULL;
    if (!fp) {
        log_error("%s: %s", o->out, strerror(errno));
        goto done;
    }
    if (!w || !pool || build_tensor_list(&L, o, sm)) {
        log_error("out of memory");
        goto done;
    }
    write_metadata(w, o, sm, v);
    uint64_t total = 0;
    for (int i = 0; i < L.n; i++) {
        const tensor_spec *t = &L.t[i];
        uint64_t ne[2] = {(uint64_t)t->cols, (uint64_t)t->rows};
        if (gguf_w_tensor(w, t->name, t->type, t->n_dims, ne) < 0) {
            log_error("%s: %s", t->name, gguf_writer_error(w) ? gguf_writer_error(w) : "cannot declare tensor");
            goto done;
        }
        if (t->cols > max_cols) max_cols = t->cols;
        total += ggml_row_bytes(t->type, (uint64_t)t->cols) * (uint64_t)t->rows;
    }
    scratch = malloc((size_t)o->threads * (size_t)max_cols * sizeof *scratch);
    buf = malloc(BLOCK_BYTES + ggml_row_bytes(GGML_TYPE_F32, (uint64_t)max_cols));
    if (!scratch || !buf) {
        log_error("out of memory");
        goto done;
    }
    if (gguf_w_begin(w, fp)) goto write_error;
    log_info("writing %s: %d tensors, %.1f MiB of weights", o->out, L.n, (double)total / (1 << 20));
    double t0 = clock_seconds();
    for (int i = 0; i < L.n; i++) {
        if (write_tensor_data(w, pool, sm, &L.t[i], scratch, buf)) goto write_error;
        if (i + 1 < L.n && L.t[i + 1].layer != L.t[i].layer)
            log_info("layer %d written (%.1f s)", L.t[i].layer, clock_seconds() - t0);
    }
    if (gguf_w_finish(w)) goto write_error;
    if (fclose(fp)) {
        fp = NULL;
        log_error("%s: %s", o->out, strerror(errno));
        goto done;
    }
    fp = NULL;
    log_info("wrote %s in %.1f s", o->out, clock_seconds() - t0);
    rc = 0;
    goto done;
write_error:
    log_error("%s: %s", o->out, gguf_writer_error(w) ? gguf_writer_error(w) : strerror(errno));
done:
    if (fp) fclose(fp);
    if (rc) remove(o->out);
    free(scratch);
    free(buf);
    free(L.t);
    pool_free(pool);
    gguf_writer_free(w);
    return rc;
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    options o;
    if (parse_args(&o, argc, argv)) return 2;
    char err[512];
    synth_vocab v;
    if (synth_vocab_build(&v, o.sp.n_vocab, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    if (o.sp.relu) o.sp.gate_quant_err = gate_quant_error(&o.sp, o.type[T_FFN]);
    synth_model *sm = synth_model_new(&o.sp, err, sizeof err);
    if (!sm) {
        log_error("%s", err);
        synth_vocab_free(&v);
        return 1;
    }
    if (o.sp.relu)
        log_info("planting: fire %.3f, hottest %.2f take %.3f (log-normal sigma %.3f), token subspace rank %d, "
                 "gate quantization error %.2g",
                 o.sp.fire, o.sp.hot_frac, synth_expected_hot_share(sm), synth_lognormal_sigma(sm), synth_rank(sm),
                 o.sp.gate_quant_err);
    if (o.sp.relu_up)
        log_info("relu2: the targets are for relu(gate); relu(up) zeroes about half of those neurons, so expect "
                 "about %.3f non-zero per token", o.sp.fire / 2);
    int rc = write_model(&o, sm, &v);
    synth_vocab_free(&v);
    if (rc == 0 && o.measure > 0) {
        measure_opts mo = {o.out, o.measure, o.threads, o.sp.seed, o.sp.relu, o.sp.fire, o.sp.hot_frac,
                           o.sp.hot_share};
        rc = synth_measure(&mo);
    }
    synth_model_free(sm);
    return rc ? 1 : 0;
}
