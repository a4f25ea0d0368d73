/* Progress of the planner's long steps on stderr: a percentage with the time
 * left, redrawn in place on a terminal, a line per tenth otherwise (logs). */
#ifndef PI2_PLANNER_PROGRESS_H
#define PI2_PLANNER_PROGRESS_H

typedef struct {
    const char *step;
    double started, last_shown;
    int last_tenth;
    int tty;
} progress;

void progress_begin(progress *p, const char *step);
void progress_show(progress *p, double done); /* done: 0..1 */
void progress_end(progress *p);

#endif
