/* FFN mode names and which models can run which: see ffn_mode.h. */
#include "engine/ffn_mode.h"

#include <stdio.h>
#include <string.h>

#include "util/log.h"

const char *ffn_mode_name(ffn_mode mode) {
    switch (mode) {
    case FFN_GATE_FIRST: return "gate-first";
    case FFN_PREDICTOR: return "predictor";
    default: return "dense";
    }
}

void ffn_mode_describe(char *buf, size_t len, ffn_mode mode, const char *path, size_t path_max) {
    if (mode != FFN_PREDICTOR) {
        snprintf(buf, len, "%s", ffn_mode_name(mode));
        return;
    }
    if (!path || !path[0]) snprintf(buf, len, "%s, predictor fc1/fc2 of the model", ffn_mode_name(mode));
    else snprintf(buf, len, "%s, predictor %.*s", ffn_mode_name(mode), (int)path_max, path);
}

bool ffn_mode_chunked(const model *m, ffn_mode mode) { return mode != FFN_DENSE || !m->layers[0].down.data; }

int ffn_mode_parse(const char *s, ffn_mode *mode) {
    const ffn_mode all[] = {FFN_DENSE, FFN_GATE_FIRST, FFN_PREDICTOR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, ffn_mode_name(all[i]))) {
            *mode = all[i];
            return 0;
        }
    return -1;
}

const char *ffn_mode_refusal(const model *m, ffn_mode mode, bool have_predictor) {
    if (mode == FFN_GATE_FIRST && m->act == FFN_SILU)
        return "gate-first needs a ReLU model; this one uses silu (every neuron fires)";
    if (mode == FFN_PREDICTOR && !have_predictor) return "predictor mode needs a predictor";
    return NULL;
}

int ffn_mode_parse_flag(const char *s, const char *flag, ffn_mode *mode, bool *is_auto) {
    if (is_auto && !strcmp(s, "auto")) {
        *is_auto = true;
        return 0;
    }
    if (ffn_mode_parse(s, mode)) {
        log_error("%s '%s': expected %s%s, %s or %s", flag, s, is_auto ? "auto, " : "", ffn_mode_name(FFN_DENSE),
                  ffn_mode_name(FFN_GATE_FIRST), ffn_mode_name(FFN_PREDICTOR));
        return -1;
    }
    if (is_auto) *is_auto = false;
    return 0;
}
