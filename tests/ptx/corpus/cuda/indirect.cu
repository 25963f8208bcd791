// Gather/scatter, paged KV through a block table, pointer arrays, structs passed by value.
extern "C" __global__ void gather_rows(const float* src, const int* idx, float* dst, int cols) {
    const float* s = src + (size_t)idx[blockIdx.x] * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[(size_t)blockIdx.x * cols + c] = s[c];
}

extern "C" __global__ void scatter_add(const float* src, const int* idx, float* dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&dst[idx[i]], src[i]);
}

extern "C" __global__ void scatter_rows_i64(const float* src, const long long* idx, float* dst, int cols) {
    float* d = dst + idx[blockIdx.x] * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = src[(size_t)blockIdx.x * cols + c];
}

extern "C" __global__ void embedding(const long long* ids, const float* table, float* out, int dim) {
    long long id = ids[blockIdx.x];
    for (int c = threadIdx.x; c < dim; c += blockDim.x) out[(size_t)blockIdx.x * dim + c] = table[id * dim + c];
}

// vLLM-style paged attention decode: one block per (sequence, head), KV read through a block table.
extern "C" __global__ void paged_attention_decode(const float* q, const float* k_cache, const float* v_cache,
                                                  const int* block_tables, const int* context_lens, float* out,
                                                  int block_size, int head_dim, int max_blocks, float scale) {
    int seq = blockIdx.x, head = blockIdx.y, heads = gridDim.y, d = threadIdx.x;
    int len = context_lens[seq];
    const float* qv = q + ((size_t)seq * heads + head) * head_dim;
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int t = 0; t < len; ++t) {
        int blk = block_tables[seq * max_blocks + t / block_size];
        size_t off = (((size_t)blk * block_size + t % block_size) * heads + head) * head_dim;
        float s = 0.0f;
        for (int j = 0; j < head_dim; ++j) s += qv[j] * k_cache[off + j];
        s *= scale;
        float mn = fmaxf(m, s), a = __expf(m - mn), b = __expf(s - mn);
        l = l * a + b;
        acc = acc * a + b * v_cache[off + d];
        m = mn;
    }
    out[((size_t)seq * heads + head) * head_dim + d] = acc / l;
}

extern "C" __global__ void paged_kv_append(const float* k, const float* v, float* k_cache, float* v_cache,
                                           const int* slot_mapping, int width) {
    int slot = slot_mapping[blockIdx.x];
    if (slot < 0) return;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        k_cache[(size_t)slot * width + c] = k[(size_t)blockIdx.x * width + c];
        v_cache[(size_t)slot * width + c] = v[(size_t)blockIdx.x * width + c];
    }
}

// Pointer arrays: the addresses themselves are loaded from memory (truly indirect).
extern "C" __global__ void ptr_array_gather(const float* const* ptrs, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = ptrs[blockIdx.y][i];
}

extern "C" __global__ void batched_axpy(float** ys, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ys[blockIdx.y][i] += a * x[i];
}

extern "C" __global__ void paged_attention_ptr_table(const float* q, const float* const* block_ptrs,
                                                     float* out, int block_size, int head_dim) {
    // KV blocks addressed by pointers stored in a table (the reference system's indirect case)
    int d = threadIdx.x;
    float acc = 0.0f;
    for (int b = 0; b < 4; ++b) {
        const float* blk = block_ptrs[blockIdx.x * 4 + b];
        for (int t = 0; t < block_size; ++t) acc += q[blockIdx.x * head_dim + d] * blk[t * head_dim + d];
    }
    out[blockIdx.x * head_dim + d] = acc;
}

struct Args { const float* in; float* out; int n; };
extern "C" __global__ void struct_args(Args a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < a.n) a.out[i] = a.in[i] + 1.0f;
}

struct PtrPack { float* p[4]; int n; };
extern "C" __global__ void struct_dynamic_index(PtrPack pk, const float* src) {
    // pk.p indexed by a runtime value: the struct is read through its parameter address
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < pk.n) pk.p[blockIdx.y & 3][i] = src[i];
}
