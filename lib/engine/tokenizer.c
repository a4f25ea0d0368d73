/* SentencePiece-BPE tokenizer, the same algorithm as llama.cpp's llm_tokenizer_spm. */
#include "engine/tokenizer.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF tokenizer.ggml.token_type values */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

static const char SPACE_MARK[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's visible space */
#define SPACE_MARK_LEN 3

struct tokenizer {
    int n_vocab;
    char *text;          /* all token strings back to back (copied: the GGUF may be closed) */
    size_t *off;         /* token i is text[off[i] .. off[i] + len[i]) */
    uint32_t *len;
    float *score;
    uint8_t *type;
    uint8_t *byte_value; /* for TOK_BYTE tokens: the byte "<0xXX>" stands for */
    int32_t *slot;       /* open-addressing hash table: token id or -1 */
    uint64_t slot_mask;
    uint32_t max_len;    /* longest token, to reject long candidate merges without hashing */
    int32_t byte_token[256];
    int bos, eos, unk;
    bool space_prefix;
    bool add_bos;
};

static void fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int lookup(const tokenizer *t, const char *s, size_t n) {
    if (n == 0 || n > t->max_len) return -1;
    for (uint64_t i = hash_bytes(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slot[i];
        if (id < 0) return -1;
        if (t->len[id] == n && !memcmp(t->text + t->off[id], s, n)) return id;
    }
}

/* A later duplicate replaces an earlier one, as in llama.cpp's token_to_id map. */
static void insert(tokenizer *t, int32_t id) {
    const char *s = t->text + t->off[id];
    size_t n = t->len[id];
    for (uint64_t i = hash_bytes(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t old = t->slot[i];
        if (old < 0 || (t->len[old] == n && !memcmp(t->text + t->off[old], s, n))) {
            t->slot[i] = id;
            return;
        }
    }
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xXX>" -> XX, or -1 */
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Optional special-token id: absent -> default; present -> must index the vocab. */
static bool special_id(const gguf_file *g, const char *key, int def, int n_vocab, int *out,
                       char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    *out = def;
    if (!kv) return true;
    uint64_t v;
    if (!gguf_get_uint(g, key, &v) || v >= (uint64_t)n_vocab) {
        fail(err, errlen, "tokenizer: %s is not a token id below n_vocab %d", key, n_vocab);
        return false;
    }
    *out = (int)v;
    return true;
}

static bool load_arrays(tokenizer *t, const gguf_file *g, char *err, size_t errlen) {
    uint64_t n;
    const gguf_str *strs;
    if (!gguf_get_str_arr(g, "tokenizer.ggml.tokens", &n, &strs)) {
        fail(err, errlen, "tokenizer: no string array tokenizer.ggml.tokens in the GGUF");
        return false;
    }
    if (n == 0 || n > INT32_MAX / 2) {
        fail(err, errlen, "tokenizer: tokenizer.ggml.tokens has %llu entries", (unsigned long long)n);
        return false;
    }
    uint64_t n_scores, n_types;
    const void *scores, *types;
    if (!gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_FLOAT32, &n_scores, &scores) ||
        !gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_INT32, &n_types, &types)) {
        fail(err, errlen, "tokenizer: tokenizer.ggml.scores (f32) or tokenizer.ggml.token_type (i32) missing");
        return false;
    }
    if (n_scores != n || n_types != n) {
        fail(err, errlen, "tokenizer: array lengths disagree: %llu tokens, %llu scores, %llu token types",
             (unsigned long long)n, (unsigned long long)n_scores, (unsigned long long)n_types);
        return false;
    }
    t->n_vocab = (int)n;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].len > UINT32_MAX || strs[i].len > SIZE_MAX - total) {
            fail(err, errlen, "tokenizer: token %llu is too long", (unsigned long long)i);
            return false;
        }
        total += strs[i].len;
    }
    t->text = malloc(total ? total : 1);
    t->off = malloc(n * sizeof *t->off);
    t->len = malloc(n * sizeof *t->len);
    t->score = malloc(n * sizeof *t->score);
    t->type = malloc(n);
    t->byte_value = calloc(n, 1);
    if (!t->text || !t->off || !t->len || !t->score || !t->type || !t->byte_value) {
        fail(err, errlen, "tokenizer: out of memory for %llu tokens", (unsigned long long)n);
        return false;
    }
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        memcpy(t->text + pos, strs[i].ptr, strs[i].len);
        t->off[i] = pos;
        t->len[i] = (uint32_t)strs[i].len;
        pos += strs[i].len;
        if (t->len[i] > t->max_len) t->max_len = t->len[i];
        /* the GGUF arrays are little-endian and may be unaligned */
        memcpy(&t->score[i], (const char *)scores + 4 * i, 4);
        int32_t ty;
        memcpy(&ty, (const char *)types + 4 * i, 4);
        if (ty < TOK_NORMAL || ty > TOK_BYTE) {
            fail(err, errlen, "tokenizer: token %llu has token_type %d (expected 1..6)", (unsigned long long)i, (int)ty);
            return false;
        }
        t->type[i] = (uint8_t)ty;
        if (ty == TOK_BYTE) {
            int b = parse_byte_token(t->text + t->off[i], t->len[i]);
            if (b < 0) {
                fail(err, errlen, "tokenizer: byte token %llu is \"%.*s\", not <0xXX>", (unsigned long long)i,
                     (int)(t->len[i] > 32 ? 32 : t->len[i]), t->text + t->off[i]);
                return false;
            }
            t->byte_value[i] = (uint8_t)b;
        }
    }
    return true;
}

static bool build_index(tokenizer *t, char *err, size_t errlen) {
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)t->n_vocab) cap *= 2;
    t->slot = malloc(cap * sizeof *t->slot);
    if (!t->slot) {
        fail(err, errlen, "tokenizer: out of memory for the token index");
        return false;
    }
    memset(t->slot, 0xff, cap * sizeof *t->slot);
    t->slot_mask = cap - 1;
    for (int i = 0; i < t->n_vocab; i++)
        if (t->len[i]) insert(t, i);
    for (int b = 0; b < 256; b++) {
        char name[7];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_token[b] = lookup(t, name, 6);
        if (t->byte_token[b] < 0) { /* llama.cpp then tries the byte itself as a token */
            char c = (char)b;
            t->byte_token[b] = lookup(t, &c, 1);
        }
    }
    return true;
}

tokenizer *tokenizer_from_gguf(const gguf_file *g, char *err, size_t errlen) {
    gguf_str model;
    if (!gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        fail(err, errlen, "tokenizer: the GGUF has no tokenizer.ggml.model");
        return NULL;
    }
    if (!gguf_str_eq(model, "llama")) {
        fail(err, errlen, "tokenizer: tokenizer.ggml.model is \"%.*s\"; only \"llama\" (SentencePiece) is supported",
             (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return NULL;
    }
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        fail(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    bool space_prefix = true;
    if (gguf_find_kv(g, "tokenizer.ggml.add_space_prefix") &&
        !gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &space_prefix)) {
        fail(err, errlen, "tokenizer: tokenizer.ggml.add_space_prefix is not a bool");
        goto fail;
    }
    t->space_prefix = space_prefix;
    bool add_bos = true;
    if (gguf_find_kv(g, "tokenizer.ggml.add_bos_token") &&
        !gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos)) {
        fail(err, errlen, "tokenizer: tokenizer.ggml.add_bos_token is not a bool");
        goto fail;
    }
    t->add_bos = add_bos;
    if (!load_arrays(t, g, err, errlen) || !build_index(t, err, errlen)) goto fail;
    /* llama.cpp's SPM defaults: <unk>=0, <s>=1, </s>=2 */
    if (!special_id(g, "tokenizer.ggml.bos_token_id", 1, t->n_vocab, &t->bos, err, errlen) ||
        !special_id(g, "tokenizer.ggml.eos_token_id", 2, t->n_vocab, &t->eos, err, errlen) ||
        !special_id(g, "tokenizer.ggml.unknown_token_id", 0, t->n_vocab, &t->unk, err, errlen))
        goto fail;
    if (t->bos >= t->n_vocab || t->eos >= t->n_vocab || t->unk >= t->n_vocab) {
        fail(err, errlen, "tokenizer: default special ids 0..2 need a vocab of at least 3 tokens, got %d", t->n_vocab);
        goto fail;
    }
    return t;
fail:
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->byte_value);
    free(t->slot);
    free(t);
}

int tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int tokenizer_bos(const tokenizer *t) { return t->bos; }
int tokenizer_eos(const tokenizer *t) { return t->eos; }
bool tokenizer_adds_bos(const tokenizer *t) { return t->add_bos; }

/* ---- encoding ---- */

typedef struct {
    size_t start, n; /* bytes of the escaped text; n == 0 once merged into its left neighbour */
    int prev, next;
} symbol;

typedef struct {
    float score;
    int left, right;
    size_t size; /* bytes of the merged pair when queued: a mismatch later means it is stale */
} bigram;

typedef struct {
    bigram *a;
    size_t n, cap;
} bigram_heap;

/* Higher score first; on equal scores the leftmost pair (llama.cpp's comparator). */
static bool bigram_before(const bigram *x, const bigram *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static bool heap_push(bigram_heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        bigram *a = realloc(h->a, cap * sizeof *a);
        if (!a) return false;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = b;
    return true;
}

static bigram heap_pop(bigram_heap *h) {
    bigram top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->a[c + 1], &h->a[c])) c++;
        if (!bigram_before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

typedef struct {
    const tokenizer *t;
    const char *text;
    symbol *sym;
    bigram_heap heap;
} spm_session;

/* Queue the pair (left, right) if their concatenation is a token. */
static bool try_add_bigram(spm_session *s, int left, int right) {
    if (left < 0 || right < 0) return true;
    size_t n = s->sym[left].n + s->sym[right].n;
    int id = lookup(s->t, s->text + s->sym[left].start, n);
    if (id < 0) return true;
    bigram b = {s->t->score[id], left, right, n};
    return heap_push(&s->heap, b);
}

/* UTF-8 sequence length from the lead byte; stray continuation bytes count as one (as llama.cpp). */
static size_t utf8_len(uint8_t c) {
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* ' ' -> U+2581, with one prepended when the tokenizer adds a space prefix. */
static char *escape_spaces(const tokenizer *t, const char *text, size_t *out_len) {
    size_t n = strlen(text), spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += text[i] == ' ';
    if (spaces > (SIZE_MAX - n - SPACE_MARK_LEN - 1) / (SPACE_MARK_LEN - 1)) return NULL;
    char *buf = malloc(n + spaces * (SPACE_MARK_LEN - 1) + (t->space_prefix ? SPACE_MARK_LEN : 0) + 1);
    if (!buf) return NULL;
    size_t o = 0;
    if (t->space_prefix) {
        memcpy(buf, SPACE_MARK, SPACE_MARK_LEN);
        o = SPACE_MARK_LEN;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(buf + o, SPACE_MARK, SPACE_MARK_LEN);
            o += SPACE_MARK_LEN;
        } else {
            buf[o++] = text[i];
        }
    }
    buf[o] = 0;
    *out_len = o;
    return buf;
}

static void emit(int32_t *out, int max, int *count, int32_t id) {
    if (*count < max) out[*count] = id;
    (*count)++;
}

int tokenizer_encode(const tokenizer *t, const char *text, int add_bos, int32_t *out, int max) {
    int count = 0;
    if (add_bos) emit(out, max, &count, t->bos);
    if (!*text) return count <= max ? count : -1; /* llama.cpp: "" gives no space prefix either */

    size_t n;
    char *buf = escape_spaces(t, text, &n);
    symbol *sym = buf ? malloc(n * sizeof *sym) : NULL;
    spm_session s = {t, buf, sym, {0}};
    bool ok = sym != NULL;
    int n_sym = 0;
    for (size_t o = 0; ok && o < n; n_sym++) {
        size_t len = utf8_len((uint8_t)buf[o]);
        if (len > n - o) len = n - o;
        sym[n_sym] = (symbol){o, len, n_sym - 1, o + len == n ? -1 : n_sym + 1};
        o += len;
    }
    for (int i = 1; ok && i < n_sym; i++) ok = try_add_bigram(&s, i - 1, i);

    while (ok && s.heap.n) {
        bigram b = heap_pop(&s.heap);
        symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        ok = try_add_bigram(&s, l->prev, b.left) && try_add_bigram(&s, b.left, l->next);
    }

    /* Every merged symbol is a token (pairs are only queued if they are), so llama.cpp's
     * resegment reduces to: a token, or a single character spelled out as byte tokens. */
    for (int i = 0; ok && n_sym && count <= max && i != -1; i = sym[i].next) {
        int id = lookup(t, buf + sym[i].start, sym[i].n);
        if (id >= 0) {
            emit(out, max, &count, id);
            continue;
        }
        for (size_t j = 0; j < sym[i].n; j++) {
            int32_t bt = t->byte_token[(uint8_t)buf[sym[i].start + j]];
            emit(out, max, &count, bt >= 0 ? bt : t->unk);
        }
    }
    free(s.heap.a);
    free(sym);
    free(buf);
    return ok && count <= max ? count : -1;
}

/* ---- decoding ---- */

static size_t put(char *buf, size_t cap, size_t o, const char *s, size_t n) {
    if (o < cap) memcpy(buf + o, s, n < cap - o ? n : cap - o);
    return o + n;
}

size_t tokenizer_piece(const tokenizer *t, int32_t token, char *buf, size_t cap) {
    if (token < 0 || token >= t->n_vocab) return 0;
    const char *s = t->text + t->off[token];
    size_t n = t->len[token], o = 0;
    switch (t->type[token]) {
    case TOK_BYTE:
        o = put(buf, cap, 0, (const char *)&t->byte_value[token], 1);
        break;
    case TOK_USER:
        o = put(buf, cap, 0, s, n);
        break;
    case TOK_NORMAL:
        for (size_t i = 0; i < n;) {
            if (n - i >= SPACE_MARK_LEN && !memcmp(s + i, SPACE_MARK, SPACE_MARK_LEN)) {
                o = put(buf, cap, o, " ", 1);
                i += SPACE_MARK_LEN;
            } else {
                o = put(buf, cap, o, s + i, 1);
                i++;
            }
        }
        break;
    default: /* control, unknown, unused: not part of the text */
        break;
    }
    return o < cap ? o : cap;
}
