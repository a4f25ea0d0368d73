/* A small strict JSON parser (RFC 8259, except raw control characters in strings) and the
 * oracle-case schema on top of it. */
#include "oracle.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_FILE (64u << 20)

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    bool b;
    double num;
    char *str;           /* J_STR: NUL-terminated UTF-8 (may hold \u0000, see len) */
    size_t len;
    int n;               /* J_ARR / J_OBJ: element count */
    struct jval *items;
    char **keys;         /* J_OBJ */
} jval;

typedef struct {
    const char *begin, *p, *end;
    char *err;
    size_t errlen;
    bool failed;
} jparser;

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static bool jfail(jparser *ps, const char *what) {
    if (!ps->failed) set_err(ps->err, ps->errlen, "JSON: %s at byte %td", what, ps->p - ps->begin);
    ps->failed = true;
    return false;
}

static void jfree(jval *v) {
    free(v->str);
    for (int i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static void skip_ws(jparser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static bool literal(jparser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return jfail(ps, "invalid literal");
    ps->p += n;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool parse_number(jparser *ps, jval *v) {
    const char *s = ps->p;
    if (s < ps->end && *s == '-') s++;
    if (s >= ps->end || !is_digit(*s)) return jfail(ps, "invalid number");
    if (*s == '0') s++;
    else while (s < ps->end && is_digit(*s)) s++;
    if (s < ps->end && *s == '.') {
        s++;
        if (s >= ps->end || !is_digit(*s)) return jfail(ps, "invalid number fraction");
        while (s < ps->end && is_digit(*s)) s++;
    }
    if (s < ps->end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < ps->end && (*s == '+' || *s == '-')) s++;
        if (s >= ps->end || !is_digit(*s)) return jfail(ps, "invalid number exponent");
        while (s < ps->end && is_digit(*s)) s++;
    }
    char buf[64];
    size_t n = (size_t)(s - ps->p);
    if (n >= sizeof buf) return jfail(ps, "number too long");
    memcpy(buf, ps->p, n);
    buf[n] = 0;
    v->type = J_NUM;
    v->num = strtod(buf, NULL);
    ps->p = s;
    return true;
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* \uXXXX (ps->p at the 'u'), joining a surrogate pair into one code point */
static bool parse_u_escape(jparser *ps, uint32_t *cp) {
    if (ps->end - ps->p < 5) return jfail(ps, "truncated \\u escape");
    int hi = hex4(ps->p + 1);
    if (hi < 0) return jfail(ps, "invalid \\u escape");
    ps->p += 5;
    if (hi >= 0xdc00 && hi <= 0xdfff) return jfail(ps, "unpaired low surrogate");
    if (hi < 0xd800 || hi > 0xdbff) {
        *cp = (uint32_t)hi;
        return true;
    }
    if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') return jfail(ps, "unpaired high surrogate");
    int lo = hex4(ps->p + 2);
    if (lo < 0xdc00 || lo > 0xdfff) return jfail(ps, "invalid low surrogate");
    ps->p += 6;
    *cp = 0x10000 + (((uint32_t)hi - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
    return true;
}

/* Raw control characters are taken as they are (RFC 8259 wants them escaped): tok.t3.json holds
 * a literal newline in its prompt, as Python's json reads with strict=False. */
static bool parse_string(jparser *ps, char **out, size_t *out_len) {
    ps->p++; /* opening quote */
    /* escapes never expand (\uXXXX is 6 bytes for at most 3; a pair 12 for 4) */
    const char *close = ps->p;
    while (close < ps->end && *close != '"') close += *close == '\\' && close + 1 < ps->end ? 2 : 1;
    char *buf = malloc((size_t)(close - ps->p) + 1);
    if (!buf) return jfail(ps, "out of memory");
    size_t o = 0;
    for (;;) {
        if (ps->p >= ps->end) { free(buf); return jfail(ps, "unterminated string"); }
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') break;
        if (c != '\\') {
            buf[o++] = (char)c;
            ps->p++;
            continue;
        }
        if (++ps->p >= ps->end) { free(buf); return jfail(ps, "unterminated escape"); }
        char e = *ps->p;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            buf[o++] = decoded[simple - "\"\\/bfnrt"];
            ps->p++;
        } else if (e == 'u') {
            uint32_t cp;
            if (!parse_u_escape(ps, &cp)) { free(buf); return false; }
            o += put_utf8(buf + o, cp);
        } else {
            free(buf);
            return jfail(ps, "invalid escape");
        }
    }
    ps->p++; /* closing quote */
    buf[o] = 0;
    *out = buf;
    *out_len = o;
    return true;
}

static bool parse_value(jparser *ps, jval *v, int depth);

static bool grow(jval *v, int *cap, bool with_keys) {
    if (v->n < *cap) return true;
    int ncap = *cap ? 2 * *cap : 8;
    jval *items = realloc(v->items, (size_t)ncap * sizeof *items);
    if (!items) return false;
    v->items = items;
    if (with_keys) {
        char **keys = realloc(v->keys, (size_t)ncap * sizeof *keys);
        if (!keys) return false;
        v->keys = keys;
    }
    *cap = ncap;
    return true;
}

static bool parse_container(jparser *ps, jval *v, int depth, bool is_obj) {
    char close = is_obj ? '}' : ']';
    v->type = is_obj ? J_OBJ : J_ARR;
    int cap = 0;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    for (;;) {
        if (!grow(v, &cap, is_obj)) return jfail(ps, "out of memory");
        jval *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        if (is_obj) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"') return jfail(ps, "expected a key string");
            size_t klen;
            if (!parse_string(ps, &v->keys[v->n], &klen)) return false;
            v->n++; /* counted now so jfree releases the key if the value fails */
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return jfail(ps, "expected ':'");
            ps->p++;
        } else {
            v->n++;
        }
        if (!parse_value(ps, item, depth + 1)) return false;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return true;
        }
        return jfail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool parse_value(jparser *ps, jval *v, int depth) {
    if (depth > MAX_DEPTH) return jfail(ps, "nesting too deep");
    skip_ws(ps);
    if (ps->p >= ps->end) return jfail(ps, "unexpected end of input");
    switch (*ps->p) {
    case '{': return parse_container(ps, v, depth, true);
    case '[': return parse_container(ps, v, depth, false);
    case '"': v->type = J_STR; return parse_string(ps, &v->str, &v->len);
    case 't': v->type = J_BOOL; v->b = true; return literal(ps, "true");
    case 'f': v->type = J_BOOL; v->b = false; return literal(ps, "false");
    case 'n': v->type = J_NULL; return literal(ps, "null");
    default: return parse_number(ps, v);
    }
}

/* ---- the oracle schema ---- */

static const jval *member(const jval *obj, const char *key, jtype type, char *err, size_t errlen) {
    for (int i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key)) {
            if (obj->items[i].type == type) return &obj->items[i];
            set_err(err, errlen, "\"%s\" has the wrong JSON type", key);
            return NULL;
        }
    set_err(err, errlen, "missing \"%s\"", key);
    return NULL;
}

static bool as_int(const jval *v, int *out) {
    if (v->type != J_NUM || v->num != floor(v->num) || v->num < INT32_MIN || v->num > INT32_MAX) return false;
    *out = (int)v->num;
    return true;
}

/* a string that can be used as a C string (no \u0000 inside) */
static char *take_cstr(const jval *v) {
    if (strlen(v->str) != v->len) return NULL;
    return strdup(v->str);
}

static bool decode_hex(const jval *v, oracle_case *c) {
    if (v->len % 2) return false;
    c->text = malloc(v->len / 2 + 1);
    if (!c->text) return false;
    for (size_t i = 0; i < v->len; i += 2) {
        char pair[5] = {'0', '0', v->str[i], v->str[i + 1], 0};
        int b = hex4(pair);
        if (b < 0) return false;
        c->text[i / 2] = (unsigned char)b;
    }
    c->text_len = v->len / 2;
    return true;
}

static bool load_step(const jval *o, oracle_step *s, char *err, size_t errlen) {
    const jval *tok = member(o, "token", J_NUM, err, errlen);
    const jval *top = tok ? member(o, "top", J_ARR, err, errlen) : NULL;
    if (!top) return false;
    if (!as_int(tok, &s->token)) {
        set_err(err, errlen, "\"token\" is not an integer");
        return false;
    }
    if (top->n < 1 || top->n > 5) {
        set_err(err, errlen, "\"top\" has %d entries (expected 1..5)", top->n);
        return false;
    }
    s->n_top = top->n;
    for (int i = 0; i < top->n; i++) {
        const jval *pair = &top->items[i];
        if (pair->type != J_ARR || pair->n != 2 || !as_int(&pair->items[0], &s->top_id[i]) ||
            pair->items[1].type != J_NUM) {
            set_err(err, errlen, "\"top\"[%d] is not an [id, logit] pair", i);
            return false;
        }
        s->top_logit[i] = (float)pair->items[1].num;
    }
    return true;
}

static bool load_case(const jval *root, oracle_case *c, char *err, size_t errlen) {
    if (root->type != J_OBJ) {
        set_err(err, errlen, "the top level is not an object");
        return false;
    }
    const jval *model = member(root, "model", J_STR, err, errlen);
    const jval *prompt = model ? member(root, "prompt", J_STR, err, errlen) : NULL;
    const jval *tokens = prompt ? member(root, "prompt_tokens", J_ARR, err, errlen) : NULL;
    const jval *steps = tokens ? member(root, "steps", J_ARR, err, errlen) : NULL;
    const jval *hex = steps ? member(root, "text_hex", J_STR, err, errlen) : NULL;
    if (!hex) return false;
    c->model = take_cstr(model);
    c->prompt = take_cstr(prompt);
    if (!c->model || !c->prompt || strchr(c->model, '/')) {
        set_err(err, errlen, "\"model\" or \"prompt\" is not a usable string");
        return false;
    }
    c->prompt_tokens = malloc((size_t)(tokens->n ? tokens->n : 1) * sizeof *c->prompt_tokens);
    c->steps = calloc((size_t)(steps->n ? steps->n : 1), sizeof *c->steps);
    if (!c->prompt_tokens || !c->steps) {
        set_err(err, errlen, "out of memory");
        return false;
    }
    for (int i = 0; i < tokens->n; i++) {
        int id;
        if (!as_int(&tokens->items[i], &id) || id < 0) {
            set_err(err, errlen, "\"prompt_tokens\"[%d] is not a token id", i);
            return false;
        }
        c->prompt_tokens[i] = id;
    }
    c->n_prompt = tokens->n;
    for (int i = 0; i < steps->n; i++) {
        if (steps->items[i].type != J_OBJ) {
            set_err(err, errlen, "\"steps\"[%d] is not an object", i);
            return false;
        }
        char why[128];
        if (!load_step(&steps->items[i], &c->steps[i], why, sizeof why)) {
            set_err(err, errlen, "\"steps\"[%d]: %s", i, why);
            return false;
        }
    }
    c->n_steps = steps->n;
    if (!decode_hex(hex, c)) {
        set_err(err, errlen, "\"text_hex\" is not an even-length hex string");
        return false;
    }
    return true;
}

static char *read_file(const char *path, size_t *size, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        set_err(err, errlen, "cannot open");
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_FILE) {
                set_err(err, errlen, "larger than %u bytes", MAX_FILE);
                break;
            }
            cap = cap ? 2 * cap : 1 << 16;
            char *nb = realloc(buf, cap);
            if (!nb) {
                set_err(err, errlen, "out of memory");
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) {
            if (ferror(fp)) {
                set_err(err, errlen, "read error");
                break;
            }
            fclose(fp);
            *size = n;
            return buf;
        }
    }
    fclose(fp);
    free(buf);
    return NULL;
}

int oracle_load(oracle_case *c, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    char why[256] = "";
    size_t size;
    char *buf = read_file(path, &size, why, sizeof why);
    if (!buf) {
        set_err(err, errlen, "%s: %s", path, why);
        return -1;
    }
    jparser ps = {buf, buf, buf + size, why, sizeof why, false};
    jval root = {0};
    bool ok = parse_value(&ps, &root, 0);
    if (ok) {
        skip_ws(&ps);
        if (ps.p != ps.end) ok = jfail(&ps, "trailing characters");
    }
    if (ok) ok = load_case(&root, c, why, sizeof why);
    jfree(&root);
    free(buf);
    if (!ok) {
        set_err(err, errlen, "%s: %s", path, why);
        oracle_free(c);
        return -1;
    }
    return 0;
}

void oracle_free(oracle_case *c) {
    free(c->model);
    free(c->prompt);
    free(c->prompt_tokens);
    free(c->steps);
    free(c->text);
    memset(c, 0, sizeof *c);
}

const char *shared_dir(void) {
    const char *env = getenv("PI2_SHARED");
    return env && *env ? env : "../shared";
}
