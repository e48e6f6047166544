/*
 * cell.c — the one definition of the process-wide spin accounting that
 * every includer of cell.h shares (hidden: not exported from a c-shared
 * library).
 */
#include "cell.h"

__attribute__((visibility("hidden"))) int32_t hg_busy;
__attribute__((visibility("hidden"))) int32_t hg_ncpu;
