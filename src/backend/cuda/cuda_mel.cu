/* cuda_mel.cu — Whisper's log-mel front end on CUDA (backend.h log_mel),
 * computing the numbers of src/audio/mel.c (the CPU reference, kissfft) with
 * cuFFT. Per chunk of up to KN_CUDA_MEL_CHUNK frames, on the backend's stream:
 *   k_mel_frames   windowed frames [chunk, 400]: the signal zero-padded or
 *                  truncated to n_frames*160 samples, reflect-padded by 200
 *                  at both ends (mel.c's padded_sample), times the periodic
 *                  Hann window (computed on the host in double, as mel.c);
 *   cuFFT R2C      batched 400-point real FFTs -> [chunk, 201] complex;
 *   k_mel_project  power, mel projection summed in double over each filter's
 *                  nonzero bins (ascending, as mel.c), log10 with the 1e-10
 *                  floor into out, and the running global max (an atomic on
 *                  an order-preserving integer encoding of the float);
 * then k_mel_finish clamps out at max - 8 and maps x to (x + 4) / 4.
 * Memory is bounded by the chunk (~27 MB of scratch for any length). The plan
 * and scratch are made per call and freed before it returns (the call ends
 * with a stream synchronization), so nothing outlives a call. Must not include
 * audio/ headers (layering): the STFT constants are restated here. */
#include <cufft.h>
#include <math.h>

#include "backend/cuda/cuda_internal.h"

#define MEL_N_FFT 400
#define MEL_HOP 160
#define MEL_N_BINS (MEL_N_FFT / 2 + 1)
#define KN_CUDA_MEL_CHUNK 8192 /* frames per batched FFT */
#define MEL_TILE 32            /* frames per k_mel_project block */
#define MEL_PROJECT_THREADS 256

/* Float -> unsigned with the same order (for atomicMax); 0 is below every
 * encoded float, so a zeroed word means "no value yet". */
__device__ __forceinline__ unsigned mel_order_key(float v) {
    unsigned b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float mel_order_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

/* Sample i of the padded signal (mel.c padded_sample): pcm zero-padded or
 * truncated to len samples, reflected about both ends without repeating the
 * edge sample. */
__device__ __forceinline__ float mel_padded_sample(const float *pcm, int64_t n_samples, int64_t len, int64_t i) {
    if (i < 0) i = -i;
    if (i >= len) i = 2 * (len - 1) - i;
    return i < n_samples ? pcm[i] : 0.0f;
}

/* ranges [n_mels][2]: each filter's nonzero bins [lo, hi) ({0, 0} if none);
 * gmax_key = 0. One block. */
static __global__ void k_mel_prep(const float *filters, int n_mels, int *ranges, unsigned *gmax_key) {
    for (int j = threadIdx.x; j < n_mels; j += blockDim.x) {
        const float *f = filters + (size_t)j * MEL_N_BINS;
        int lo = MEL_N_BINS, hi = 0;
        for (int b = 0; b < MEL_N_BINS; b++)
            if (f[b] != 0.0f) {
                if (b < lo) lo = b;
                hi = b + 1;
            }
        ranges[2 * j] = lo < hi ? lo : 0;
        ranges[2 * j + 1] = lo < hi ? hi : 0;
    }
    if (threadIdx.x == 0) *gmax_key = 0;
}

/* frames [batch, 400]: row r < nt is frame t0 + r; rows nt..batch-1 (the
 * last, partial chunk) are zero. One block per row. */
static __global__ void k_mel_frames(const float *pcm, int64_t n_samples, int64_t len, int64_t t0, int nt,
                                    const float *window, float *frames) {
    const int r = blockIdx.x;
    float *fr = frames + (size_t)r * MEL_N_FFT;
    if (r >= nt) {
        for (int i = threadIdx.x; i < MEL_N_FFT; i += blockDim.x) fr[i] = 0.0f;
        return;
    }
    const int64_t start = (t0 + r) * MEL_HOP - MEL_N_FFT / 2;
    for (int i = threadIdx.x; i < MEL_N_FFT; i += blockDim.x)
        fr[i] = __fmul_rn(mel_padded_sample(pcm, n_samples, len, start + i), window[i]);
}

/* Frames [t0 + tile*MEL_TILE, + MEL_TILE) of the chunk's spectra spec
 * [nt, 201]: power |X|^2 (rounded as mel.c: no fused multiply-add), then
 * out[j, t] = log10(max((float)sum_b filters[j, b] * power[b], 1e-10)) with
 * the sum in double over filter j's nonzero bins; the block's max goes into
 * *gmax_key. */
static __global__ void __launch_bounds__(MEL_PROJECT_THREADS)
    k_mel_project(const float2 *spec, int64_t t0, int nt, int64_t n_frames, const float *filters, const int *ranges,
                  int n_mels, float *out, unsigned *gmax_key) {
    __shared__ float pw[MEL_TILE][MEL_N_BINS]; /* 201 is odd: column reads across frames are conflict-free */
    __shared__ float red[MEL_PROJECT_THREADS / 32];
    const int f0 = blockIdx.x * MEL_TILE;
    const int n = nt - f0 < MEL_TILE ? nt - f0 : MEL_TILE;
    for (int i = threadIdx.x; i < n * MEL_N_BINS; i += blockDim.x) {
        const int f = i / MEL_N_BINS, b = i % MEL_N_BINS;
        const float2 z = spec[(size_t)(f0 + f) * MEL_N_BINS + b];
        pw[f][b] = __fadd_rn(__fmul_rn(z.x, z.x), __fmul_rn(z.y, z.y));
    }
    __syncthreads();
    float vmax = -INFINITY;
    /* consecutive threads take consecutive frames of one filter: coalesced
     * writes of out's rows, one filter (range, weights) per warp */
    for (int i = threadIdx.x; i < n_mels * MEL_TILE; i += blockDim.x) {
        const int j = i / MEL_TILE, f = i % MEL_TILE;
        if (f >= n) continue;
        const float *w = filters + (size_t)j * MEL_N_BINS;
        const int lo = ranges[2 * j], hi = ranges[2 * j + 1];
        double acc = 0;
        for (int b = lo; b < hi; b++) acc += (double)w[b] * (double)pw[f][b]; /* exact products */
        const float mel = (float)acc;
        const float v = log10f(mel > 1e-10f ? mel : 1e-10f);
        out[(size_t)j * (size_t)n_frames + (size_t)(t0 + f0 + f)] = v;
        vmax = fmaxf(vmax, v);
    }
    for (int o = 16; o > 0; o >>= 1) vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = vmax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = red[0];
        for (int k = 1; k < MEL_PROJECT_THREADS / 32; k++) m = fmaxf(m, red[k]);
        if (m > -INFINITY) atomicMax(gmax_key, mel_order_key(m));
    }
}

/* out[i] = (max(out[i], gmax - 8) + 4) / 4 over all n elements. */
static __global__ void k_mel_finish(float *out, int64_t n, const unsigned *gmax_key) {
    const float floor_v = mel_order_value(*gmax_key) - 8.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = out[i] > floor_v ? out[i] : floor_v;
        out[i] = __fdiv_rn(__fadd_rn(v, 4.0f), 4.0f);
    }
}

static const char *cufft_result_name(cufftResult r) {
    switch (r) {
    case CUFFT_SUCCESS: return "CUFFT_SUCCESS";
    case CUFFT_INVALID_PLAN: return "CUFFT_INVALID_PLAN";
    case CUFFT_ALLOC_FAILED: return "CUFFT_ALLOC_FAILED (out of device memory)";
    case CUFFT_INVALID_VALUE: return "CUFFT_INVALID_VALUE";
    case CUFFT_INTERNAL_ERROR: return "CUFFT_INTERNAL_ERROR";
    case CUFFT_EXEC_FAILED: return "CUFFT_EXEC_FAILED";
    case CUFFT_SETUP_FAILED: return "CUFFT_SETUP_FAILED";
    case CUFFT_INVALID_SIZE: return "CUFFT_INVALID_SIZE";
    case CUFFT_NO_WORKSPACE: return "CUFFT_NO_WORKSPACE";
    case CUFFT_NOT_SUPPORTED: return "CUFFT_NOT_SUPPORTED";
    default: return "cuFFT error";
    }
}

static size_t mel_align(size_t n) { return (n + 255) & ~(size_t)255; }

extern "C" kn_code kn_cuda_log_mel(kn_backend *be, const float *pcm, int64_t n_samples, int64_t n_frames,
                                   const float *filters, int n_mels, float *out, kn_error *err) {
    if (n_frames < 2) return kn_fail(err, KN_ERR_INVALID_ARG, "cuda log_mel: n_frames %lld < 2", (long long)n_frames);
    if (n_mels < 1 || n_mels > 512) return kn_fail(err, KN_ERR_INVALID_ARG, "cuda log_mel: n_mels %d out of range", n_mels);
    if (n_samples < 0 || (n_samples > 0 && !pcm)) return kn_fail(err, KN_ERR_INVALID_ARG, "cuda log_mel: no samples");
    if (n_frames > ((int64_t)1 << 40)) /* far beyond any audio length limit; keeps t*160 and n_mels*n_frames in range */
        return kn_fail(err, KN_ERR_INVALID_ARG, "cuda log_mel: n_frames %lld too large", (long long)n_frames);
    cudaStream_t s = kn_cuda_stream(be);
    const int64_t len = n_frames * MEL_HOP;
    const int batch = (int)(n_frames < KN_CUDA_MEL_CHUNK ? n_frames : KN_CUDA_MEL_CHUNK);

    /* torch.hann_window(400) (periodic), in double then rounded, as mel.c */
    float window[MEL_N_FFT];
    const double pi = 3.14159265358979323846; /* M_PI */
    for (int i = 0; i < MEL_N_FFT; i++) window[i] = (float)(0.5 - 0.5 * cos(2.0 * pi * i / MEL_N_FFT));

    /* scratch: frames [batch, 400] f32 | spectra [batch, 201] complex | window [400] | ranges [n_mels, 2] | max key */
    const size_t off_spec = mel_align(sizeof(float) * (size_t)batch * MEL_N_FFT);
    const size_t off_win = off_spec + mel_align(sizeof(float2) * (size_t)batch * MEL_N_BINS);
    const size_t off_rng = off_win + mel_align(sizeof(float) * MEL_N_FFT);
    const size_t off_max = off_rng + mel_align(sizeof(int) * 2 * (size_t)n_mels);
    const size_t bytes = off_max + 256;
    char *scratch = NULL;
    cudaError_t ce = cudaMalloc((void **)&scratch, bytes);
    if (ce != cudaSuccess) {
        cudaGetLastError(); /* clear the allocation error */
        return kn_fail(err, KN_ERR_NOMEM, "cuda log_mel: cannot allocate %.1f MB of scratch: %s", bytes / 1e6,
                       cudaGetErrorString(ce));
    }
    float *frames = (float *)scratch;
    float2 *spec = (float2 *)(scratch + off_spec);
    float *d_window = (float *)(scratch + off_win);
    int *ranges = (int *)(scratch + off_rng);
    unsigned *gmax_key = (unsigned *)(scratch + off_max);

    cufftHandle plan;
    int nfft = MEL_N_FFT;
    cufftResult fr = cufftPlanMany(&plan, 1, &nfft, NULL, 1, MEL_N_FFT, NULL, 1, MEL_N_BINS, CUFFT_R2C, batch);
    if (fr != CUFFT_SUCCESS) {
        cudaFree(scratch);
        return kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: cufftPlanMany (400-point R2C, batch %d): %s", batch,
                       cufft_result_name(fr));
    }
    kn_code rc = KN_OK;
    fr = cufftSetStream(plan, s);
    if (fr != CUFFT_SUCCESS)
        rc = kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: cufftSetStream: %s", cufft_result_name(fr));
    /* pageable source: the call returns once the window is staged */
    if (!rc && (ce = cudaMemcpyAsync(d_window, window, sizeof window, cudaMemcpyHostToDevice, s)) != cudaSuccess)
        rc = kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: window upload: %s", cudaGetErrorString(ce));
    if (!rc) k_mel_prep<<<1, 256, 0, s>>>(filters, n_mels, ranges, gmax_key);
    for (int64_t t0 = 0; !rc && t0 < n_frames; t0 += batch) {
        const int nt = (int)(n_frames - t0 < batch ? n_frames - t0 : batch);
        k_mel_frames<<<batch, 128, 0, s>>>(pcm, n_samples, len, t0, nt, d_window, frames);
        fr = cufftExecR2C(plan, (cufftReal *)frames, (cufftComplex *)spec);
        if (fr != CUFFT_SUCCESS) {
            rc = kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: cufftExecR2C: %s", cufft_result_name(fr));
            break;
        }
        k_mel_project<<<(nt + MEL_TILE - 1) / MEL_TILE, MEL_PROJECT_THREADS, 0, s>>>(
            spec, t0, nt, n_frames, filters, ranges, n_mels, out, gmax_key);
        if ((ce = cudaGetLastError()) != cudaSuccess)
            rc = kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: kernel launch: %s", cudaGetErrorString(ce));
    }
    if (!rc) {
        const int64_t total = (int64_t)n_mels * n_frames;
        const int64_t want = (total + 255) / 256;
        const int blocks = (int)(want < 65536 ? want : 65536);
        k_mel_finish<<<blocks, 256, 0, s>>>(out, total, gmax_key);
        if ((ce = cudaGetLastError()) != cudaSuccess)
            rc = kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: kernel launch: %s", cudaGetErrorString(ce));
    }
    /* the plan and scratch may only go once the stream is past them */
    ce = cudaStreamSynchronize(s);
    if (!rc && ce != cudaSuccess) rc = kn_fail(err, KN_ERR_BACKEND, "cuda log_mel: %s", cudaGetErrorString(ce));
    cufftDestroy(plan);
    cudaFree(scratch);
    return rc;
}
