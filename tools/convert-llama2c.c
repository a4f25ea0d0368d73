/* convert-llama2c: a llama2.c checkpoint (+ its tokenizer.bin) to a GGUF
 * `llama` model. Formats: ../shared/models/README.md. llama2.c rotates
 * adjacent pairs like GGUF, so Q/K are written without permutation. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "util/log.h"

typedef struct {
    const uint8_t *base;
    size_t size;
    const char *path;
} mapped;

static int map_file(mapped *f, const char *path) {
    f->path = path;
    int fd = open(path, O_RDONLY);
    if (fd < 0) { log_error("%s: %s", path, strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fd, &st) || st.st_size == 0) { log_error("%s: empty or unreadable", path); close(fd); return -1; }
    f->size = (size_t)st.st_size;
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) { log_error("%s: mmap: %s", path, strerror(errno)); return -1; }
    f->base = p;
    return 0;
}

typedef struct {
    int32_t dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len;
    int shared_classifier;
} ckpt_config;

/* Offsets (in floats) of each array in the checkpoint body. */
typedef struct {
    uint64_t tok_emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, classifier, end;
} ckpt_layout;

static int read_config(const mapped *f, ckpt_config *c, ckpt_layout *L) {
    if (f->size < 7 * sizeof(int32_t)) { log_error("%s: %zu bytes is too short for the 28-byte header", f->path, f->size); return -1; }
    int32_t h[7];
    memcpy(h, f->base, sizeof h);
    c->dim = h[0]; c->hidden = h[1]; c->n_layers = h[2]; c->n_heads = h[3]; c->n_kv_heads = h[4];
    c->shared_classifier = h[5] > 0;
    c->vocab = h[5] > 0 ? h[5] : -h[5];
    c->seq_len = h[6];
    const char *names[] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    int32_t vals[] = {c->dim, c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab, c->seq_len};
    for (int i = 0; i < 7; i++)
        if (vals[i] <= 0 || vals[i] > (1 << 20)) {
            log_error("%s: header field %s (offset %d) = %d is out of range", f->path, names[i], i * 4, vals[i]);
            return -1;
        }
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads || (c->dim / c->n_heads) % 2) {
        log_error("%s: dim %d, n_heads %d, n_kv_heads %d do not divide into even heads", f->path, c->dim, c->n_heads, c->n_kv_heads);
        return -1;
    }
    uint64_t d = (uint64_t)c->dim, hd = d / (uint64_t)c->n_heads, kv = hd * (uint64_t)c->n_kv_heads;
    uint64_t nl = (uint64_t)c->n_layers, hid = (uint64_t)c->hidden, o = 0;
    L->tok_emb = o; o += (uint64_t)c->vocab * d;
    L->rms_att = o; o += nl * d;
    L->wq = o; o += nl * d * d;
    L->wk = o; o += nl * kv * d;
    L->wv = o; o += nl * kv * d;
    L->wo = o; o += nl * d * d;
    L->rms_ffn = o; o += nl * d;
    L->w1 = o; o += nl * hid * d;
    L->w2 = o; o += nl * d * hid;
    L->w3 = o; o += nl * hid * d;
    L->rms_final = o; o += d;
    o += 2 * (uint64_t)c->seq_len * hd / 2; /* legacy freq_cis_real/imag tables */
    L->classifier = c->shared_classifier ? L->tok_emb : o;
    if (!c->shared_classifier) o += (uint64_t)c->vocab * d;
    L->end = o;
    uint64_t need = 28 + o * 4;
    if (f->size < need) {
        log_error("%s: file has %zu bytes, the header's shape needs %llu (truncated?)", f->path, f->size, (unsigned long long)need);
        return -1;
    }
    if (f->size > need) log_warn("%s: %zu trailing bytes ignored", f->path, f->size - (size_t)need);
    return 0;
}

typedef struct {
    uint64_t n;
    char **text;
    uint64_t *lens;
    float *scores;
    int32_t *types;
} vocab;

/* llama2.c tokenizer.bin: int32 max_token_length, then per token f32 score, int32 len, bytes. */
/* a llama2.c token as GGUF stores it: ' ' as U+2581 (SentencePiece's visible
 * space, which the tokenizer looks up), as llama.cpp's converter writes it */
static char *sentencepiece_text(const char *src, size_t len, size_t *text_len) {
    static const char space_mark[] = "\xe2\x96\x81";
    size_t spaces = 0;
    for (size_t j = 0; j < len; j++) spaces += src[j] == ' ';
    char *text = malloc(len + spaces * (sizeof space_mark - 2) + 1), *out = text;
    if (!text) return NULL;
    for (size_t j = 0; j < len; j++) {
        if (src[j] == ' ') {
            memcpy(out, space_mark, sizeof space_mark - 1);
            out += sizeof space_mark - 1;
        } else {
            *out++ = src[j];
        }
    }
    *out = 0;
    *text_len = (size_t)(out - text);
    return text;
}

static int read_vocab(const mapped *f, int n, vocab *v) {
    v->n = (uint64_t)n;
    v->text = calloc((size_t)n, sizeof(char *));
    v->lens = calloc((size_t)n, sizeof(uint64_t));
    v->scores = calloc((size_t)n, sizeof(float));
    v->types = calloc((size_t)n, sizeof(int32_t));
    if (!v->text || !v->lens || !v->scores || !v->types) { log_error("out of memory"); return -1; }
    size_t off = 4;
    if (f->size < 4) { log_error("%s: too short for max_token_length", f->path); return -1; }
    for (int i = 0; i < n; i++) {
        int32_t len;
        if (f->size - off < 8) { log_error("%s: token %d: header at offset %zu past the end", f->path, i, off); return -1; }
        memcpy(&v->scores[i], f->base + off, 4);
        memcpy(&len, f->base + off + 4, 4);
        off += 8;
        if (len < 0 || (size_t)len > f->size - off) {
            log_error("%s: token %d: length %d at offset %zu runs past the end", f->path, i, len, off - 4);
            return -1;
        }
        /* llama2.c stores BOS/EOS as "\n<s>\n" and "\n</s>\n" (so its own decoder
         * prints line breaks); llama.cpp's converter writes the plain names */
        const char *special = i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : NULL;
        size_t text_len = special ? strlen(special) : 0;
        v->text[i] = special ? strdup(special) : sentencepiece_text((const char *)f->base + off, (size_t)len, &text_len);
        if (!v->text[i]) { log_error("out of memory"); return -1; }
        v->lens[i] = (uint64_t)text_len;
        off += (size_t)len;
        /* token types as llama.cpp's converter assigns them */
        unsigned byte;
        char tail;
        if (i == 0) v->types[i] = 2;                           /* unknown */
        else if (i == 1 || i == 2) v->types[i] = 3;            /* control: BOS, EOS */
        else if (text_len == 6 && sscanf(v->text[i], "<0x%2X>%c", &byte, &tail) == 1) v->types[i] = 6; /* byte */
        else v->types[i] = 1;                                  /* normal */
    }
    return 0;
}

static void free_vocab(vocab *v) {
    for (uint64_t i = 0; v->text && i < v->n; i++) free(v->text[i]);
    free(v->text); free(v->lens); free(v->scores); free(v->types);
}

typedef struct {
    const char *name;
    uint64_t offset; /* floats into the body */
    uint64_t ne0, ne1;
    uint32_t type;
} tensor_plan;

static int choose_type(uint32_t wanted, uint64_t ne0, uint64_t ne1, const char *name) {
    if (ne1 == 1 || wanted == GGML_TYPE_F32) return GGML_TYPE_F32; /* vectors stay F32, as llama.cpp keeps norms */
    if (ne0 % ggml_block_elems(wanted)) {
        log_warn("%s: row length %llu is not a multiple of %u: kept as f32", name, (unsigned long long)ne0, ggml_block_elems(wanted));
        return GGML_TYPE_F32;
    }
    return (int)wanted;
}

static void usage(FILE *f) {
    fprintf(f, "usage: convert-llama2c -i CHECKPOINT.bin -k TOKENIZER.bin -o OUT.gguf [--outtype f32|f16|q8_0|q4_0] [--name NAME]\n"
               "Converts a llama2.c checkpoint and tokenizer to a GGUF llama model.\n");
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    const char *in = NULL, *tok = NULL, *out = NULL, *name = "llama2c";
    uint32_t outtype = GGML_TYPE_F32;
    static const struct option longopts[] = {{"outtype", required_argument, 0, 'T'}, {"name", required_argument, 0, 'N'},
                                             {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "i:k:o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'i': in = optarg; break;
        case 'k': tok = optarg; break;
        case 'o': out = optarg; break;
        case 'N': name = optarg; break;
        case 'T': {
            int t = ggml_type_from_name(optarg);
            if (t < 0 || !ggml_type_supported((uint32_t)t)) { log_error("--outtype: unknown type '%s'", optarg); return 2; }
            outtype = (uint32_t)t;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!in || !tok || !out) { usage(stderr); return 2; }

    mapped ck, tk;
    ckpt_config cfg;
    ckpt_layout L;
    vocab voc = {0};
    if (map_file(&ck, in) || read_config(&ck, &cfg, &L) || map_file(&tk, tok) || read_vocab(&tk, cfg.vocab, &voc)) {
        free_vocab(&voc);
        return 1;
    }
    const float *body = (const float *)(ck.base + 28);
    uint64_t d = (uint64_t)cfg.dim, hd = d / (uint64_t)cfg.n_heads, kv = hd * (uint64_t)cfg.n_kv_heads, hid = (uint64_t)cfg.hidden;

    gguf_writer *w = gguf_writer_new("GGUF", GGUF_DEFAULT_ALIGNMENT);
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_str(w, "general.name", name);
    gguf_w_u32(w, "llama.context_length", (uint32_t)cfg.seq_len);
    gguf_w_u32(w, "llama.embedding_length", (uint32_t)cfg.dim);
    gguf_w_u32(w, "llama.feed_forward_length", (uint32_t)cfg.hidden);
    gguf_w_u32(w, "llama.block_count", (uint32_t)cfg.n_layers);
    gguf_w_u32(w, "llama.attention.head_count", (uint32_t)cfg.n_heads);
    gguf_w_u32(w, "llama.attention.head_count_kv", (uint32_t)cfg.n_kv_heads);
    gguf_w_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_str(w, "pi2.ffn_activation", "silu");
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_str_arr(w, "tokenizer.ggml.tokens", voc.n, (const char *const *)voc.text, voc.lens);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, voc.n, voc.scores);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, voc.n, voc.types);
    gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);

    /* tensor list in llama.cpp order: the body offset of each and its [ne0, ne1] */
    enum { MAXT = 4 + 9 * 1024 };
    static tensor_plan plan[MAXT];
    static char names[MAXT][64];
    int nt = 0;
#define ADD(nm, off, a, b) do { snprintf(names[nt], sizeof names[nt], "%s", nm); \
        plan[nt] = (tensor_plan){names[nt], (off), (a), (b), 0}; nt++; } while (0)
    if (cfg.n_layers > 1024) { log_error("%s: %d layers is more than this converter handles (1024)", in, cfg.n_layers); return 1; }
    ADD("token_embd.weight", L.tok_emb, d, (uint64_t)cfg.vocab);
    ADD("output_norm.weight", L.rms_final, d, 1);
    if (!cfg.shared_classifier) ADD("output.weight", L.classifier, d, (uint64_t)cfg.vocab);
    for (uint64_t l = 0; l < (uint64_t)cfg.n_layers; l++) {
        char nm[64];
#define LAYER(suffix, off, a, b) do { snprintf(nm, sizeof nm, "blk.%llu." suffix, (unsigned long long)l); ADD(nm, off, a, b); } while (0)
        LAYER("attn_norm.weight", L.rms_att + l * d, d, 1);
        LAYER("attn_q.weight", L.wq + l * d * d, d, d);
        LAYER("attn_k.weight", L.wk + l * kv * d, d, kv);
        LAYER("attn_v.weight", L.wv + l * kv * d, d, kv);
        LAYER("attn_output.weight", L.wo + l * d * d, d, d);
        LAYER("ffn_norm.weight", L.rms_ffn + l * d, d, 1);
        LAYER("ffn_gate.weight", L.w1 + l * hid * d, d, hid);
        LAYER("ffn_down.weight", L.w2 + l * d * hid, hid, d);
        LAYER("ffn_up.weight", L.w3 + l * hid * d, d, hid);
#undef LAYER
    }
#undef ADD
    for (int i = 0; i < nt; i++) {
        plan[i].type = (uint32_t)choose_type(outtype, plan[i].ne0, plan[i].ne1, plan[i].name);
        uint64_t ne[2] = {plan[i].ne0, plan[i].ne1};
        gguf_w_tensor(w, plan[i].name, plan[i].type, plan[i].ne1 == 1 ? 1 : 2, ne);
    }

    FILE *fp = fopen(out, "wb");
    if (!fp) { log_error("%s: %s", out, strerror(errno)); return 1; }
    int rc = gguf_w_begin(w, fp);
    void *row = malloc(ggml_row_bytes(GGML_TYPE_F32, d > hid ? d : hid));
    for (int i = 0; i < nt && !rc && row; i++) {
        for (uint64_t r = 0; r < plan[i].ne1 && !rc; r++) {
            const float *src = body + plan[i].offset + r * plan[i].ne0;
            quantize_row(plan[i].type, src, row, (int64_t)plan[i].ne0);
            rc = gguf_w_data(w, row, ggml_row_bytes(plan[i].type, plan[i].ne0));
        }
    }
    if (!rc) rc = gguf_w_finish(w);
    if (rc || !row) log_error("%s: %s", out, row ? gguf_writer_error(w) : "out of memory");
    if (fclose(fp) && !rc) { log_error("%s: %s", out, strerror(errno)); rc = -1; }
    if (rc) unlink(out);
    else log_info("wrote %s: %d layers, dim %d, vocab %d, %s", out, cfg.n_layers, cfg.dim, cfg.vocab, ggml_type_name(outtype));
    free(row);
    gguf_writer_free(w);
    free_vocab(&voc);
    return rc ? 1 : 0;
}
