// Elementwise kernels: plain reads, writes, in-place updates, vectorised 16-byte loads.
#include <cuda_fp16.h>

extern "C" __global__ void vec_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void saxpy_inplace(float alpha, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = alpha * x[i] + y[i];
}

extern "C" __global__ void scale_inplace(float* x, float s, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] *= s;
}

extern "C" __global__ void relu_restrict(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}

extern "C" __global__ void copy_vec4(const float4* __restrict__ src, float4* __restrict__ dst, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) dst[i] = src[i];
}

extern "C" __global__ void fill(float* out, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}

extern "C" __global__ void unused_params(float* never, const float* also_never, int n, float* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = (float)n;
}

extern "C" __global__ void cast_f32_f16(const float* x, __half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i]);
}

extern "C" __global__ void residual_add_inplace(float* x, const float* r, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += r[i];
}

extern "C" __global__ void pointer_walk(const float* in, float* out, int n) {
    // pointer induction variables: the loop advances both pointers
    const float* p = in + blockIdx.x * n;
    float* q = out + blockIdx.x * n;
    for (int i = 0; i < n; ++i) *q++ = *p++ * 2.0f;
}

extern "C" __global__ void select_target(float* a, float* b, int use_a, int n) {
    float* p = use_a ? a : b;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 1.0f;
}

template <typename T>
__global__ void axpby_t(const T* x, const T* y, T* z, T alpha, T beta, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = alpha * x[i] + beta * y[i];
}
template __global__ void axpby_t<double>(const double*, const double*, double*, double, double, int);

extern "C" __global__ void half2_bias_gelu(__half2* x, const __half2* __restrict__ bias, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) {
        float2 v = __half22float2(__hadd2(x[i], bias[i]));
        v.x = 0.5f * v.x * (1.0f + tanhf(0.79788456f * v.x));
        v.y = 0.5f * v.y * (1.0f + tanhf(0.79788456f * v.y));
        x[i] = __float22half2_rn(v);
    }
}
