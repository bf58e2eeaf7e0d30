/* planted_violation.c — check-layers' proof that the check can fail: compiled as an object
 * named hotlist.o, it calls the forward pass (hotlist's row does not list model) and the
 * public waste_usable_ram (nothing inside the library may). Never linked into libwaste. */
#include "engine.h"

void wh_planted_violation(waste_ctx *ctx);

void wh_planted_violation(waste_ctx *ctx) {
    if (waste_usable_ram() == 0) wm_reset_state(ctx);
}
