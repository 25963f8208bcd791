// Device functions kept out of line (__noinline__) so `.func` and `call` appear in the PTX.
extern "C" __device__ __noinline__ float load_scaled(const float* p, int i, float s) { return p[i] * s; }
extern "C" __device__ __noinline__ void store_val(float* p, int i, float v) { p[i] = v; }
extern "C" __device__ __noinline__ float* pick(float* a, float* b, int c) { return c ? a : b; }
extern "C" __device__ __noinline__ void bump(float* p, int i) { p[i] += 1.0f; }

extern "C" __global__ void call_load_store(const float* x, float* y, int n, float s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store_val(y, i, load_scaled(x, i, s));
}

extern "C" __global__ void call_returns_pointer(float* a, float* b, int flag, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) *pick(a, b, flag) = 0.0f;
}

extern "C" __global__ void call_twice(float* a, const float* b, float* c, int n) {
    // two calls of one function with different pointers: only a and c are bumped
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { bump(a, i); bump(c, i + (int)b[i]); }
}

__device__ __noinline__ float tree_sum(const float* p, int lo, int hi) {
    if (hi - lo <= 4) { float s = 0.0f; for (int i = lo; i < hi; ++i) s += p[i]; return s; }
    int mid = (lo + hi) / 2;
    return tree_sum(p, lo, mid) + tree_sum(p, mid, hi);
}

extern "C" __global__ void recursive_sum(const float* x, float* out, int n) {
    if (threadIdx.x == 0) out[blockIdx.x] = tree_sum(x, 0, n);
}
