/* AMX-INT8 tiles for the block matmuls' many-row calls (q4_matmul.c, q8_matmul.c): an avx512bf16 build for a CPU with
 * AMX (Intel Sapphire Rapids+) sums Σ q·x̂ of up to 16 rows × 16 outputs × one group in one tdpbsud / tdpbssd, with
 * the group's x̂ rows as tile A and its codes, quad t as row t, as tile B. The sums are the same exact int32 values
 * the VNNI dot products give, and the float steps after them are the same, so a call gives the same bits on the
 * tiles or off them; which one runs is a matter of speed alone.
 *
 * Tiles: tmm0 C, rows × 16 int32 sums; tmm1 A, rows × `bytes` (a group of x̂); tmm2 B, bytes / 4 quads × 64 codes.
 * Linux hands a process the tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM): limits.c asks, once, when
 * runtime/library.py turns the tiles on. */
#ifndef LOCALSPEC_AMX_H
#define LOCALSPEC_AMX_H

#include "limits.h"

#define AMX_CHUNK 16 /* a tile's rows: the rows of one pass over a block's codes on the tiles */

#if defined(LOCALSPEC_AVX512BF16) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define LOCALSPEC_AMX 1
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* A thread's tiles for a call: AMX_CHUNK rows always (a pass of fewer rows reads the zero rows past the call's x̂,
 * amx_padded, and leaves their sums unused), so the configuration is loaded once per thread and call. */
static inline void amx_begin(int bytes) {
    amx_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    config.rows[0] = AMX_CHUNK, config.colsb[0] = 64;
    config.rows[1] = AMX_CHUNK, config.colsb[1] = (uint16_t)bytes;
    config.rows[2] = (uint8_t)(bytes / 4), config.colsb[2] = 64;
    _tile_loadconfig(&config);
}

static inline void amx_end(void) { _tile_release(); }
#else
static inline void amx_begin(int bytes) { (void)bytes; }
static inline void amx_end(void) {}
#endif

/* Rows of x̂ a call allocates: on the tiles, whole passes of AMX_CHUNK rows (the rows past the call's are zeros). */
static inline int amx_padded(int rows, int amx) { return amx ? (rows + AMX_CHUNK - 1) / AMX_CHUNK * AMX_CHUNK : rows; }

/* Calls of at least this many rows take the tiles; 0: none (no AMX here, or turned off). Set by localspec_amx_rows. */
extern int localspec_amx_min_rows;

static inline int amx_for(int rows) { return localspec_amx_min_rows > 0 && rows >= localspec_amx_min_rows; }

#endif
