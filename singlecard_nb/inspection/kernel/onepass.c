/* All statistics of a tensor in one read, for singlecard_nb (see native.py and stats.py).

   onepass_<dtype>(x, n, exact, out) reads x[0..n) and writes stats.RAW to out[0..8):
       min, max, mean, 0, sum((x - mean)^2), NaN count, Inf count, count(x != 0)
   (RAW's shift is the mean and its s1 is 0: stats.finish makes std and the rest of VALUES).

   The one read: values of every dtype are widened to double, as the torch fallback
   (reductions.py) sums them, so that the two paths give a tensor the same statistics to ~1e-12
   of its spread (ranks of a job may read equal tensors on either path: compare_ranks' rtol is
   1e-6). Within each block of BLOCK values LANES independent accumulators (so the compiler
   vectorises without reassociating anything) sum d = x - c and d^2, c being the block's first
   value; each adds at most BLOCK / LANES = 256 terms, a relative error of at most 256 * 2^-53.
   min, max and the zero count are taken on the values as read (float for float32, bfloat16
   and float16: exact, and twice the lanes of double per vector instruction; the count in
   integers), which made the read ~25% faster. On an activation just written (in cache) the
   arithmetic bounds it: the double sums make it ~3-4x one float32 `x.sum()` from 65 536
   values up (one thread, AVX-512), and below ~4 096 values it is quicker than the sum's
   dispatch. Blocks are merged with
   Chan's formula (mean, centred sum of squares), so precision is only lost within a block,
   where sum(d^2) - sum(d)^2 / BLOCK cancels if values lie far from c in units of their spread.
   min/max skip NaN (a NaN compares false); a NaN or Inf makes the sums non-finite.

   A second read, in double, only where the first cannot be trusted:
   - sums not finite: NaN and Inf are counted, and min, max and mean follow torch (NaN if any
     NaN; Inf stays Inf); when there was neither, the float squares overflowed: centred pass;
   - `exact`, the cancellation above beyond CANCELLATION_LIMIT, or values whose squares leave the
     accumulator's range (beyond RANGE, below 1 / RANGE): a centred pass around the mean.
   No -ffast-math: NaN and Inf must behave.

   With OpenMP (built with -fopenmp only when the process already runs torch's libgomp, whose
   thread pool is then shared) tensors of PARALLEL_MIN values or more are split over the calling
   thread's team; smaller ones never enter an OpenMP region. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK 4096
#define PARALLEL_MIN 262144 /* below this one thread is faster than waking the team */
#define MAX_PARTS 64
#define CANCELLATION_LIMIT 10.0 /* sum of squares / centred sum of squares of the first read */

typedef struct { double count, mean, m2, s2, lo, hi, nz; } part_t;

/* Chan et al.: merge the mean and centred sum of squares of b into a (min/max aside). */
static void merge(part_t *a, const part_t *b) {
    if (b->count == 0) return;
    if (a->count == 0) { *a = *b; return; }
    double count = a->count + b->count, delta = b->mean - a->mean;
    a->mean += delta * (b->count / count);
    a->m2 += b->m2 + delta * delta * (a->count * b->count / count);
    a->s2 += b->s2;
    a->nz += b->nz;
    a->lo = b->lo < a->lo ? b->lo : a->lo;
    a->hi = b->hi > a->hi ? b->hi : a->hi;
    a->count = count;
}

/* Run BODY(a, b, t) over [0, n) in parts: one part below PARALLEL_MIN, else one per thread
   of the OpenMP team, each a whole number of blocks. */
#ifdef _OPENMP
#define SPLIT(n, BODY)                                                                 \
    if ((n) < PARALLEL_MIN) { BODY(0, (n), 0) }                                        \
    else _Pragma("omp parallel")                                                       \
    {                                                                                  \
        int t = omp_get_thread_num(), k = omp_get_num_threads();                       \
        if (k > MAX_PARTS) k = MAX_PARTS;                                              \
        int64_t per = (((n) + k - 1) / k + BLOCK - 1) / BLOCK * BLOCK; /* k parts cover n */\
        int64_t a = per * t, b = a + per < (n) ? a + per : (n);                        \
        if (t < k && a < b) { BODY(a, b, t) }                                          \
    }
#else
#define SPLIT(n, BODY) { BODY(0, (n), 0) }
#endif

/* float16 reads through float32's functions (half_read): its own go unused */
#if defined(__GNUC__) || defined(__clang__)
#define MAYBE_UNUSED __attribute__((unused))
#else
#define MAYBE_UNUSED
#endif

#define DEFINE_KERNEL(NAME, T, ACC, MM, LANES, LOAD, RANGE)                            \
/* the one read, over x[i..end) */                                                     \
static MAYBE_UNUSED void NAME##_read(const T *x, int64_t i, int64_t end, part_t *total) { \
    MM lo[LANES], hi[LANES];                                                           \
    MM first = LOAD(x[i]);                                                             \
    for (int j = 0; j < LANES; j++) { lo[j] = first; hi[j] = first; }                  \
    part_t acc = {0, 0, 0, 0, 0, 0, 0};                                                \
    while (i < end) {                                                                  \
        int64_t start = i, stop = i + BLOCK < end ? i + BLOCK : end;                   \
        ACC c = LOAD(x[i]);                                                            \
        ACC s1[LANES], s2[LANES];                                                      \
        int32_t nz[LANES]; /* at most BLOCK / LANES each */                            \
        for (int j = 0; j < LANES; j++) { s1[j] = 0; s2[j] = 0; nz[j] = 0; }           \
        for (; i + LANES <= stop; i += LANES) {                                        \
            for (int j = 0; j < LANES; j++) {                                          \
                MM m = LOAD(x[i + j]);                                                 \
                lo[j] = m < lo[j] ? m : lo[j];                                         \
                hi[j] = m > hi[j] ? m : hi[j];                                         \
                nz[j] += m != 0;                                                       \
                ACC d = (ACC)m - c;                                                    \
                s1[j] += d;                                                            \
                s2[j] += d * d;                                                        \
            }                                                                          \
        }                                                                              \
        for (; i < stop; i++) {                                                        \
            MM m = LOAD(x[i]);                                                         \
            lo[0] = m < lo[0] ? m : lo[0];                                             \
            hi[0] = m > hi[0] ? m : hi[0];                                             \
            nz[0] += m != 0;                                                           \
            ACC d = (ACC)m - c;                                                        \
            s1[0] += d;                                                                \
            s2[0] += d * d;                                                            \
        }                                                                              \
        double S1 = 0, S2 = 0, NZ = 0, count = (double)(stop - start);                 \
        for (int j = 0; j < LANES; j++) { S1 += s1[j]; S2 += s2[j]; NZ += nz[j]; }     \
        part_t block = {count, (double)c + S1 / count, S2 - S1 * S1 / count, S2,       \
                        0, 0, NZ};                                                     \
        if (block.m2 < 0) block.m2 = 0;                                                \
        merge(&acc, &block);  /* min/max come from the lanes, below */                 \
    }                                                                                  \
    MM l = lo[0], h = hi[0];                                                           \
    for (int j = 1; j < LANES; j++) { l = lo[j] < l ? lo[j] : l; h = hi[j] > h ? hi[j] : h; } \
    acc.lo = l; acc.hi = h;                                                            \
    *total = acc;                                                                      \
}                                                                                      \
                                                                                       \
/* the centred second read, in double: sums of d = x - mean and d^2 over x[i..end) */  \
static MAYBE_UNUSED void NAME##_centred(const T *x, int64_t i, int64_t end, double mean, \
                           double *sums) {                                             \
    double s1[8] = {0}, s2[8] = {0};                                                   \
    for (; i + 8 <= end; i += 8) {                                                     \
        for (int j = 0; j < 8; j++) {                                                  \
            double d = (double)LOAD(x[i + j]) - mean;                                  \
            s1[j] += d;                                                                \
            s2[j] += d * d;                                                            \
        }                                                                              \
    }                                                                                  \
    for (; i < end; i++) {                                                             \
        double d = (double)LOAD(x[i]) - mean;                                          \
        s1[0] += d;                                                                    \
        s2[0] += d * d;                                                                \
    }                                                                                  \
    for (int j = 0; j < 8; j++) { sums[0] += s1[j]; sums[1] += s2[j]; }                \
}                                                                                      \
                                                                                       \
void NAME(const T *x, int64_t n, int exact, double *out) {                             \
    part_t parts[MAX_PARTS], all = {0, 0, 0, 0, NAN, NAN, 0};                          \
    for (int t = 0; t < MAX_PARTS; t++) parts[t].count = 0;                            \
    if (n > 0) { SPLIT(n, NAME##_READ_PART) }                                          \
    for (int t = 0; t < MAX_PARTS; t++) merge(&all, &parts[t]);                        \
    double lo = all.lo, hi = all.hi, mean = all.mean, m2 = all.m2;                     \
    double nans = 0, infs = 0;                                                         \
    int centre = 0;                                                                    \
    if (!(isfinite(mean) && isfinite(m2))) {                                           \
        double sum = 0;                                                                \
        for (int64_t i = 0; i < n; i++) {                                              \
            double v = (double)LOAD(x[i]);                                             \
            nans += isnan(v) ? 1 : 0;                                                  \
            infs += isinf(v) ? 1 : 0;                                                  \
            sum += v;                                                                  \
        }                                                                              \
        mean = sum / (double)n;  /* NaN, or Inf, as torch's mean */                    \
        m2 = NAN;                                                                      \
        if (nans > 0) { lo = NAN; hi = NAN; }                                          \
        centre = nans == 0 && infs == 0; /* squares overflowed the accumulator */      \
    } else if (lo != hi) {                                                             \
        double largest = hi > -lo ? hi : -lo;                                          \
        centre = exact || !(largest < (RANGE) && largest > 1 / (RANGE))                \
                 || m2 <= 0 || all.s2 > CANCELLATION_LIMIT * m2;                       \
    }                                                                                  \
    if (centre) {                                                                      \
        double sums[MAX_PARTS][2] = {{0}};                                             \
        SPLIT(n, NAME##_CENTRED_PART)                                                  \
        double s1 = 0, s2 = 0;                                                         \
        for (int t = 0; t < MAX_PARTS; t++) { s1 += sums[t][0]; s2 += sums[t][1]; }    \
        m2 = s2 - s1 * s1 / (double)n;                                                 \
        mean += s1 / (double)n;                                                        \
    }                                                                                  \
    out[0] = lo; out[1] = hi; out[2] = mean; out[3] = 0; out[4] = m2;                  \
    out[5] = nans; out[6] = infs; out[7] = all.nz;                                     \
}

static inline float from_bf16(uint16_t b) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)b << 16;
    return c.f;
}
#define AS_IS(v) (v)
#define AS_FLOAT(v) ((float)(v))

#define onepass_float32_READ_PART(a, b, t) onepass_float32_read(x, a, b, &parts[t]);
#define onepass_float32_CENTRED_PART(a, b, t) onepass_float32_centred(x, a, b, mean, sums[t]);
DEFINE_KERNEL(onepass_float32, float, double, float, 16, AS_IS, 1e150)

#define onepass_float64_READ_PART(a, b, t) onepass_float64_read(x, a, b, &parts[t]);
#define onepass_float64_CENTRED_PART(a, b, t) onepass_float64_centred(x, a, b, mean, sums[t]);
DEFINE_KERNEL(onepass_float64, double, double, double, 16, AS_IS, 1e150)

#define onepass_bfloat16_READ_PART(a, b, t) onepass_bfloat16_read(x, a, b, &parts[t]);
#define onepass_bfloat16_CENTRED_PART(a, b, t) onepass_bfloat16_centred(x, a, b, mean, sums[t]);
DEFINE_KERNEL(onepass_bfloat16, uint16_t, double, float, 16, from_bf16, 1e150)

#ifdef __FLT16_MAX__ /* the compiler has _Float16 */
/* gcc makes (double)(float)h one call of __extendhfdf2 per value (software, ~7x slower): a
   block at a time is converted to float (vcvtph2ps, exact) and read as float32 is, the blocks
   where the float16 read would have them, so the sums are the same. */
static void half_read(const _Float16 *x, int64_t i, int64_t end, part_t *total) {
    float values[BLOCK];
    part_t acc = {0, 0, 0, 0, 0, 0, 0};
    for (; i < end; i += BLOCK) {
        int64_t count = end - i < BLOCK ? end - i : BLOCK;
        for (int64_t k = 0; k < count; k++) values[k] = (float)x[i + k];
        part_t block;
        onepass_float32_read(values, 0, count, &block);
        merge(&acc, &block);
    }
    *total = acc;
}

static void half_centred(const _Float16 *x, int64_t i, int64_t end, double mean, double *sums) {
    float values[BLOCK];
    for (; i < end; i += BLOCK) {
        int64_t count = end - i < BLOCK ? end - i : BLOCK;
        for (int64_t k = 0; k < count; k++) values[k] = (float)x[i + k];
        onepass_float32_centred(values, 0, count, mean, sums);
    }
}

#define onepass_float16_READ_PART(a, b, t) half_read(x, a, b, &parts[t]);
#define onepass_float16_CENTRED_PART(a, b, t) half_centred(x, a, b, mean, sums[t]);
DEFINE_KERNEL(onepass_float16, _Float16, double, float, 16, AS_FLOAT, 1e150)
int onepass_has_float16(void) { return 1; }
#else
int onepass_has_float16(void) { return 0; }
#endif

/* onepass_float32_difference(a, b, n, exact, out): the row onepass_float32 writes for a - b, the
   update Δw of a parameter (a) since its copy (b), without torch making Δw: the subtraction is
   IEEE float32's, correctly rounded as torch's is, so the values and the row are the same to the
   bit. Small tensors subtract on the stack; larger ones into memory allocated for the call.
   Returns 0, writing nothing, when that memory cannot be had (the caller subtracts with torch). */
int onepass_float32_difference(const float *a, const float *b, int64_t n, int exact, double *out) {
    float on_stack[BLOCK];
    float *d = n <= BLOCK ? on_stack : (float *)malloc((size_t)n * sizeof(float));
    if (d == NULL) return 0;
    for (int64_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    onepass_float32(d, n, exact, out);
    if (d != on_stack) free(d);
    return 1;
}
