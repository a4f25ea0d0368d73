/* Tokenizer: llama.cpp's ids on the oracle prompts, its decoded text, hand-worked merge cases on a
 * tiny vocab, byte fallback, round trips of long text, and bad metadata. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "gguf/gguf.h"
#include "oracle.h"
#include "test.h"
#include "engine/tokenizer.h"

#define MAX_TOKENS 4096

static char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static char *oracle_dir(void) { return path_join(shared_dir(), "oracle"); }

/* Concatenated pieces of tokens[0..n) into buf; returns the length (or SIZE_MAX if it overflows). */
static size_t detokenize(const tokenizer *t, const int32_t *tokens, int n, char *buf, size_t cap) {
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        char piece[256];
        size_t len = tokenizer_piece(t, tokens[i], piece, sizeof piece);
        if (len > cap - o) return SIZE_MAX;
        memcpy(buf + o, piece, len);
        o += len;
    }
    return o;
}

static tokenizer *open_tokenizer(const char *gguf_path, gguf_file *g) {
    char err[512];
    if (gguf_open(g, gguf_path, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    tokenizer *t = tokenizer_from_gguf(g, err, sizeof err);
    if (!t) fprintf(stderr, "%s: %s\n", gguf_path, err);
    return t;
}

static void check_oracle_case(const char *path, int *n_cases) {
    char err[512];
    oracle_case c;
    int rc = oracle_load(&c, path, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc) return;
    char *dir = oracle_dir();
    char *gguf_path = path_join(dir, c.model);
    gguf_file g;
    tokenizer *t = open_tokenizer(gguf_path, &g);
    CHECK(t != NULL, "cannot load the tokenizer of %s", gguf_path);
    if (t) {
        (*n_cases)++;
        int32_t ids[MAX_TOKENS];
        int n = tokenizer_encode(t, c.prompt, 1, ids, MAX_TOKENS);
        int same = n == c.n_prompt;
        for (int i = 0; same && i < n; i++) same = ids[i] == c.prompt_tokens[i];
        CHECK(same, "%s: prompt \"%s\": %d tokens, llama.cpp %d (first difference below)", path, c.prompt,
              n, c.n_prompt);
        if (!same)
            for (int i = 0; i < n && i < c.n_prompt; i++)
                if (ids[i] != c.prompt_tokens[i]) {
                    fprintf(stderr, "  at %d: pi2 %d, llama.cpp %d\n", i, ids[i], c.prompt_tokens[i]);
                    break;
                }

        int32_t *gen = malloc((size_t)(c.n_steps ? c.n_steps : 1) * sizeof *gen);
        for (int i = 0; i < c.n_steps; i++) gen[i] = c.steps[i].token;
        char text[1 << 14];
        size_t len = detokenize(t, gen, c.n_steps, text, sizeof text);
        CHECK(len == c.text_len && !memcmp(text, c.text, c.text_len),
              "%s: decoded %zu bytes \"%.*s\", llama.cpp %zu bytes \"%.*s\"", path, len,
              (int)(len == SIZE_MAX ? 0 : len), text, c.text_len, (int)c.text_len, (const char *)c.text);
        free(gen);
        tokenizer_free(t);
        gguf_close(&g);
    }
    free(gguf_path);
    free(dir);
    oracle_free(&c);
}

static void test_oracle(void) {
    const char *patterns[] = {"tok.t*.json", "*.p*.json"};
    int expected_min[] = {4, 15};
    char *dir = oracle_dir();
    for (int p = 0; p < 2; p++) {
        char *sub = path_join(dir, "llama.cpp");
        char *pattern = path_join(sub, patterns[p]);
        glob_t gl;
        int n_cases = 0;
        if (glob(pattern, 0, NULL, &gl) == 0) {
            for (size_t i = 0; i < gl.gl_pathc; i++) check_oracle_case(gl.gl_pathv[i], &n_cases);
            globfree(&gl);
        }
        CHECK(n_cases >= expected_min[p], "%s: %d oracle cases checked, expected at least %d", pattern, n_cases,
              expected_min[p]);
        free(pattern);
        free(sub);
    }
    free(dir);
}

/* Ids found by a plain scan of the GGUF's token strings, independent of the tokenizer's index. */
static int scan_token(const gguf_file *g, const char *s) {
    uint64_t n;
    const gguf_str *strs;
    if (!gguf_get_str_arr(g, "tokenizer.ggml.tokens", &n, &strs)) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (gguf_str_eq(strs[i], s)) return (int)i;
    return -1;
}

/* "☕" is not in the stories260K vocab: "▁" then its three UTF-8 bytes as <0xXX> tokens. */
static void test_byte_fallback(const tokenizer *t, const gguf_file *g) {
    const char *cup = "\xe2\x98\x95";
    int32_t want[4] = {scan_token(g, "\xe2\x96\x81"), scan_token(g, "<0xE2>"), scan_token(g, "<0x98>"),
                       scan_token(g, "<0x95>")};
    CHECK(scan_token(g, cup) < 0, "the test needs a character outside the vocab");
    int32_t ids[8];
    int n = tokenizer_encode(t, cup, 0, ids, 8);
    CHECK(n == 4 && !memcmp(ids, want, sizeof want), "byte fallback: got %d tokens [%d %d %d %d]", n, ids[0], ids[1],
          ids[2], ids[3]);
    char text[16];
    size_t len = detokenize(t, ids, n > 0 ? n : 0, text, sizeof text);
    CHECK(len == 4 && !memcmp(text, " \xe2\x98\x95", 4), "byte tokens decode back to the character");
}

/* Long mixed text: the output must decode back to the input (after the space prefix), and the
 * priority-queue merge must keep long inputs fast. */
static void test_long_text(const tokenizer *t) {
    static const char *words[] = {"Once", "upon", "a", "time", "there", "was", "little", "girl", "named",
                                  "Lily", "café", "\xe2\x98\x95", "12345", "!", "  ", "\n", "zebra", "quixotic"};
    size_t n_words = sizeof words / sizeof *words;
    size_t cap = 1 << 20;
    char *text = malloc(cap + 64);
    size_t len = 0;
    uint64_t x = 88172645463325252ull;
    while (len < cap) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *w = words[x % n_words];
        size_t wl = strlen(w);
        memcpy(text + len, w, wl);
        len += wl;
        text[len++] = ' ';
    }
    text[len] = 0;
    int max = (int)len + 2;
    int32_t *ids = malloc((size_t)max * sizeof *ids);
    double t0 = clock_seconds();
    int n = tokenizer_encode(t, text, 0, ids, max);
    double secs = clock_seconds() - t0;
    printf("encoded %zu bytes into %d tokens in %.3f s\n", len, n, secs);
    CHECK(n > 0 && (size_t)n < len, "long text: %d tokens for %zu bytes", n, len);
    /* generous: quadratic rescans of 1 MiB would take minutes */
    CHECK(secs < 20.0, "long text took %.1f s", secs);
    char *back = malloc(len + 2);
    size_t blen = n > 0 ? detokenize(t, ids, n, back, len + 1) : 0;
    CHECK(blen == len + 1 && back[0] == ' ' && !memcmp(back + 1, text, len), "long text round trip (%zu vs %zu bytes)",
          blen, len + 1);
    CHECK(tokenizer_encode(t, text, 0, ids, n - 1) == -1, "too small an output buffer is refused");
    free(back);
    free(ids);
    free(text);
}

static void test_stories_vocab(void) {
    char *dir = oracle_dir();
    char *path = path_join(dir, "stories260K.gguf");
    gguf_file g;
    tokenizer *t = open_tokenizer(path, &g);
    CHECK(t != NULL, "stories260K tokenizer");
    if (t) {
        CHECK(tokenizer_n_vocab(t) == 512 && tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2, "vocab %d bos %d eos %d",
              tokenizer_n_vocab(t), tokenizer_bos(t), tokenizer_eos(t));
        char piece[16];
        CHECK(tokenizer_piece(t, tokenizer_bos(t), piece, sizeof piece) == 0, "BOS decodes to nothing");
        CHECK(tokenizer_piece(t, 0, piece, sizeof piece) == 0, "<unk> decodes to nothing");
        CHECK(tokenizer_piece(t, 512, piece, sizeof piece) == 0, "an id past the vocab decodes to nothing");
        int32_t ids[4];
        CHECK(tokenizer_encode(t, "", 1, ids, 4) == 1 && ids[0] == 1, "\"\" with BOS is just BOS");
        CHECK(tokenizer_encode(t, "", 0, ids, 4) == 0, "\"\" without BOS is empty");
        test_byte_fallback(t, &g);
        test_long_text(t);
        tokenizer_free(t);
        gguf_close(&g);
    }
    free(path);
    free(dir);
}

/* ---- tiny vocabularies written with the GGUF writer ---- */

typedef struct {
    char *buf;
    size_t size;
    gguf_file g;
} mem_gguf;

enum { META_TOKENIZER = 1, META_NO_PREFIX = 2, META_SHORT_SCORES = 4, META_GPT2 = 8 };

/* <unk> <s> </s> ▁ a b ab bb <0x63>, with the given scores for "ab" and "bb" */
static int write_vocab(mem_gguf *m, int flags, float ab, float bb) {
    static const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "ab", "bb", "<0x63>"};
    enum { N = 9 };
    float scores[N] = {0, 0, 0, -1, -2, -3, ab, bb, 0};
    int32_t types[N] = {2, 3, 3, 1, 1, 1, 1, 1, 6};
    gguf_writer *w = gguf_writer_new("GGUF", 32);
    gguf_w_str(w, "general.architecture", "llama");
    if (flags & META_TOKENIZER) {
        gguf_w_str(w, "tokenizer.ggml.model", flags & META_GPT2 ? "gpt2" : "llama");
        gguf_w_str_arr(w, "tokenizer.ggml.tokens", N, toks, NULL);
        gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, flags & META_SHORT_SCORES ? N - 1 : N, scores);
        gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, N, types);
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
        gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        if (flags & META_NO_PREFIX) {
            gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", false);
            gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
        }
    }
    FILE *fp = open_memstream(&m->buf, &m->size);
    int rc = gguf_w_begin(w, fp) || gguf_w_finish(w);
    if (rc) fprintf(stderr, "writer: %s\n", gguf_writer_error(w));
    fclose(fp);
    gguf_writer_free(w);
    char err[256];
    if (!rc && gguf_parse(&m->g, m->buf, m->size, "tiny.gguf", err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        rc = -1;
    }
    return rc;
}

static tokenizer *tiny(mem_gguf *m, int flags, float ab, float bb, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (write_vocab(m, flags, ab, bb)) return NULL;
    return tokenizer_from_gguf(&m->g, err, errlen);
}

static void tiny_free(mem_gguf *m, tokenizer *t) {
    tokenizer_free(t);
    gguf_close(&m->g);
    free(m->buf);
}

static void expect(const tokenizer *t, const char *text, const int32_t *want, int n_want) {
    int32_t ids[16];
    int n = tokenizer_encode(t, text, 0, ids, 16);
    int same = n == n_want;
    for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
    CHECK(same, "\"%s\": got %d tokens (first %d), want %d (first %d)", text, n, n > 0 ? ids[0] : -1, n_want, want[0]);
}

/* Expected ids worked out by hand from the SPM rule (ids: ▁=3 a=4 b=5 ab=6 bb=7 <0x63>=8). */
static void test_merge_rules(void) {
    char err[256];
    mem_gguf m;
    tokenizer *t = tiny(&m, META_TOKENIZER, 5, 1, err, sizeof err);
    CHECK(t != NULL, "tiny vocab: %s", err);
    if (t) {
        CHECK(tokenizer_adds_bos(t), "add_bos_token defaults to true");
        expect(t, "abb", (int32_t[]){3, 6, 5}, 3);    /* ab (5) beats bb (1) */
        expect(t, "bbb", (int32_t[]){3, 7, 5}, 3);    /* equal pairs: the leftmost merges */
        expect(t, "a  b", (int32_t[]){3, 4, 3, 3, 5}, 5);
        expect(t, "c", (int32_t[]){3, 8}, 2);         /* byte token */
        expect(t, "d", (int32_t[]){3, 0}, 2);         /* no byte token either: <unk> */
        int32_t ids[2];
        CHECK(tokenizer_encode(t, "abb", 1, ids, 2) == -1, "4 tokens do not fit in 2");
        tiny_free(&m, t);
    }
    t = tiny(&m, META_TOKENIZER, 1, 5, err, sizeof err);
    CHECK(t != NULL, "tiny vocab: %s", err);
    if (t) {
        expect(t, "abb", (int32_t[]){3, 4, 7}, 3); /* bb (5) beats ab (1) */
        tiny_free(&m, t);
    }
    t = tiny(&m, META_TOKENIZER | META_NO_PREFIX, 5, 1, err, sizeof err);
    CHECK(t != NULL, "tiny vocab: %s", err);
    if (t) {
        expect(t, "ab", (int32_t[]){6}, 1); /* add_space_prefix = false */
        CHECK(!tokenizer_adds_bos(t), "add_bos_token = false is read");
        tiny_free(&m, t);
    }
}

static void test_bad_metadata(void) {
    char err[256];
    mem_gguf m;
    err[0] = 0;
    tokenizer *t = tiny(&m, 0, 5, 1, err, sizeof err);
    CHECK(t == NULL && strstr(err, "tokenizer.ggml.model"), "no tokenizer metadata: \"%s\"", err);
    tiny_free(&m, t);
    err[0] = 0;
    t = tiny(&m, META_TOKENIZER | META_SHORT_SCORES, 5, 1, err, sizeof err);
    CHECK(t == NULL && strstr(err, "9 tokens, 8 scores"), "mismatched arrays: \"%s\"", err);
    tiny_free(&m, t);
    err[0] = 0;
    t = tiny(&m, META_TOKENIZER | META_GPT2, 5, 1, err, sizeof err);
    CHECK(t == NULL && strstr(err, "\"gpt2\""), "unsupported model named: \"%s\"", err);
    tiny_free(&m, t);
}

/* ---- the oracle reader itself (the oracle files carry no escapes) ---- */

static int load_json_text(const char *json, oracle_case *c, char *err, size_t errlen) {
    char path[] = "/tmp/pi2-oracle-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -2;
    FILE *fp = fdopen(fd, "w");
    fputs(json, fp);
    fclose(fp);
    int rc = oracle_load(c, path, err, errlen);
    unlink(path);
    return rc;
}

#define CASE_HEAD "{\"model\": \"m.gguf\", \"prompt\": "
#define CASE_TAIL ", \"prompt_tokens\": [1, 2], \"steps\": [{\"token\": 3, \"top\": [[3, 1.5], [4, -2e-1]]}], \"text_hex\": \"41ff\"}"

static void test_oracle_reader(void) {
    char err[256];
    oracle_case c;
    int rc = load_json_text(CASE_HEAD "\"caf\\u00e9 \\u2615 \\ud83d\\ude00 \\\"q\\\" \\\\ \\/\\n\\t\"" CASE_TAIL, &c,
                            err, sizeof err);
    CHECK(rc == 0, "escapes: %s", err);
    if (rc == 0) {
        const char *want = "caf\xc3\xa9 \xe2\x98\x95 \xf0\x9f\x98\x80 \"q\" \\ /\n\t";
        CHECK(!strcmp(c.prompt, want), "escapes decode to UTF-8: \"%s\"", c.prompt);
        CHECK(!strcmp(c.model, "m.gguf") && c.n_prompt == 2 && c.prompt_tokens[0] == 1 && c.prompt_tokens[1] == 2,
              "model and prompt_tokens");
        CHECK(c.n_steps == 1 && c.steps[0].token == 3 && c.steps[0].n_top == 2 && c.steps[0].top_id[1] == 4 &&
                  c.steps[0].top_logit[0] == 1.5f && c.steps[0].top_logit[1] == -0.2f,
              "steps");
        CHECK(c.text_len == 2 && c.text[0] == 0x41 && c.text[1] == 0xff, "text_hex");
        oracle_free(&c);
    }
    const char *bad[] = {
        CASE_HEAD "\"x\"" CASE_TAIL " x",                 /* trailing characters */
        CASE_HEAD "\"\\ud83d\"" CASE_TAIL,                /* unpaired surrogate */
        CASE_HEAD "\"\\q\"" CASE_TAIL,                    /* unknown escape */
        CASE_HEAD "\"x\", \"prompt_tokens\": [1, 2,], \"steps\": [], \"text_hex\": \"\"}", /* trailing comma */
        CASE_HEAD "\"x\", \"prompt_tokens\": [1.5], \"steps\": [], \"text_hex\": \"\"}",  /* not an integer */
        CASE_HEAD "\"x\", \"prompt_tokens\": [1], \"steps\": [], \"text_hex\": \"abc\"}", /* odd hex */
        "{\"model\": \"m.gguf\", \"prompt_tokens\": [1], \"steps\": [], \"text_hex\": \"\"}", /* no prompt */
        CASE_HEAD "\"unterminated" CASE_TAIL "\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        rc = load_json_text(bad[i], &c, err, sizeof err);
        CHECK(rc == -1 && err[0], "malformed oracle %zu is refused (rc %d)", i, rc);
        if (rc == 0) oracle_free(&c);
    }
}

int main(void) {
    test_oracle_reader();
    test_oracle();
    test_stories_vocab();
    test_merge_rules();
    test_bad_metadata();
    return test_summary();
}
