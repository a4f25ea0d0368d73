/* pi2 plan's steps, from the options to the files in the output directory
 * (docs/planner.md). */
#ifndef PI2_PLANNER_PLAN_BUILD_H
#define PI2_PLANNER_PLAN_BUILD_H

#include <stdbool.h>
#include <stdint.h>

#include "bundle_order.h"
#include "engine/ffn_mode.h"

typedef struct {
    const char *model_path, *out_dir, *conf_path, *prompts_path;
    const char *predictor_path; /* a pi2-predictor side file for predictor mode, or NULL */
    uint64_t budget;   /* 0: none given */
    double target;     /* tok/s, 0: none given */
    double hw_point_seconds; /* 0: the hardware profile's default */
    int tokens, ctx, threads;
    ffn_mode mode;
    bundle_order_kind order; /* which order pins a prefix of each layer (bundle_order.h) */
    bool mode_given, reprofile;
    bool tokens_given; /* -n: say so if the prompts run out before it */
} plan_options;

/* 0, or -1 after logging why. */
int plan_run(const plan_options *o);

#endif
