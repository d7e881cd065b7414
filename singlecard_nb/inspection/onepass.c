/* One pass over a tensor's values for singlecard_nb's statistics (see native.py, stats.py).

   onepass_<dtype>(x, n, shift, out) reads x[0..n) once and writes
       out[0] = min, out[1] = max, out[2] = mean,
       out[3] = sum((x - mean)^2)  (n - 1 times the variance),
       out[4] = count(x != 0),
       out[5] = the sum of squares the variance was taken from (see below).
   Values are widened to float (double for float64). Within each block of BLOCK values, LANES
   independent float accumulators (so the compiler vectorises the loop without reassociating
   anything) sum d = x - c and d^2, where c is the block's first value, or `shift` for every
   block when `shift` is not NaN; each accumulator adds at most BLOCK / LANES = 128 terms.
   Blocks are merged in double with Chan's pairwise formula (mean and centred sum of squares),
   so the only loss is within a block: sum(d^2) - sum(d)^2 / BLOCK cancels when the values lie
   far from c in units of their spread. out[5] / out[3] measures that; the caller re-runs with
   shift = mean when it is large. min/max skip NaN (a NaN compares false); any NaN makes the
   sums NaN, and the caller then counts NaN and Inf with torch. No -ffast-math: NaN and Inf
   must behave.

   With OpenMP (built with -fopenmp only when the process already runs torch's libgomp, whose
   thread pool is then shared) large tensors are split over the calling thread's OpenMP team. */

#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK 4096
#define PARALLEL_MIN 262144 /* below this one thread is faster than waking the team,
                               and no OpenMP region is entered at all */
#define MAX_PARTS 64

typedef struct { double count, mean, m2, s2, lo, hi, nz; } part_t;

/* Chan et al.: merge the mean and centred sum of squares of b into a. */
static void merge(part_t *a, const part_t *b) {
    if (b->count == 0) return;
    if (a->count == 0) { *a = *b; return; }
    double count = a->count + b->count, delta = b->mean - a->mean;
    a->mean += delta * (b->count / count);
    a->m2 += b->m2 + delta * delta * (a->count * b->count / count);
    a->s2 += b->s2;
    a->nz += b->nz;
    if (b->lo < a->lo) a->lo = b->lo;
    if (b->hi > a->hi) a->hi = b->hi;
    a->count = count;
}

#define DEFINE_RANGE(NAME, T, ACC, LANES, LOAD)                                        \
static void NAME##_range(const T *x, int64_t i, int64_t end, double shift,            \
                         part_t *total) {                                              \
    ACC lo[LANES], hi[LANES];                                                          \
    ACC first = LOAD(x[i]);                                                            \
    for (int j = 0; j < LANES; j++) { lo[j] = first; hi[j] = first; }                  \
    part_t acc = {0, 0, 0, 0, 0, 0, 0};                                                \
    while (i < end) {                                                                  \
        int64_t start = i, stop = i + BLOCK < end ? i + BLOCK : end;                   \
        ACC c = isnan(shift) ? LOAD(x[i]) : (ACC)shift;                                \
        ACC s1[LANES], s2[LANES], nz[LANES];                                           \
        for (int j = 0; j < LANES; j++) { s1[j] = 0; s2[j] = 0; nz[j] = 0; }           \
        for (; i + LANES <= stop; i += LANES) {                                        \
            for (int j = 0; j < LANES; j++) {                                          \
                ACC v = LOAD(x[i + j]);                                                \
                lo[j] = v < lo[j] ? v : lo[j];                                         \
                hi[j] = v > hi[j] ? v : hi[j];                                         \
                ACC d = v - c;                                                         \
                s1[j] += d;                                                            \
                s2[j] += d * d;                                                        \
                nz[j] += v != 0 ? (ACC)1 : (ACC)0;                                     \
            }                                                                          \
        }                                                                              \
        for (; i < stop; i++) {                                                        \
            ACC v = LOAD(x[i]);                                                        \
            lo[0] = v < lo[0] ? v : lo[0];                                             \
            hi[0] = v > hi[0] ? v : hi[0];                                             \
            ACC d = v - c;                                                             \
            s1[0] += d;                                                                \
            s2[0] += d * d;                                                            \
            nz[0] += v != 0 ? (ACC)1 : (ACC)0;                                         \
        }                                                                              \
        double S1 = 0, S2 = 0, NZ = 0, count = (double)(stop - start);                 \
        for (int j = 0; j < LANES; j++) { S1 += s1[j]; S2 += s2[j]; NZ += nz[j]; }     \
        part_t block = {count, (double)c + S1 / count, S2 - S1 * S1 / count, S2,       \
                        0, 0, NZ};                                                     \
        if (block.m2 < 0) block.m2 = 0;                                                \
        merge(&acc, &block);                                                           \
    }                                                                                  \
    ACC l = lo[0], h = hi[0];                                                          \
    for (int j = 1; j < LANES; j++) { l = lo[j] < l ? lo[j] : l; h = hi[j] > h ? hi[j] : h; } \
    acc.lo = l; acc.hi = h;                                                            \
    *total = acc;                                                                      \
}

#ifdef _OPENMP
#define TEAM_SPLIT(NAME)                                                               \
    if (n < PARALLEL_MIN) NAME##_range(x, 0, n, shift, &parts[0]);                     \
    else _Pragma("omp parallel")                                                       \
    {                                                                                  \
        int t = omp_get_thread_num(), k = omp_get_num_threads();                       \
        if (k > MAX_PARTS) k = MAX_PARTS;                                              \
        if (t < k) {                                                                   \
            int64_t per = (n / k + BLOCK - 1) / BLOCK * BLOCK;                         \
            int64_t a = per * t, b = a + per < n ? a + per : n;                        \
            if (a < b) NAME##_range(x, a, b, shift, &parts[t]);                        \
        }                                                                              \
    }
#else
#define TEAM_SPLIT(NAME) NAME##_range(x, 0, n, shift, &parts[0]);
#endif

#define DEFINE_KERNEL(NAME, T, ACC, LANES, LOAD)                                       \
DEFINE_RANGE(NAME, T, ACC, LANES, LOAD)                                                \
void NAME(const T *x, int64_t n, double shift, double *out) {                          \
    part_t parts[MAX_PARTS], all = {0, 0, 0, 0, NAN, NAN, 0};                          \
    for (int t = 0; t < MAX_PARTS; t++) parts[t].count = 0;                            \
    if (n > 0) { TEAM_SPLIT(NAME) }                                                    \
    for (int t = 0; t < MAX_PARTS; t++) merge(&all, &parts[t]);                        \
    out[0] = all.lo; out[1] = all.hi; out[2] = all.mean; out[3] = all.m2;              \
    out[4] = all.nz; out[5] = all.s2;                                                  \
}

static inline float from_bf16(uint16_t b) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)b << 16;
    return c.f;
}
#define AS_IS(v) (v)
#define AS_FLOAT(v) ((float)(v))

DEFINE_KERNEL(onepass_float32, float, float, 32, AS_IS)
DEFINE_KERNEL(onepass_float64, double, double, 16, AS_IS)
DEFINE_KERNEL(onepass_bfloat16, uint16_t, float, 32, from_bf16)

#ifdef __FLT16_MAX__ /* the compiler has _Float16 */
DEFINE_KERNEL(onepass_float16, _Float16, float, 32, AS_FLOAT)
int onepass_has_float16(void) { return 1; }
#else
int onepass_has_float16(void) { return 0; }
#endif
