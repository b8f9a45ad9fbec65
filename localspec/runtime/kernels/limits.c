/* The limits of limits.h as symbols of the built library, for runtime/library.py to read (ctypes in_dll). */
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
