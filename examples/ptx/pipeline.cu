// A three-kernel pipeline for the launch-log example: producer, in-place update, consumer.
extern "C" __global__ void produce(const float* x, const float* w, float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = x[i] * w[i % 256];
}

extern "C" __global__ void update_inplace(float* a, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += x[i];
}

extern "C" __global__ void consume(const float* a, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(a[i], 0.0f);
}
