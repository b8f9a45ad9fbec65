/* The limits of limits.h as symbols of the built library, for runtime/library.py to read (ctypes in_dll), and the
 * switch of amx.h's tiles. */
#define _DEFAULT_SOURCE /* syscall(), for the AMX tile state's request */
#include <sys/syscall.h>
#include <unistd.h>

#include "amx.h"
#include "limits.h"

#ifndef LOCALSPEC_ISA
#error "this CPU has neither instruction set the kernels are built for (AVX-512 BF16 and VNNI with F, BW, VL; or AVX2 with FMA and F16C)"
#endif

const char *localspec_isa(void) { return LOCALSPEC_ISA; }
const int localspec_group = LOCALSPEC_GROUP;
const int localspec_k_group = LOCALSPEC_K_GROUP;
const int localspec_lanes = LOCALSPEC_LANES;
const int localspec_max_dim = LOCALSPEC_MAX_DIM;
const int localspec_max_group = LOCALSPEC_MAX_GROUP;

int localspec_amx_min_rows = 0;

/* Use the AMX tiles for calls of at least min_rows rows (0: never). Returns 1 where this build and this CPU can (Linux
 * granted the tile state), else 0 and the tiles stay off. */
int localspec_amx_rows(int min_rows) {
#if defined(LOCALSPEC_AMX)
    static int granted = -1; /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): once per process */
    if (granted < 0) granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    localspec_amx_min_rows = granted && min_rows > 0 ? min_rows : 0;
    return granted;
#else
    (void)min_rows;
    return 0;
#endif
}
