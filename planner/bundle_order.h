/* Which neurons share a bundle, and in what order a layer's bundles lie in
 * the bundle file, from the model profile (docs/planner.md).
 *
 * One neuron per bundle: the neurons hottest first. k per bundle: neurons are
 * taken hottest first, each joined by the k - 1 unassigned neurons among the
 * next GROUP_WINDOW in hot order that fired with it most often (co-activation),
 * so a token that needs one of them likely needs the others, and one read
 * serves them all. Then the bundles are sorted by how often a token needs
 * them (any member fired), so every layer's bundles are hottest first and a
 * pinned hot set is a prefix; a short bundle (n_ff not a multiple of k) stays
 * last, where the bundle file puts it.
 *
 * For k > 1 the co-activation is counted on the even calibration tokens and
 * how often a bundle is needed on the odd ones; for k = 1 (profile order)
 * the need at each place of the order comes from tokens that did not rank
 * its neuron (bundle_order.c, held_out_needs). Counted on the tokens that
 * chose them, partners picked as the best of GROUP_WINDOW looked more
 * co-firing than they are: on the 7B file, whose neurons fire independently,
 * 2-neuron bundles were predicted to need 80.9 % hits' worth of reads (a
 * plan 5 % faster than 1-neuron bundles) and read 92 MB a token against 48,
 * decoding 6.50 tok/s against 8.05. */
#ifndef PI2_PLANNER_BUNDLE_ORDER_H
#define PI2_PLANNER_BUNDLE_ORDER_H

#include "calib/model_profile.h"

#define GROUP_WINDOW 64

/* Which order the bundles follow. ORDER_PROFILE: the model profile's, hottest
 * first, as above. ORDER_FILE: the model file's own neuron order, for a file
 * that is already hottest-first (pi2-reorder, from its own calibration): the
 * pinned neurons are then a prefix of each layer in the file too, which a
 * prompt under the budget copies from memory instead of reading
 * (docs/offload.md, "Pinned rows in the prompt"); the profile still says how
 * often each bundle is needed, and a bundle of k neurons is k neighbours in
 * the file (no partners by co-activation). ORDER_AUTO: ORDER_FILE for a file with
 * pi2.reorder metadata, else ORDER_PROFILE. */
typedef enum { ORDER_AUTO, ORDER_PROFILE, ORDER_FILE } bundle_order_kind;

typedef struct {
    int per_bundle;
    long n_bundles;     /* per layer */
    long n_whole;       /* of them with per_bundle neurons: all but a short last one */
    int32_t *order;     /* [n_layer][n_ff]: the neuron in each slot, as bundle_write takes it */
    bool file_order;    /* ORDER_FILE: p_bundle follows the file's order, nearly but not strictly descending */
    double *p_bundle;   /* [n_layer][n_bundles]: probability a token needs the bundle, descending per
                           layer but for a short last bundle (ORDER_PROFILE) */
    double *active;     /* [n_layer]: mean neurons fired per token */
    double *p_unasked;  /* [n_layer][n_bundles], predictor mode (else NULL): probability a token needs the bundle
                           for a member that the guess from the layer's input did not name (at most p_bundle) */
    double *p_desc;     /* [n_layer * n_whole]: every layer's whole bundles' p, descending over all layers (the
                           n most needed bundles of the model are those at or above p_desc[n - 1]) */
} bundle_order;

/* kind ORDER_PROFILE or ORDER_FILE. 0, or -1 when out of memory. */
int bundle_order_make(bundle_order *o, const model_profile *p, int per_bundle, bundle_order_kind kind);
void bundle_order_free(bundle_order *o);
/* p_desc from p_bundle (bundle_order_make calls it); 0, or -1 when out of memory. */
int bundle_order_sort_needs(bundle_order *o, int n_layer);

#endif
