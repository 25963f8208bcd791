// Shared-memory tiled GEMM, cp.async pipelines, TMA-style bulk copies (sm_90 path only).
#include <cuda_pipeline.h>
#define TILE 16

extern "C" __global__ void sgemm_tiled(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        As[threadIdx.y][threadIdx.x] = (r < M && t * TILE + threadIdx.x < K) ? A[r * K + t * TILE + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (c < N && t * TILE + threadIdx.y < K) ? B[(t * TILE + threadIdx.y) * N + c] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (r < M && c < N) C[r * N + c] = acc;
}

extern "C" __global__ void sgemm_accumulate(const float* A, const float* B, float* C, int M, int N, int K,
                                            float beta) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K / TILE; ++t) {
        As[threadIdx.y][threadIdx.x] = A[r * K + t * TILE + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(t * TILE + threadIdx.y) * N + c];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[r * N + c] = beta * C[r * N + c] + acc;
}

extern "C" __global__ void cp_async_copy(const float4* src, float4* dst, int n4) {
    __shared__ float4 buf[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) __pipeline_memcpy_async(&buf[threadIdx.x], &src[i], sizeof(float4));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if (i < n4) dst[i] = buf[threadIdx.x];
}

extern "C" __global__ void cp_async_tile_sum(const float* __restrict__ x, float* __restrict__ rowsum, int cols) {
    __shared__ float tile[2][128];
    const float* row = x + (size_t)blockIdx.x * cols;
    float acc = 0.0f;
    int stage = 0;
    if (threadIdx.x < 128) __pipeline_memcpy_async(&tile[0][threadIdx.x], &row[threadIdx.x], 4);
    __pipeline_commit();
    for (int c0 = 0; c0 < cols; c0 += 128) {
        if (c0 + 128 < cols && threadIdx.x < 128)
            __pipeline_memcpy_async(&tile[stage ^ 1][threadIdx.x], &row[c0 + 128 + threadIdx.x], 4);
        __pipeline_commit();
        __pipeline_wait_prior(1);
        __syncthreads();
        if (threadIdx.x < 128) acc += tile[stage][threadIdx.x];
        __syncthreads();
        stage ^= 1;
    }
    atomicAdd(&rowsum[blockIdx.x], acc);
}

// Bulk (TMA-engine) copies: global -> shared -> global, sm_90 only; a plain copy elsewhere.
extern "C" __global__ void bulk_copy(const float* src, float* dst, int chunk) {
    __shared__ __align__(128) float buf[1024];
    __shared__ __align__(8) unsigned long long bar;
#if __CUDA_ARCH__ >= 900
    const float* s = src + (size_t)blockIdx.x * 1024;
    float* d = dst + (size_t)blockIdx.x * 1024;
    unsigned sbuf = (unsigned)__cvta_generic_to_shared(buf);
    unsigned sbar = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sbar));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 4096;" :: "r"(sbar));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 4096, [%2];"
                     :: "r"(sbuf), "l"(s), "r"(sbar) : "memory");
        asm volatile("{\n\t.reg .pred P1;\nWAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n"
                     "\t@!P1 bra WAIT;\n}" :: "r"(sbar));
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 4096;" :: "l"(d), "r"(sbuf) : "memory");
        asm volatile("cp.async.bulk.commit_group;");
        asm volatile("cp.async.bulk.wait_group 0;");
    }
#else
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) dst[(size_t)blockIdx.x * 1024 + i] = src[(size_t)blockIdx.x * 1024 + i];
#endif
}

// A 128-byte tensor-map descriptor passed by value (__grid_constant__): TMA loads read through it.
struct __align__(64) TensorMap { unsigned long long opaque[16]; };

extern "C" __global__ void tma_load_rows(const __grid_constant__ TensorMap tmap, float* out) {
    __shared__ __align__(128) float tile[32 * 32];
    __shared__ __align__(8) unsigned long long bar;
#if __CUDA_ARCH__ >= 900
    unsigned sbuf = (unsigned)__cvta_generic_to_shared(tile);
    unsigned sbar = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sbar));
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(sbuf), "l"(&tmap), "r"(0), "r"((int)blockIdx.x * 32), "r"(sbar) : "memory");
        asm volatile("{\n\t.reg .pred P1;\nWAIT2:\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n"
                     "\t@!P1 bra WAIT2;\n}" :: "r"(sbar));
    }
    __syncthreads();
    out[blockIdx.x * 1024 + threadIdx.x] = tile[threadIdx.x];
#else
    out[blockIdx.x * 1024 + threadIdx.x] = 0.0f;
#endif
}

extern "C" __global__ void inline_ptx_mix(const float* x, float* acc, float* y, int n) {
    // ldu, prefetch and red written as inline PTX so the parser sees them verbatim
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v;
    asm volatile("prefetch.global.L2 [%0];" :: "l"(x + i));
    asm volatile("ldu.global.f32 %0, [%1];" : "=f"(v) : "l"(x + i));
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(acc), "f"(v) : "memory");
    asm volatile("st.global.wb.f32 [%0], %1;" :: "l"(y + i), "f"(v) : "memory");
}
