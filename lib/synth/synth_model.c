#include "synth/synth_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "util/synth_rng.h"

#define P_MAX 0.9          /* no neuron fires for more than 90% of tokens */
#define EMB_NOISE 0.5      /* isotropic embedding noise energy, relative to the subspace part */
#define GATE_NOISE 0.5     /* gate-row noise energy outside the subspace, relative to ||w||^2 */
#define RESID_SCALE 0.15   /* rms of each attention / FFN output relative to the residual rms */
#define LOGIT_SCALE 3.0    /* sd of the logits */
#define NORM_JITTER 0.2    /* norm weights are 1 +- this */
#define MAX_RANK 64

/* stream purposes that are not tensors */
enum { KEY_BASIS = SYN_KIND_COUNT, KEY_PERMUTE };

struct synth_model {
    synth_params p;
    int d, r, kv_dim, ff;
    double a;              /* coefficient of u in every embedding (z-units) */
    double sn2, sg2;       /* per-element variances of embedding noise and gate noise (z-units) */
    double X;              /* expected ||x||^2 of an embedding in z-units */
    double k_emb;          /* scale from z-units to an embedding with rms 1 per element */
    double gamma;          /* gate scale: pre-activations with sd ~1 */
    float *basis;          /* (r + 1) x d, orthonormal: row 0 is u, rows 1..r are B */
    float *p_fire;         /* n_layer x ff target firing probabilities */
    float *norms;          /* (2 * n_layer + 1) x d: attn_norm and ffn_norm per layer, then output_norm */
    double sigma, hot_expected;
    const kernels *kern;
};

static void fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

double synth_normal_quantile(double p) {
    /* Acklam's rational approximation, then one Halley step on erfc */
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                               1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                               6.680131188771972e+01, -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                               -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
    static const double dd[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                3.754408661907416e+00};
    if (p <= 0) return -INFINITY;
    if (p >= 1) return INFINITY;
    double x;
    if (p < 0.02425) {
        double q = sqrt(-2 * log(p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((dd[0] * q + dd[1]) * q + dd[2]) * q + dd[3]) * q + 1);
    } else if (p > 1 - 0.02425) {
        double q = sqrt(-2 * log(1 - p));
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((dd[0] * q + dd[1]) * q + dd[2]) * q + dd[3]) * q + 1);
    } else {
        double q = p - 0.5, rr = q * q;
        x = (((((a[0] * rr + a[1]) * rr + a[2]) * rr + a[3]) * rr + a[4]) * rr + a[5]) * q /
            (((((b[0] * rr + b[1]) * rr + b[2]) * rr + b[3]) * rr + b[4]) * rr + 1);
    }
    double e = 0.5 * erfc(-x / sqrt(2)) - p;
    double u = e * sqrt(2 * M_PI) * exp(x * x / 2);
    return x - u / (1 + x * u / 2);
}

/* ---- firing-probability profile: p_j = min(kappa * exp(sigma * z_j), P_MAX) ---- */

/* z[j] are descending normal quantiles; fills p and returns the hot share. */
static double profile(const double *z, int n, int n_hot, double sigma, double fire, double *p) {
    double lo = -60, hi = 10; /* log kappa: the mean is increasing in it */
    for (int it = 0; it < 80; it++) {
        double mid = 0.5 * (lo + hi), sum = 0;
        for (int j = 0; j < n; j++) sum += fmin(exp(mid + sigma * z[j]), P_MAX);
        if (sum / n < fire) lo = mid;
        else hi = mid;
    }
    double total = 0, hot = 0;
    for (int j = 0; j < n; j++) {
        p[j] = fmin(exp(0.5 * (lo + hi) + sigma * z[j]), P_MAX);
        total += p[j];
        if (j < n_hot) hot += p[j];
    }
    return hot / total;
}

/* Calibrates sigma so the hottest hot_frac take hot_share; p sorted hottest first. */
static int calibrate(synth_model *m, double *p, char *err, size_t errlen) {
    int n = m->ff, n_hot = (int)lround(m->p.hot_frac * n);
    if (n_hot < 1) n_hot = 1;
    double *z = malloc((size_t)n * sizeof *z);
    if (!z) return fail(err, errlen, "out of memory"), -1;
    for (int j = 0; j < n; j++) z[j] = -synth_normal_quantile((j + 0.5) / n);
    double lo = 0, hi = 8;
    double top = profile(z, n, n_hot, hi, m->p.fire, p);
    if (top < m->p.hot_share) {
        free(z);
        fail(err, errlen, "hot share %.3f of the hottest %.3f is unreachable with mean firing %.3f (max %.3f)",
             m->p.hot_share, m->p.hot_frac, m->p.fire, top);
        return -1;
    }
    for (int it = 0; it < 50; it++) { /* the share grows with sigma */
        double mid = 0.5 * (lo + hi);
        if (profile(z, n, n_hot, mid, m->p.fire, p) < m->p.hot_share) lo = mid;
        else hi = mid;
    }
    m->sigma = 0.5 * (lo + hi);
    m->hot_expected = profile(z, n, n_hot, m->sigma, m->p.fire, p);
    free(z);
    return 0;
}

/* Each layer gets its own random assignment of the profile to neurons. */
static void assign_profile(synth_model *m, const double *p_sorted, int *perm) {
    for (int l = 0; l < m->p.n_layer; l++) {
        synth_rng rng = synth_stream(synth_key(m->p.seed, KEY_PERMUTE, (uint64_t)l, 0), 0);
        for (int i = 0; i < m->ff; i++) perm[i] = i;
        for (int i = m->ff - 1; i > 0; i--) {
            int j = (int)(synth_next(&rng) % (uint64_t)(i + 1));
            int t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int i = 0; i < m->ff; i++) m->p_fire[(size_t)l * m->ff + i] = (float)p_sorted[perm[i]];
    }
}

/* Modified Gram-Schmidt on Gaussian vectors: an orthonormal (r+1) x d basis. */
static void make_basis(synth_model *m) {
    int d = m->d;
    synth_rng rng = synth_stream(synth_key(m->p.seed, KEY_BASIS, 0, 0), 0);
    for (int k = 0; k <= m->r; k++) {
        float *v = m->basis + (size_t)k * d;
        for (;;) {
            for (int j = 0; j < d; j++) v[j] = (float)synth_normal(&rng);
            for (int i = 0; i < k; i++) {
                const float *b = m->basis + (size_t)i * d;
                double dot = 0;
                for (int j = 0; j < d; j++) dot += (double)v[j] * b[j];
                for (int j = 0; j < d; j++) v[j] -= (float)(dot * b[j]);
            }
            double nn = 0;
            for (int j = 0; j < d; j++) nn += (double)v[j] * v[j];
            if (nn > 1e-3 * d) { /* a degenerate draw is practically impossible for r < d */
                for (int j = 0; j < d; j++) v[j] = (float)(v[j] / sqrt(nn));
                break;
            }
        }
    }
}

static void make_norms(synth_model *m) {
    int n = 2 * m->p.n_layer + 1;
    synth_rng rng = synth_stream(synth_key(m->p.seed, SYN_ATTN_NORM, 0, 0), 0);
    for (size_t i = 0; i < (size_t)n * m->d; i++)
        m->norms[i] = (float)(1.0 + NORM_JITTER * (2 * synth_uniform(&rng) - 1));
}

static int check_params(const synth_params *p, char *err, size_t errlen) {
    if (p->n_embd < 32 || p->n_embd % 32 || p->n_ff < 32 || p->n_ff % 32)
        return fail(err, errlen, "dim %d and ff %d must be positive multiples of 32", p->n_embd, p->n_ff), -1;
    if (p->n_head <= 0 || p->n_head_kv <= 0 || p->n_embd % p->n_head || p->n_head % p->n_head_kv ||
        (p->n_embd / p->n_head) % 2)
        return fail(err, errlen, "heads %d / kv heads %d must divide dim %d into even head sizes", p->n_head,
                    p->n_head_kv, p->n_embd), -1;
    if (p->n_layer <= 0 || p->n_layer > 4096 || p->n_embd > (1 << 16) || p->n_ff > (1 << 18))
        return fail(err, errlen, "layers %d, dim %d or ff %d out of range", p->n_layer, p->n_embd, p->n_ff), -1;
    if (p->n_vocab <= 0) return fail(err, errlen, "vocab %d must be positive", p->n_vocab), -1;
    if (p->relu_up && !p->relu) return fail(err, errlen, "ReLU² needs the ReLU gate (relu set)"), -1;
    if (p->relu && !(p->fire > 0 && p->fire < P_MAX))
        return fail(err, errlen, "fire %.4g must be in (0, %.2f)", p->fire, P_MAX), -1;
    if (p->relu && !(p->hot_frac > 0 && p->hot_frac < 1 && p->hot_share >= p->hot_frac && p->hot_share < 1))
        return fail(err, errlen, "hot %.3g:%.3g needs 0 < fraction <= share < 1", p->hot_frac, p->hot_share), -1;
    if (!(p->gate_quant_err >= 0 && p->gate_quant_err < 1))
        return fail(err, errlen, "gate quantization error %.3g out of range", p->gate_quant_err), -1;
    return 0;
}

synth_model *synth_model_new(const synth_params *p, char *err, size_t errlen) {
    if (check_params(p, err, errlen)) return NULL;
    synth_model *m = calloc(1, sizeof *m);
    if (!m) return fail(err, errlen, "out of memory"), NULL;
    m->p = *p;
    m->d = p->n_embd;
    m->ff = p->n_ff;
    m->kv_dim = p->n_embd / p->n_head * p->n_head_kv;
    m->r = m->d / 8 < 4 ? 4 : m->d / 8 > MAX_RANK ? MAX_RANK : m->d / 8;
    m->a = sqrt(m->r); /* the persistent direction carries as much energy as the token subspace */
    m->sn2 = EMB_NOISE * m->r / m->d;
    m->sg2 = GATE_NOISE * m->r / m->d;
    m->X = m->a * m->a + m->r * (1 + EMB_NOISE);
    m->k_emb = sqrt(m->d / m->X);
    m->gamma = sqrt(m->X / ((double)m->d * m->r));
    m->kern = kernels_best();
    m->basis = malloc((size_t)(m->r + 1) * m->d * sizeof *m->basis);
    m->norms = malloc((size_t)(2 * p->n_layer + 1) * m->d * sizeof *m->norms);
    m->p_fire = malloc((size_t)p->n_layer * m->ff * sizeof *m->p_fire);
    double *p_sorted = malloc((size_t)m->ff * sizeof *p_sorted);
    int *perm = malloc((size_t)m->ff * sizeof *perm);
    if (!m->basis || !m->norms || !m->p_fire || !p_sorted || !perm) {
        fail(err, errlen, "out of memory");
        goto fail;
    }
    make_basis(m);
    make_norms(m);
    if (p->relu) {
        if (calibrate(m, p_sorted, err, errlen)) goto fail;
        assign_profile(m, p_sorted, perm);
    }
    free(p_sorted);
    free(perm);
    return m;
fail:
    free(p_sorted);
    free(perm);
    synth_model_free(m);
    return NULL;
}

void synth_model_free(synth_model *m) {
    if (!m) return;
    free(m->basis);
    free(m->norms);
    free(m->p_fire);
    free(m);
}

int synth_rank(const synth_model *m) { return m->r; }
int synth_pred_rank(const synth_model *m) { return 2 * (m->r + 1); }
double synth_target_p(const synth_model *m, int layer, int neuron) {
    return m->p.relu ? m->p_fire[(size_t)layer * m->ff + neuron] : 1.0;
}
double synth_lognormal_sigma(const synth_model *m) { return m->sigma; }
double synth_expected_hot_share(const synth_model *m) { return m->hot_expected; }

void synth_shape(const synth_model *m, synth_kind k, int64_t *rows, int64_t *cols) {
    int64_t d = m->d, ff = m->ff, pr = synth_pred_rank(m);
    static const int8_t is_vector[SYN_KIND_COUNT] = {[SYN_OUTPUT_NORM] = 1, [SYN_ATTN_NORM] = 1, [SYN_FFN_NORM] = 1};
    int64_t r = d, c = d;
    switch (k) {
    case SYN_TOKEN_EMBD: case SYN_OUTPUT: r = m->p.n_vocab; break;
    case SYN_ATTN_K: case SYN_ATTN_V: r = m->kv_dim; break;
    case SYN_FFN_GATE: case SYN_FFN_UP: case SYN_FFN_DOWN_T: r = ff; break;
    case SYN_FFN_DOWN: c = ff; break;
    case SYN_PRED_FC1: r = pr; break;
    case SYN_PRED_FC2: r = ff, c = pr; break;
    default: break;
    }
    if (k < SYN_KIND_COUNT && is_vector[k]) r = 1;
    *rows = r, *cols = c;
}

/* ---- rows ---- */

static const float *basis_vec(const synth_model *m, int k) { return m->basis + (size_t)k * m->d; }

/* Element e of a plain Gaussian matrix is scale * N(0,1)(hash(key, e)). */
static void gauss_row(uint64_t key, int64_t first, int64_t n, double scale, float *out) {
    synth_rng rng = synth_stream(key, (uint64_t)first);
    for (int64_t j = 0; j < n; j++) out[j] = (float)scale * synth_fast_normal(&rng);
}

static double gauss_scale(const synth_model *m, synth_kind k) {
    double d = m->d, ff = m->ff;
    /* mean square of one FFN activation: ~fire/2 for ReLU, half that for ReLU² (relu(up)
     * zeroes half), E[silu(N)^2] ~ 0.35 for SiLU */
    double act_ms = m->p.relu ? (m->p.relu_up ? 0.25 : 0.5) * m->p.fire : 0.35;
    switch (k) {
    case SYN_OUTPUT: return LOGIT_SCALE / sqrt(d);
    case SYN_ATTN_OUT: return RESID_SCALE / sqrt(d);
    case SYN_FFN_DOWN: case SYN_FFN_DOWN_T: return RESID_SCALE / sqrt(ff * act_ms);
    default: return 1 / sqrt(d); /* q, k, v, up, SiLU gate: unit-variance outputs of a normalized input */
    }
}

static void embedding_row(const synth_model *m, int64_t t, float *out) {
    synth_rng rng = synth_stream(synth_key(m->p.seed, SYN_TOKEN_EMBD, 0, (uint64_t)t), 0);
    double sn = sqrt(m->sn2);
    for (int j = 0; j < m->d; j++) out[j] = (float)(sn * synth_fast_normal(&rng));
    m->kern->axpy_f32(out, (float)m->a, basis_vec(m, 0), m->d);
    for (int k = 1; k <= m->r; k++) m->kern->axpy_f32(out, (float)synth_normal(&rng), basis_vec(m, k), m->d);
    for (int j = 0; j < m->d; j++) out[j] *= (float)m->k_emb;
}

/* Neuron i's subspace coefficients w[0..r) and the u coefficient t that
 * makes P(gate . x > 0) = p_i. The pre-activation (z-units) is
 *   a*t + w.z + noise terms,  noise variance S0 + beta*t^2,
 * from embedding noise (sn2 * ||g||^2), gate noise inside the subspace
 * (sg2 * r), weight quantization and the attention/FFN outputs added to the
 * residual before this layer (random directions: e * X * ||g||^2 / d). */
static double neuron_coeffs(const synth_model *m, int l, int64_t i, synth_rng *rng, double *w) {
    double ww = 0;
    for (int k = 0; k < m->r; k++) w[k] = synth_normal(rng), ww += w[k] * w[k];
    double drift = (2 * l + 1) * RESID_SCALE * RESID_SCALE;
    double iso = m->sn2 + (m->p.gate_quant_err + drift) * m->X / m->d;
    double S0 = ww + m->sg2 * m->r + iso * (ww + m->sg2 * m->d);
    /* p below 1e-7 never fires in practice; the floor keeps q finite */
    double q = synth_normal_quantile(fmax(m->p_fire[(size_t)l * m->ff + i], 1e-7));
    /* with more noise than signal the target is unreachable: saturate instead of dividing by <= 0 */
    double denom = fmax(m->a * m->a - q * q * iso, 0.1 * m->a * m->a);
    return q * sqrt(S0 / denom);
}

static void relu_gate_row(const synth_model *m, int l, int64_t i, float *out) {
    synth_rng rng = synth_stream(synth_key(m->p.seed, SYN_FFN_GATE, (uint64_t)l, (uint64_t)i), 0);
    double w[MAX_RANK];
    double t = neuron_coeffs(m, l, i, &rng, w);
    double sg = sqrt(m->sg2);
    const float *u = basis_vec(m, 0);
    double m0 = 0; /* the noise's own u component, replaced by t */
    for (int j = 0; j < m->d; j++) {
        out[j] = (float)(sg * synth_fast_normal(&rng));
        m0 += (double)out[j] * u[j];
    }
    for (int k = 0; k < m->r; k++) m->kern->axpy_f32(out, (float)w[k], basis_vec(m, k + 1), m->d);
    m->kern->axpy_f32(out, (float)(t - m0), u, m->d);
    /* the FFN input is rmsnorm(x) * ffn_norm: divide it out so firing follows g . x */
    const float *fn = m->norms + (size_t)(2 * l + 1) * m->d;
    for (int j = 0; j < m->d; j++) out[j] = (float)(out[j] * m->gamma / fn[j]);
}

/* fc2 row i: logit_i = sum_k c_k (relu(b_k.x) - relu(-b_k.x)) = c . (basis x),
 * the low-rank part of neuron i's gate pre-activation (sign only: threshold 0). */
static void predictor_fc2_row(const synth_model *m, int l, int64_t i, float *out) {
    synth_rng rng = synth_stream(synth_key(m->p.seed, SYN_FFN_GATE, (uint64_t)l, (uint64_t)i), 0);
    double w[MAX_RANK];
    double t = neuron_coeffs(m, l, i, &rng, w);
    int n = m->r + 1;
    out[0] = (float)(m->gamma * t);
    for (int k = 0; k < m->r; k++) out[k + 1] = (float)(m->gamma * w[k]);
    for (int k = 0; k < n; k++) out[n + k] = -out[k];
}

void synth_row(const synth_model *m, synth_kind k, int layer, int64_t row, float *out) {
    int64_t rows, cols;
    synth_shape(m, k, &rows, &cols);
    uint64_t key = synth_key(m->p.seed, (uint64_t)k, (uint64_t)layer, 0);
    switch (k) {
    case SYN_TOKEN_EMBD: embedding_row(m, row, out); return;
    case SYN_OUTPUT_NORM: memcpy(out, m->norms + (size_t)2 * m->p.n_layer * m->d, (size_t)m->d * sizeof *out); return;
    case SYN_ATTN_NORM: case SYN_FFN_NORM:
        memcpy(out, m->norms + (size_t)(2 * layer + (k == SYN_FFN_NORM)) * m->d, (size_t)m->d * sizeof *out);
        return;
    case SYN_FFN_GATE:
        if (m->p.relu) relu_gate_row(m, layer, row, out);
        else gauss_row(key, row * cols, cols, gauss_scale(m, k), out);
        return;
    case SYN_FFN_DOWN_T: { /* column `row` of ffn_down: the same hashed elements */
        uint64_t down = synth_key(m->p.seed, SYN_FFN_DOWN, (uint64_t)layer, 0);
        double s = gauss_scale(m, k);
        for (int64_t j = 0; j < cols; j++)
            out[j] = (float)s * synth_fast_normal_bits(synth_mix(down + (uint64_t)(j * m->ff + row + 1) * SYNTH_GOLDEN));
        return;
    }
    case SYN_PRED_FC1: { /* [u; B; -u; -B] */
        int n = m->r + 1;
        const float *b = basis_vec(m, (int)(row % n));
        float sign = row < n ? 1.0f : -1.0f;
        for (int j = 0; j < m->d; j++) out[j] = sign * b[j];
        return;
    }
    case SYN_PRED_FC2: predictor_fc2_row(m, layer, row, out); return;
    default: gauss_row(key, row * cols, cols, gauss_scale(m, k), out); return;
    }
}
