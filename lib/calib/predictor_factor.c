/* Randomized SVD (Halko, Martinsson, Tropp 2011, algorithm 4.4 with subspace
 * iteration) of a gate matrix: the lowrank predictor's weights. The products
 * with G are the only model-sized work and are split over a thread pool; the
 * orthonormalisation and the small eigenproblem run in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "calib/predictor_build.h"
#include "util/synth_rng.h"
#include "util/threadpool.h"

#define OVERSAMPLE 8

/* Thin matrices are kept with each k-vector contiguous where the kernels want
 * it: Y (rows x k, row i = the k values of G's row space i) and Zt (k x cols,
 * row t = column t of Z), so both products are long dot / axpy kernel calls. */
typedef struct {
    const kernels *kern;
    const float *G;
    int rows, cols, k;
    float *Y;  /* rows x k */
    float *Zt; /* k x cols */
} product_job;

/* Y = G Z: Y[i][t] = G_i . Zt_t, rows shared out. */
static void mul_g_worker(void *ctx, int ith, int nth) {
    product_job *j = ctx;
    long i0, i1;
    pool_split(j->rows, ith, nth, &i0, &i1);
    for (long i = i0; i < i1; i++)
        for (int t = 0; t < j->k; t++)
            j->Y[(size_t)i * j->k + t] = j->kern->dot_f32(j->G + (size_t)i * j->cols, j->Zt + (size_t)t * j->cols, j->cols);
}

/* Zt = (G^T Y)^T: Zt_t = sum_i Y[i][t] G_i; the k output rows shared out, each thread streams G once. */
static void mul_gt_worker(void *ctx, int ith, int nth) {
    product_job *j = ctx;
    long t0, t1;
    pool_split(j->k, ith, nth, &t0, &t1);
    memset(j->Zt + (size_t)t0 * j->cols, 0, sizeof(float) * (size_t)(t1 - t0) * j->cols);
    for (int i = 0; i < j->rows; i++)
        for (long t = t0; t < t1; t++)
            j->kern->axpy_f32(j->Zt + (size_t)t * j->cols, j->Y[(size_t)i * j->k + t], j->G + (size_t)i * j->cols, j->cols);
}

/* Orthonormalise k vectors of length n in place (element e of vector t at
 * M[t * ts + e * es]): modified Gram-Schmidt, twice for stability. Vectors that
 * vanish (rank deficiency) become zero. */
static int orthonormalise(float *M, int n, int k, size_t ts, size_t es) {
    double *c = malloc(sizeof(double) * (size_t)n * k); /* vector-major copy */
    if (!c) return -1;
    for (int t = 0; t < k; t++)
        for (int e = 0; e < n; e++) c[(size_t)t * n + e] = M[t * ts + e * es];
    for (int t = 0; t < k; t++) {
        double *v = c + (size_t)t * n, before = 0;
        for (int i = 0; i < n; i++) before += v[i] * v[i];
        for (int pass = 0; pass < 2; pass++)
            for (int s = 0; s < t; s++) {
                const double *u = c + (size_t)s * n;
                double d = 0;
                for (int i = 0; i < n; i++) d += u[i] * v[i];
                for (int i = 0; i < n; i++) v[i] -= d * u[i];
            }
        double nn = 0;
        for (int i = 0; i < n; i++) nn += v[i] * v[i];
        /* what is left after removing the earlier directions is rounding noise: drop it */
        double inv = nn > 1e-20 * before && nn > 0 ? 1.0 / sqrt(nn) : 0.0;
        for (int i = 0; i < n; i++) v[i] *= inv;
    }
    for (int t = 0; t < k; t++)
        for (int e = 0; e < n; e++) M[t * ts + e * es] = (float)c[(size_t)t * n + e];
    free(c);
    return 0;
}

/* Eigen-decomposition of the symmetric k x k matrix S (destroyed) by cyclic
 * Jacobi rotations: eigenvalues in lambda, eigenvectors as the columns of V. */
static void jacobi_eigen(double *S, int k, double *lambda, double *V) {
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) V[(size_t)i * k + j] = i == j;
    for (int sweep = 0; sweep < 60; sweep++) {
        double off = 0, diag = 0;
        for (int i = 0; i < k; i++) {
            diag += S[(size_t)i * k + i] * S[(size_t)i * k + i];
            for (int j = i + 1; j < k; j++) off += S[(size_t)i * k + j] * S[(size_t)i * k + j];
        }
        if (off <= 1e-30 * diag || off == 0) break;
        for (int p = 0; p < k; p++)
            for (int q = p + 1; q < k; q++) {
                double apq = S[(size_t)p * k + q];
                if (apq == 0) continue;
                double app = S[(size_t)p * k + p], aqq = S[(size_t)q * k + q];
                double theta = (aqq - app) / (2 * apq);
                double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
                double c = 1 / sqrt(t * t + 1), s = t * c;
                for (int r = 0; r < k; r++) { /* S <- S J */
                    double srp = S[(size_t)r * k + p], srq = S[(size_t)r * k + q];
                    S[(size_t)r * k + p] = c * srp - s * srq;
                    S[(size_t)r * k + q] = s * srp + c * srq;
                }
                for (int r = 0; r < k; r++) { /* S <- J^T S */
                    double spr = S[(size_t)p * k + r], sqr = S[(size_t)q * k + r];
                    S[(size_t)p * k + r] = c * spr - s * sqr;
                    S[(size_t)q * k + r] = s * spr + c * sqr;
                }
                for (int r = 0; r < k; r++) { /* V <- V J */
                    double vrp = V[(size_t)r * k + p], vrq = V[(size_t)r * k + q];
                    V[(size_t)r * k + p] = c * vrp - s * vrq;
                    V[(size_t)r * k + q] = s * vrp + c * vrq;
                }
            }
    }
    for (int i = 0; i < k; i++) lambda[i] = S[(size_t)i * k + i];
}

int lowrank_factor(const float *G, int rows, int cols, int r, int power_iters, uint64_t seed, int threads, float *A,
                   float *B) {
    int limit = rows < cols ? rows : cols;
    int k = r + OVERSAMPLE < limit ? r + OVERSAMPLE : limit;
    if (r < 1 || r > limit) return -1;
    threadpool *pool = pool_new(threads < 1 ? 1 : threads);
    float *Zt = malloc(sizeof(float) * (size_t)cols * k); /* first the random test matrix */
    float *Y = malloc(sizeof(float) * (size_t)rows * k);
    double *S = malloc(sizeof(double) * (size_t)k * k), *V = malloc(sizeof(double) * (size_t)k * k);
    double *lambda = malloc(sizeof(double) * (size_t)k);
    int *order = malloc(sizeof(int) * (size_t)k);
    float *w = malloc(sizeof(float) * (size_t)k);
    int rc = -1;
    if (!pool || !Zt || !Y || !S || !V || !lambda || !order || !w) goto done;

    synth_rng rng = synth_stream(synth_key(seed, 0x5644, (uint64_t)rows, (uint64_t)cols), 0);
    for (size_t i = 0; i < (size_t)cols * k; i++) Zt[i] = (float)synth_normal(&rng);
    product_job job = {kernels_best(), G, rows, cols, k, Y, Zt};
    pool_run(pool, mul_g_worker, &job); /* Y = G Omega */
    for (int it = 0; it < power_iters; it++) {
        if (orthonormalise(Y, rows, k, 1, (size_t)k)) goto done;
        pool_run(pool, mul_gt_worker, &job); /* Z = G^T Q */
        if (orthonormalise(Zt, cols, k, (size_t)cols, 1)) goto done;
        pool_run(pool, mul_g_worker, &job);
    }
    if (orthonormalise(Y, rows, k, 1, (size_t)k)) goto done; /* Q */
    pool_run(pool, mul_gt_worker, &job);                      /* Z = G^T Q = (Q^T G)^T */

    /* (Q^T G)(Q^T G)^T = Z^T Z = W diag(lambda) W^T; G ~ Q W diag(sigma) (Z W diag(1/sigma))^T */
    for (int s = 0; s < k; s++)
        for (int t = s; t < k; t++) {
            double d = 0;
            for (int c = 0; c < cols; c++) d += (double)Zt[(size_t)s * cols + c] * Zt[(size_t)t * cols + c];
            S[(size_t)s * k + t] = S[(size_t)t * k + s] = d;
        }
    jacobi_eigen(S, k, lambda, V);
    for (int i = 0; i < k; i++) order[i] = i;
    for (int i = 1; i < k; i++) /* insertion sort by eigenvalue, descending; k is small */
        for (int j = i; j > 0 && lambda[order[j]] > lambda[order[j - 1]]; j--) {
            int tmp = order[j]; order[j] = order[j - 1]; order[j - 1] = tmp;
        }
    const double lmax = lambda[order[0]] > 0 ? lambda[order[0]] : 0;
    for (int t = 0; t < r; t++) {
        const int e = order[t];
        const double sigma = lambda[e] > 1e-24 * lmax && lambda[e] > 0 ? sqrt(lambda[e]) : 0;
        const float sa = sigma > 0 ? (float)(1 / sqrt(sigma)) : 0, sb = (float)sqrt(sigma);
        float *a = A + (size_t)t * cols;
        memset(a, 0, sizeof(float) * (size_t)cols);
        for (int s = 0; s < k; s++) job.kern->axpy_f32(a, sa * (float)V[(size_t)s * k + e], Zt + (size_t)s * cols, cols);
        for (int s = 0; s < k; s++) w[s] = sb * (float)V[(size_t)s * k + e];
        for (int i = 0; i < rows; i++) B[(size_t)i * r + t] = job.kern->dot_f32(Y + (size_t)i * k, w, k);
    }
    rc = 0;
done:
    pool_free(pool);
    free(Zt); free(Y); free(S); free(V); free(lambda); free(order); free(w);
    return rc;
}
