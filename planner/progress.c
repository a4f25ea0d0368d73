/* Progress lines (progress.h). */
#include "progress.h"

#include <stdio.h>
#include <unistd.h>

#include "util/clock.h"

void progress_begin(progress *p, const char *step) {
    p->step = step;
    p->started = clock_seconds();
    p->last_shown = 0;
    p->last_tenth = -1;
    p->tty = isatty(STDERR_FILENO);
}

void progress_show(progress *p, double done) {
    const double now = clock_seconds(), took = now - p->started;
    const int tenth = (int)(done * 10);
    if (p->tty ? now - p->last_shown < 0.2 : tenth == p->last_tenth) return;
    p->last_shown = now, p->last_tenth = tenth;
    char left[32] = "";
    if (done > 0.02 && done < 1) snprintf(left, sizeof left, ", about %.0f s left", took / done * (1 - done));
    fprintf(stderr, p->tty ? "\r%s: %3.0f %%%s   " : "%s: %3.0f %%%s\n", p->step, 100 * done, left);
}

void progress_end(progress *p) {
    fprintf(stderr, p->tty ? "\r%s: done in %.1f s          \n" : "%s: done in %.1f s\n", p->step,
            clock_seconds() - p->started);
}
