/* The plan in words: `pi2 plan show`, the speed-versus-memory table, and the
 * curve as an SVG plot with the plan's budget marked. */
#ifndef PI2_PLANNER_PLAN_REPORT_H
#define PI2_PLANNER_PLAN_REPORT_H

#include <stdio.h>

#include "plan.pb-c.h"

void plan_print(FILE *out, const Pi2__Plan *p);
void plan_print_curve(FILE *out, const Pi2__Plan *p);
/* 0, or -1 with err set */
int plan_write_svg(const Pi2__Plan *p, const char *path, char *err, size_t errlen);

#endif
