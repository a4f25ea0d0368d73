#include "synth/synth_vocab.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* Frequent English words (written after "▁") and word-internal fragments. */
static const char *const common_words[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "with", "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
    "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when",
    "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if",
    "will", "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her",
    "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come",
    "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water", "than", "call",
    "first", "who", "may", "down", "side", "been", "now", "find", "any", "new", "work", "part", "take",
    "get", "place", "made", "live", "where", "after", "back", "little", "only", "round", "man", "year",
    "came", "show", "every", "good", "me", "give", "our", "under", "name", "very", "through", "just",
    "form", "great", "think", "say", "help", "low", "line", "before", "turn", "cause", "same", "mean",
    "differ", "move", "right", "boy", "old", "too", "does", "tell", "sentence", "set", "three", "want",
    "air", "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large",
    "spell", "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why",
    "ask", "men", "change", "went", "light", "kind", "off", "need", "house", "picture", "try", "us",
    "again", "animal", "point", "mother", "world", "near", "build", "self", "earth", "father", "head",
    "stand", "own", "page", "should", "country", "found", "answer", "school", "grow", "study", "still",
    "learn", "plant", "cover", "food", "sun", "four", "thought", "let", "keep", "eye", "never", "last",
    "door", "between", "city", "tree", "cross", "since", "hard", "start", "might", "story", "saw",
    "far", "sea", "draw", "left", "late", "run", "while", "press", "close", "night", "real", "life",
    "few", "stop", "open", "seem", "together", "next", "white", "children", "begin", "got", "walk",
    "example", "ease", "paper", "often", "always", "music", "those", "both", "mark", "book", "letter",
    "until", "mile", "river", "car", "feet", "care", "second", "group", "carry", "took", "rain", "eat",
    "room", "friend", "began", "idea", "fish", "mountain", "north", "once", "base", "hear", "horse",
    "cut", "sure", "watch", "color", "face", "wood", "main", "enough", "plain", "girl", "usual",
    "young", "ready", "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body",
    "dog", "family", "direct", "pose", "leave", "song", "measure", "state", "product", "black",
    "short", "numeral", "class", "wind", "question", "happen", "complete", "ship", "area", "half",
    "rock", "order", "fire", "south", "problem", "piece", "told", "knew", "pass", "farm", "top",
    "whole", "king", "size", "heard", "best", "hour", "better", "true", "during", "hundred", "am",
    "remember", "step", "early", "hold", "west", "ground", "interest", "reach", "fast", "five", "sing",
    "listen", "six", "table", "travel", "less", "morning", "ten", "simple", "several", "toward", "war",
    "lay", "against", "pattern", "slow", "center", "love", "person", "money", "serve", "appear",
    "road", "map", "science", "rule", "govern", "pull", "cold", "notice", "voice", "fall", "power",
    "town", "fine", "certain", "fly", "unit", "lead", "cry", "dark", "machine", "note", "wait",
    "plan", "figure", "star", "box", "noun", "field", "rest", "correct", "able", "pound", "done",
    "beauty", "drive", "stood", "contain", "front", "teach", "week", "final", "gave", "green", "oh",
    "quick", "develop", "sleep", "warm", "free", "minute", "strong", "special", "mind", "behind",
    "clear", "tail", "produce", "fact", "street", "inch", "lot", "nothing", "course", "stay", "wheel",
    "full", "force", "blue", "object", "decide", "surface", "deep", "moon", "island", "foot", "yet",
    "busy", "test", "record", "boat", "common", "gold", "possible", "plane", "age", "dry", "wonder",
    "laugh", "thousand", "ago", "ran", "check", "game", "shape", "yes", "hot", "miss", "brought",
    "heat", "snow", "bed", "bring", "sit", "perhaps", "fill", "east", "weight", "language", "among",
    "The", "Once", "It", "He", "She", "They", "We", "In", "A", "This", "There", "What", "One",
    "model", "token", "data", "memory", "neuron", "layer", "sparse", "engine", "phone", "fast",
};

static const char *const fragments[] = {
    "ing", "ed", "er", "es", "ly", "tion", "ment", "ness", "able", "ful", "less", "est", "ous",
    "al", "ic", "ive", "ity", "ize", "th", "he", "in", "an", "re", "on", "at", "en", "nd", "ti",
    "te", "or", "st", "ar", "nt", "to", "ng", "se", "ha", "ou", "it", "is", "le", "ve", "me",
};

typedef struct {
    synth_vocab *v;
    int cap;                 /* target size */
    int *slots;              /* hash set of indices into v->text, -1 = empty */
    size_t mask;
} builder;

static void fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static size_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)h;
}

static bool contains(const builder *b, const char *s, size_t *slot) {
    size_t i = hash_str(s) & b->mask;
    for (; b->slots[i] >= 0; i = (i + 1) & b->mask)
        if (!strcmp(b->v->text[b->slots[i]], s)) return true;
    *slot = i;
    return false;
}

/* Append a piece unless present or full. Returns -1 on out of memory. */
static int add(builder *b, const char *s, int type) {
    synth_vocab *v = b->v;
    size_t slot;
    if (v->n >= b->cap || contains(b, s, &slot)) return 0;
    char *copy = strdup(s);
    if (!copy) return -1;
    v->text[v->n] = copy;
    v->type[v->n] = type;
    /* specials and bytes score 0 (never merged); normal pieces fall with the index */
    v->score[v->n] = type == SYNTH_TOK_NORMAL ? -(float)v->n : 0.0f;
    b->slots[slot] = v->n++;
    return 0;
}

/* Add every prefix of `marker + word` longer than the marker, shortest
 * first, so each piece is a merge of a shorter piece and one character. */
static int add_with_prefixes(builder *b, const char *marker, const char *word) {
    char buf[64];
    size_t m = strlen(marker), n = strlen(word);
    if (m + n >= sizeof buf) return 0;
    memcpy(buf, marker, m);
    for (size_t k = 1; k <= n; k++) {
        memcpy(buf + m, word, k);
        buf[m + k] = 0;
        if (add(b, buf, SYNTH_TOK_NORMAL)) return -1;
    }
    return 0;
}

/* All lowercase strings of length len, optionally after "▁", in order. */
static int add_ngrams(builder *b, int len, const char *marker) {
    char buf[16];
    size_t m = strlen(marker);
    memcpy(buf, marker, m);
    long total = 1;
    for (int i = 0; i < len; i++) total *= 26;
    for (long k = 0; k < total && b->v->n < b->cap; k++) {
        long x = k;
        for (int i = len - 1; i >= 0; i--, x /= 26) buf[m + (size_t)i] = (char)('a' + x % 26);
        buf[m + (size_t)len] = 0;
        if (add(b, buf, SYNTH_TOK_NORMAL)) return -1;
    }
    return 0;
}

static int fill(builder *b) {
    char buf[16];
    if (add(b, "<unk>", SYNTH_TOK_UNKNOWN) || add(b, "<s>", SYNTH_TOK_CONTROL) || add(b, "</s>", SYNTH_TOK_CONTROL))
        return -1;
    for (int i = 0; i < 256; i++) {
        snprintf(buf, sizeof buf, "<0x%02X>", i);
        if (add(b, buf, SYNTH_TOK_BYTE)) return -1;
    }
    if (add(b, SPACE_MARK, SYNTH_TOK_NORMAL)) return -1;
    for (int c = 0x21; c < 0x7f; c++) {
        buf[0] = (char)c, buf[1] = 0;
        if (add(b, buf, SYNTH_TOK_NORMAL)) return -1;
    }
    for (int c = 0x21; c < 0x7f; c++) {
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) continue;
        snprintf(buf, sizeof buf, SPACE_MARK "%c", c);
        if (add(b, buf, SYNTH_TOK_NORMAL)) return -1;
    }
    for (size_t i = 0; i < sizeof common_words / sizeof *common_words; i++)
        if (add_with_prefixes(b, SPACE_MARK, common_words[i])) return -1;
    for (size_t i = 0; i < sizeof fragments / sizeof *fragments; i++)
        if (add_with_prefixes(b, "", fragments[i])) return -1;
    /* n-grams up to length 5 give 24.7M candidates, far above SYNTH_VOCAB_MAX */
    for (int len = 2; len <= 5 && b->v->n < b->cap; len++)
        if (add_ngrams(b, len, "") || add_ngrams(b, len, SPACE_MARK)) return -1;
    return 0;
}

int synth_vocab_build(synth_vocab *v, int n, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    if (n < SYNTH_VOCAB_MIN || n > SYNTH_VOCAB_MAX) {
        fail(err, errlen, "vocabulary size %d out of range [%d, %d]", n, SYNTH_VOCAB_MIN, SYNTH_VOCAB_MAX);
        return -1;
    }
    size_t nslots = 1;
    while (nslots < 2 * (size_t)n) nslots <<= 1;
    builder b = {v, n, malloc(nslots * sizeof(int)), nslots - 1};
    v->text = calloc((size_t)n, sizeof *v->text);
    v->score = malloc((size_t)n * sizeof *v->score);
    v->type = malloc((size_t)n * sizeof *v->type);
    int rc = -1;
    if (b.slots && v->text && v->score && v->type) {
        memset(b.slots, 0xff, nslots * sizeof(int));
        rc = fill(&b);
    }
    free(b.slots);
    if (rc == 0 && v->n != n) {
        fail(err, errlen, "vocabulary generator ran out of pieces at %d of %d", v->n, n);
        rc = -1;
    } else if (rc) {
        fail(err, errlen, "out of memory building a %d-token vocabulary", n);
    }
    if (rc) synth_vocab_free(v);
    return rc;
}

void synth_vocab_free(synth_vocab *v) {
    if (v->text)
        for (int i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->score);
    free(v->type);
    memset(v, 0, sizeof *v);
}
