/* The kernels' limits and instruction sets, stated once: every kernel source includes this, limits.c exports the
 * values, and runtime/library.py reads them from the built library (Python states none of them again).
 *
 * Instruction sets, best first, picked by the compiler's target (-march=native):
 *   avx512bf16  AVX-512 BF16 and VNNI with F, BW, VL (AMD Zen 4+, Intel Cooper Lake, Sapphire Rapids+)
 *   avx2        AVX2 with FMA and F16C (most desktop CPUs: Intel Haswell+, AMD Zen 1-3)
 * The library does not compile for a target with neither (limits.c's #error is the reason the loader reports);
 * the attention kernel alone also builds for plain x86-64 (its lanes are the scalar rule). */
#ifndef LOCALSPEC_LIMITS_H
#define LOCALSPEC_LIMITS_H

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define LOCALSPEC_AVX512BF16 1
#define LOCALSPEC_ISA "avx512bf16"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LOCALSPEC_AVX2 1
#define LOCALSPEC_ISA "avx2"
#endif

#define LOCALSPEC_GROUP 32      /* weights per scale (and offset) along K: a GGUF block of Q4_1 or Q8_0 */
#define LOCALSPEC_K_GROUP 16    /* the q8k matmul's: a Q6_K sub-block (Q5_K and Q5_1 groups of 32 are two) */
#define LOCALSPEC_LANES 16      /* outputs per packed block of the matmuls; head sizes are multiples of it */
#define LOCALSPEC_MAX_DIM 512   /* the attention kernel's largest head size */
#define LOCALSPEC_MAX_GROUP 16  /* and most query heads per key-value head */

#endif
