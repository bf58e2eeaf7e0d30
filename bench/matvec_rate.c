/* matvec_rate.c — the F term of docs/ENGINE.md §8: sustained FLOP/s of libwaste's own expert
 * matvec kernels (wk_select + wk_matvec_rows from native/src, compiled in, not copied) on
 * resident f32/bf16/int8/int4/mxfp4 experts, at 1..n threads splitting rows as the engine's pool does.
 *
 * Usage: matvec_rate FMT GROUP HIDDEN MOE_INTER N_EXPERTS THREADS SECONDS [ACT]
 * ACT is f32 (the default: f32 activations, the reference path) or q8 (activations quantized
 * per 32 by the set's quantize_q8 once per matvec, as the engine's WASTE_ACT_Q8 does; the
 * quantization is inside the timed loop). Prints one JSON object. Each thread owns a fixed row range of every matrix (no barrier
 * per matvec), so this is the kernel's rate, an upper bound for the engine's fork-join. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef struct {
    const wk_kernels *k;
    wm_mat *mats;          /* 3 per expert: gate [I,H], up [I,H], down [H,I] */
    uint32_t n_mats;
    const float *x_h, *x_i;
    int q8;
    int8_t *xq;            /* this thread's quantized activations [max(H, I)] */
    float *xd;             /* and their block scales */
    uint32_t t, n_threads;
    double seconds;
    uint64_t flops;
    float sink;
    float *y;              /* [max(H, I)] */
    double cpu;            /* this thread's CPU time over the run */
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pthread_barrier_t start_line;

/* Normal (never subnormal) weights: int8 q in [-127,127] and int4 nibbles with an fp16
 * scale of 2^-7, mxfp4 nibbles with an E8M0 scale of 2^-7, bf16/f32 values in [0.5, 1.5). */
static void fill(uint8_t *data, int32_t fmt, uint32_t group, uint32_t rows, uint32_t cols, uint64_t rb) {
    for (uint32_t r = 0; r < rows; r++) {
        uint8_t *row = data + (uint64_t)r * rb;
        if (fmt == WF_INT4) {
            for (uint32_t g = 0; g < cols / group; g++, row += 2 + group / 2) {
                row[0] = 0x00; row[1] = 0x20;
                for (uint32_t j = 0; j < group / 2; j++) row[2 + j] = (uint8_t)rand();
            }
        } else if (fmt == WF_MXFP4) {
            for (uint32_t g = 0; g < cols / 32; g++, row += 17) {
                row[0] = 120;
                for (uint32_t j = 0; j < 16; j++) row[1 + j] = (uint8_t)rand();
            }
        } else if (fmt == WF_INT8) {
            for (uint32_t g = 0; g < cols / group; g++, row += 2 + group) {
                row[0] = 0x00; row[1] = 0x20;
                for (uint32_t j = 0; j < group; j++) row[2 + j] = (uint8_t)(int8_t)(rand() % 255 - 127);
            }
        } else {
            for (uint32_t c = 0; c < cols; c++) {
                float v = 0.5f + (float)rand() / (float)RAND_MAX;
                uint32_t u; memcpy(&u, &v, 4);
                if (fmt == WF_F32) memcpy(row + 4 * c, &u, 4);
                else { uint16_t b = (uint16_t)(u >> 16); memcpy(row + 2 * c, &b, 2); }
            }
        }
    }
}

static void *run(void *arg) {
    job *j = arg;
    pthread_barrier_wait(&start_line);
    double t0 = now_s(), c0 = cpu_s();
    float sink = 0.0f;
    uint64_t flops = 0;
    do {
        for (uint32_t m = 0; m < j->n_mats; m++) {
            const wm_mat *w = &j->mats[m];
            const float *x = w->cols == j->mats[0].cols ? j->x_h : j->x_i;
            uint32_t b = (uint32_t)((uint64_t)w->rows * j->t / j->n_threads);
            uint32_t e = (uint32_t)((uint64_t)w->rows * (j->t + 1) / j->n_threads);
            if (j->q8) j->k->quantize_q8(x, w->cols, j->xq, j->xd);
            wk_matvec_rows(j->k, w, b, e, x, j->q8 ? j->xq : NULL, j->xd, j->y);
            sink += j->y[b];
            flops += 2ull * (e - b) * w->cols;
        }
    } while (now_s() - t0 < j->seconds);
    j->seconds = now_s() - t0;
    j->cpu = cpu_s() - c0;
    j->flops = flops;
    j->sink = sink;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: %s FMT GROUP HIDDEN MOE_INTER N_EXPERTS THREADS SECONDS [f32|q8]\n", argv[0]);
        return 2;
    }
    int32_t fmt = wf_parse(argv[1]);
    uint32_t group = (uint32_t)atoi(argv[2]), H = (uint32_t)atoi(argv[3]), I = (uint32_t)atoi(argv[4]);
    uint32_t n_exp = (uint32_t)atoi(argv[5]), T = (uint32_t)atoi(argv[6]);
    double seconds = atof(argv[7]);
    int q8 = argc == 9 && strcmp(argv[8], "q8") == 0;
    if (argc == 9 && !q8 && strcmp(argv[8], "f32") != 0) { fprintf(stderr, "matvec_rate: ACT is f32 or q8\n"); return 2; }
    if (q8 && !wk_q8_format(fmt)) { fprintf(stderr, "matvec_rate: q8 activations need int8, int4 or mxfp4\n"); return 2; }
    if (fmt < 0 || fmt > WF_MXFP4 || !H || !I || !n_exp || !T || T > 256 || seconds <= 0) {
        fprintf(stderr, "matvec_rate: bad arguments\n");
        return 2;
    }
    uint32_t n_mats = 3 * n_exp;
    wm_mat *mats = calloc(n_mats, sizeof *mats);
    uint64_t total_bytes = 0;
    srand(1);
    for (uint32_t m = 0; m < n_mats; m++) {
        uint32_t rows = m % 3 == 2 ? H : I, cols = m % 3 == 2 ? I : H;
        uint64_t rb = wf_row_bytes(fmt, group, cols);
        if (!rb) { fprintf(stderr, "matvec_rate: %s g%u cannot hold %u columns\n", argv[1], group, cols); return 2; }
        uint8_t *data = wu_aligned_alloc(4096, rb * rows);
        if (!data) { fprintf(stderr, "matvec_rate: out of memory\n"); return 1; }
        fill(data, fmt, group, rows, cols, rb);
        mats[m] = (wm_mat){fmt, group, rows, cols, rb, data};
        total_bytes += rb * rows;
    }
    float *x_h = malloc(H * sizeof(float)), *x_i = malloc(I * sizeof(float));
    for (uint32_t i = 0; i < H; i++) x_h[i] = (float)(i % 7) * 0.1f;
    for (uint32_t i = 0; i < I; i++) x_i[i] = (float)(i % 5) * 0.1f;
    const wk_kernels *k = wk_select(WASTE_KERNELS_AUTO, NULL);
    pthread_t th[256];
    job jobs[256];
    pthread_barrier_init(&start_line, NULL, T);
    for (uint32_t t = 0; t < T; t++) {
        uint32_t wmax = H > I ? H : I;
        jobs[t] = (job){k, mats, n_mats, x_h, x_i, q8, malloc(wmax), malloc((wmax / 32 + 1) * sizeof(float)), t, T,
                        seconds, 0, 0.0f, malloc(wmax * sizeof(float)), 0.0};
        if (!jobs[t].xq || !jobs[t].xd || !jobs[t].y) { fprintf(stderr, "matvec_rate: out of memory\n"); return 1; }
        if (t) pthread_create(&th[t], NULL, run, &jobs[t]);
    }
    run(&jobs[0]);
    uint64_t flops = jobs[0].flops;
    double wall = jobs[0].seconds, cpu = jobs[0].cpu;
    for (uint32_t t = 1; t < T; t++) {
        pthread_join(th[t], NULL);
        flops += jobs[t].flops;
        cpu += jobs[t].cpu;
        if (jobs[t].seconds > wall) wall = jobs[t].seconds;
    }
    double bytes_per_flop = (double)total_bytes / (6.0 * (double)H * (double)I * n_exp);
    printf("{\"kernel\": \"%s\", \"activations\": \"%s\", \"format\": \"%s\", \"group\": %u, \"hidden\": %u, \"moe_inter\": %u, "
           "\"experts_resident\": %u, \"resident_bytes\": %llu, \"threads\": %u, \"seconds\": %.3f, "
           "\"flops_per_s\": %.6g, \"weight_bytes_per_s\": %.6g, \"flops_per_cpu_s\": %.6g, \"cpu_share\": %.3f, "
           "\"sink\": %g}\n",
           k->name, q8 ? "q8" : "f32", argv[1], group, H, I, n_exp, (unsigned long long)total_bytes, T, wall,
           (double)flops / wall, (double)flops / wall * bytes_per_flop, (double)flops / cpu * T,
           cpu / (wall * T), (double)jobs[0].sink);
    return 0;
}
